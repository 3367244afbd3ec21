"""The end-to-end residual stage: what the kernel sum and the overhead still miss, learned from
out-of-fold kernel predictions.

A per-kernel regressor's errors do not cancel over a model: a model repeats its stages'
geometries, and a regressor that is biased over a range of configurations is biased in every
model that has them; the overhead is fitted on *measured* kernel sums but applied to predicted
ones. Both are functions of what the model's predicted kernels are, which is what this stage
reads: each model's kernel count per type and its predicted kernel latency per type.

Training needs predictions of the kind the stage will see, so each training model's kernels
are predicted by regressors that never saw that model (`training.out_of_fold_kernels`: folds
grouped by model, each type's searched hyperparameters). A small LightGBM model then fits the
residual end-to-end latency - (predicted kernel sum + overhead) by least absolute error
weighted 1 / end-to-end latency, i.e. the end-to-end MAPE itself. The overhead stays: it keeps
growing with the kernel count where trees would stop (zoo models of 100+ kernels against
synthetic ones of 20-40), the trees add a bounded correction.

`auto` keeps the stage only where a 5-fold cross-validation over the training models (with
their out-of-fold kernel predictions) lowers the end-to-end MAPE by more than `KEEP_GAIN`, and
only with `MIN_MODELS` models. Kept on h100-cuda-synthetic (CV 3.34% -> 2.38%; protocol (a),
five splits: 3.33% -> 2.46% on average, the largest inputs the grouped convolutions' and the
reductions' predicted time), not on host-cpu-synthetic (4.65% -> 4.52%);
docs/results/cuda-campaigns/README.md, session 14.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.model_selection import KFold

MIN_MODELS = 100      # fewer training models: no stage (trees of 10+ models a leaf, 5 folds)
KEEP_GAIN = 0.05      # `auto` keeps the stage when it lowers the CV end-to-end MAPE by 5%+
FOLDS = 5
PARAMS = {"objective": "l1", "n_estimators": 300, "learning_rate": 0.03, "num_leaves": 7,
          "min_child_samples": 10}
RESIDUAL_MODES = ("auto", "off")
ARTIFACT = "residual.lgb.txt"


class ResidualStage:
    """LightGBM model of the end-to-end residual from each model's kernel counts and predicted
    kernel latency per type (`types`, in column order: counts, then sums)."""

    family: ClassVar[str] = "residual"

    def __init__(self, types: Sequence[str], booster: Any, metrics: Mapping[str, Any]):
        self.types = tuple(types)
        self.booster = booster
        self.metrics = dict(metrics)

    @classmethod
    def fit(cls, counts: np.ndarray, sums: np.ndarray, residual: np.ndarray, e2e: np.ndarray,
            types: Sequence[str], seed: int = 0, metrics: Mapping[str, Any] | None = None
            ) -> "ResidualStage":
        return cls(types, _train(np.hstack([counts, sums]), residual, e2e, seed), metrics or {})

    def predict(self, counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """The correction (ms) of models with `counts` and predicted `sums` per type, each an
        array (models, len(types))."""
        X = np.hstack([counts, sums]).astype(np.float64)
        return np.asarray(self.booster.predict(X, num_threads=1), dtype=np.float64)

    # -- artifact: LightGBM's text model (parsed, never executed) and a JSON-able dict --------
    def export(self) -> tuple[bytes, dict[str, Any]]:
        return (self.booster.model_to_string().encode(),
                {"types": list(self.types), "params": dict(PARAMS), "metrics": self.metrics})

    @classmethod
    def restore(cls, data: bytes, params: Mapping[str, Any]) -> "ResidualStage":
        import lightgbm as lgb

        booster = lgb.Booster(model_str=data.decode("utf-8"))
        types = [str(t) for t in params["types"]]
        if booster.num_feature() != 2 * len(types):
            raise ValueError("the residual stage does not match its declared kernel types")
        return cls(types, booster, dict(params.get("metrics", {})))


def _train(X: np.ndarray, residual: np.ndarray, e2e: np.ndarray, seed: int) -> Any:
    import lightgbm as lgb

    p = PARAMS
    params = {"objective": p["objective"], "learning_rate": p["learning_rate"],
              "num_leaves": p["num_leaves"], "min_data_in_leaf": p["min_child_samples"],
              "seed": seed, "num_threads": 1, "deterministic": True, "force_col_wise": True,
              "verbose": -1}
    data = lgb.Dataset(X, label=residual, weight=1.0 / e2e, params={"verbose": -1})
    return lgb.train(params, data, num_boost_round=p["n_estimators"])


def skipped(mode: str, n_models: int) -> dict[str, str] | None:
    """Why no stage is trained (mode "off", too few models), or None to try it."""
    if mode not in RESIDUAL_MODES:
        raise ValueError(f"unknown residual mode {mode!r}; choose one of {RESIDUAL_MODES}")
    if mode == "off":
        return {"residual": "off"}
    return {"residual": f"fewer than {MIN_MODELS} models"} if n_models < MIN_MODELS else None


def fit_residual(counts: pd.DataFrame, sums: pd.DataFrame, base_ms: np.ndarray,
                 e2e_ms: np.ndarray, seed: int = 0
                 ) -> tuple[ResidualStage | None, dict[str, Any]]:
    """The stage fitted on training models (rows: models; `counts` and `sums` one column a
    kernel type, sums from out-of-fold kernel predictions; `base_ms` their predicted kernel sum
    plus overhead), or None where it does not cross-validate better; and what the choice
    measured."""
    e = np.asarray(e2e_ms, dtype=np.float64)
    C, S = counts.to_numpy(np.float64), sums.to_numpy(np.float64)
    base = np.asarray(base_ms, dtype=np.float64)
    X, r = np.hstack([C, S]), e - base
    corrected = base.copy()
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(X):
        corrected[test] += _train(X[train], r[train], e[train], seed).predict(
            X[test], num_threads=1)
    before = float(np.mean(np.abs(base - e) / e))
    after = float(np.mean(np.abs(corrected - e) / e))
    info = {"residual_cv_mape_without": before, "residual_cv_mape_with": after}
    if after >= before * (1.0 - KEEP_GAIN):
        return None, {**info, "residual": "not kept: CV gain under 5%"}
    stage = ResidualStage.fit(C, S, r, e, list(counts.columns), seed, info)
    return stage, {**info, "residual": "kept"}


def per_type(kernel_types: Sequence[Sequence[str]], values: np.ndarray | None,
             types: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel list's count and summed `values` (flat over the lists' kernels in order; None:
    the counts again) per kernel type of `types`, arrays (lists, len(types)); other types are
    left out."""
    index = {t: i for i, t in enumerate(types)}
    lengths = np.fromiter((len(ks) for ks in kernel_types), dtype=np.intp,
                          count=len(kernel_types))
    owner = np.repeat(np.arange(len(lengths)), lengths)
    col = np.fromiter((index.get(t, -1) for ks in kernel_types for t in ks), dtype=np.intp,
                      count=int(lengths.sum()))
    return by_type(owner, col, values, len(lengths), len(types))


def by_type(owner: np.ndarray, col: np.ndarray, values: np.ndarray | None, n_rows: int,
            n_types: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts and sums of `values` (None: the counts again) per (owner, type column), entries
    with column -1 left out."""
    keep = col >= 0
    flat = owner[keep] * n_types + col[keep]
    size = n_rows * n_types
    counts = np.bincount(flat, minlength=size).astype(np.float64).reshape(n_rows, n_types)
    if values is None:
        return counts, counts
    sums = np.bincount(flat, np.asarray(values, np.float64)[keep], minlength=size)
    return counts, sums.reshape(n_rows, n_types)
