"""Few-shot adaptation: carry a predictor trained on one device to another from a few models.

A source predictor has learned how latency varies with a kernel's configuration; a new device
mostly changes how fast each kind of kernel runs (another core, two threads, int8 arithmetic).
So the adapted predictor keeps the source's regressors and learns, from 10-30 models measured
on the new device, what differs (HELP and LitePred adapt from as few; nn-Meter retrains):

- `scale`: one factor per kernel type, the percentage-optimal ratio between the new device's
  kernel latencies and the source's predictions (it minimises Eq. 1's squared percentage error
  in closed form), shrunk towards the factor of all kernels together when a type has few rows;
- `residual`: the factor, then a small, heavily regularised GBDT per kernel type on what is
  left (the ratio measured / scaled prediction, from the type's own features): the trees are
  fine-tuned on the residuals instead of retrained;
- `stacked`: the linear family (non-negative cost terms, predictors/lasso_terms) refitted on
  the new device's rows of a type, with the scaled source prediction as one more cost column:
  the source's shape where it carries, the type's own FLOPs / bytes / cache terms where the
  new device departs from it (a faster memory system moves element-wise and FC kernels, not
  convolutions); kept for a type where its cross-validated kernel error beats the factor's,
  and never under STACKED_MIN_ROWS rows; then, with RESIDUAL_MIN_ROWS rows, residual trees on
  what the linear refit leaves, kept where they cross-validate better;
- `global`: one factor for every kernel type (the one of all kernels together);
- `auto`: the simplest of these whose end-to-end MAPE in a cross-validation over the few
  models (grouped by model, so no model is in its own test fold) is within 5% of the best.

Kernel types the source never measured are trained from the new device's rows alone (the
fallback Lasso on FLOPs and bytes when too few). The overhead (end to end minus the kernel sum)
is either the source's, its milliseconds times the common factor (`scaled`), or re-fitted on
the few models (`refit`, constant under 10 models, as in training); `auto` cross-validates both
and keeps `scaled` unless `refit` is better by more than AUTO_TOLERANCE: an overhead learned
from 10-30 small models did not carry to zoo models of 100+ kernels (t1 -> t2: 9.3% against
the source's scaled, docs/fewshot.md), which folds of those same small models cannot show.
The result is an ordinary LatencyModel: its adapted types hold an `AdaptedRegressor` that saves
and loads like any family. A source type with the launch-pattern stage (predictors/launch.py)
keeps its classifier: the adapted regressor embeds both artifacts.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd

from latpred.errors import PredictorError
from latpred.predictors.base import LatencyRegressor
from latpred.predictors.training import FEATURE_PREFIX, TypeFit, fit_fallback, fit_type

METHODS = ("auto", "global", "scale", "residual", "stacked")
OVERHEADS = ("auto", "scaled", "refit")
# From the simplest to the most flexible: `auto` keeps the simplest method whose cross-validated
# error is within AUTO_TOLERANCE (relative) of the best, as a few models cannot tell apart
# methods closer than that, and the simpler one carried better to real models (docs/fewshot.md).
SIMPLEST_FIRST = ("global", "scale", "residual", "stacked")
# The source's overhead scaled fits nothing on the few models; a re-fitted one fits one to three
# coefficients on them.
OVERHEAD_SIMPLEST_FIRST = ("scaled", "refit")
AUTO_TOLERANCE = 0.05
# Bytes per float element under each precision, and the features counted in bytes: the source
# regressor sees a new device's kernels as it saw its own (an int8 convolution moves a quarter
# of the bytes of the same fp32 one; to an fp32-trained tree that is another, thinner layer).
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
BYTE_FEATURES = ("bytes_read", "bytes_written", "param_bytes", "fused_bytes_read")
# Rows at which a type's own factor gets half the weight (the rest: all kernels' factor): a
# type seen in one or two kernels leans on the common factor, one seen in 20 barely does.
SHRINK_ROWS = 5
# Fewest rows of a type for a residual GBDT; below it the factor alone is used.
RESIDUAL_MIN_ROWS = 40
# `residual`'s trees: small and heavily regularised (at least 10 rows a leaf, or a tenth).
RESIDUAL_TREES = dict(n_estimators=60, learning_rate=0.05, num_leaves=4, reg_lambda=1.0)
# Fewest rows of a type for the stacked linear refit (its alpha is searched by grouped folds).
STACKED_MIN_ROWS = 20
# The stacked model's extra column: the scaled source prediction, in ms.
SOURCE_COLUMN = "source_ms"
# Residual trees on the stacked fit (types with RESIDUAL_MIN_ROWS rows, kept where they
# cross-validate better): larger than `residual`'s, as they start from a fit that has already
# taken the linear trend.
STACKED_TREES = dict(n_estimators=150, learning_rate=0.05, num_leaves=7, min_child_samples=10,
                     reg_lambda=1.0)


class AdaptedRegressor(LatencyRegressor):
    """A source regressor times a factor, optionally times a residual GBDT's ratio."""

    artifact_suffix: ClassVar[str] = ".adapted.json"
    family: ClassVar[str] = "adapted"

    def __init__(self, base: LatencyRegressor | None = None, scale: float = 1.0,
                 residual: LatencyRegressor | None = None,
                 feature_scale: Sequence[float] | None = None):
        self.base = base
        self.scale = scale
        self.residual = residual
        self.feature_scale = None if feature_scale is None else tuple(feature_scale)
        if base is not None:
            self.n_features_in_ = base.n_features_in_

    def fit(self, X: Any, y: Any) -> "AdaptedRegressor":  # pragma: no cover - built by adapt
        raise NotImplementedError("AdaptedRegressor is built by latpred.predictors.adapt.")

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        seen = X if self.feature_scale is None else X * np.asarray(self.feature_scale)
        p = self.base.predict(seen) * self.scale
        return p if self.residual is None else p * self.residual.predict(X)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        doc = {"scale": float(self.scale), "base": _pack(self.base),
               "feature_scale": None if self.feature_scale is None else list(self.feature_scale),
               "residual": _pack(self.residual) if self.residual is not None else None}
        return json.dumps(doc).encode(), {}

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "AdaptedRegressor":
        doc = json.loads(data.decode("utf-8"))
        residual = _unpack(doc["residual"]) if doc.get("residual") else None
        return cls(_unpack(doc["base"]), float(doc["scale"]), residual, doc.get("feature_scale"))


class StackedRegressor(LatencyRegressor):
    """A linear-family regressor over a type's features plus `base`'s prediction (the source
    regressor times its factor) as one more column."""

    artifact_suffix: ClassVar[str] = ".stacked.json"
    family: ClassVar[str] = "stacked"

    def __init__(self, base: AdaptedRegressor | None = None,
                 head: LatencyRegressor | None = None,
                 residual: LatencyRegressor | None = None):
        self.base, self.head, self.residual = base, head, residual
        if base is not None:
            self.n_features_in_ = base.n_features_in_

    def fit(self, X: Any, y: Any) -> "StackedRegressor":  # pragma: no cover - built by adapt
        raise NotImplementedError("StackedRegressor is built by latpred.predictors.adapt.")

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        p = self.head.predict(np.column_stack([X, self.base.predict(X)]))
        return p if self.residual is None else p * self.residual.predict(X)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        data, _ = self.base.export()
        doc = {"base": json.loads(data.decode("utf-8")), "head": _pack(self.head),
               "residual": _pack(self.residual) if self.residual is not None else None}
        return json.dumps(doc).encode(), {}

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "StackedRegressor":
        doc = json.loads(data.decode("utf-8"))
        base = AdaptedRegressor.restore(json.dumps(doc["base"]).encode(), {})
        residual = _unpack(doc["residual"]) if doc.get("residual") else None
        return cls(base, _unpack(doc["head"]), residual)


def _pack(reg: Any) -> dict[str, Any]:
    from latpred.predictors.launch import LaunchStaged

    if isinstance(reg, LaunchStaged):   # a source type with the launch-pattern stage
        return {"family": LaunchStaged.family, "regressor": _pack(reg.regressor),
                "classifier": _pack(reg.classifier)}
    data, params = reg.export()
    return {"family": type(reg).family, "params": params,
            "sha256": hashlib.sha256(data).hexdigest(),
            "artifact": base64.b64encode(data).decode("ascii")}


def _unpack(entry: dict[str, Any]) -> LatencyRegressor:
    from latpred.predictors.launch import LaunchClassifier, LaunchStaged
    from latpred.predictors.search import FAMILIES

    if entry["family"] == LaunchStaged.family:
        c = entry["classifier"]
        data = base64.b64decode(c["artifact"])
        if hashlib.sha256(data).hexdigest() != c["sha256"]:
            raise ValueError("an embedded artifact does not match its sha256")
        return LaunchStaged(_unpack(entry["regressor"]),
                            LaunchClassifier.restore(data, dict(c["params"])))
    data = base64.b64decode(entry["artifact"])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError("an embedded artifact does not match its sha256")
    if entry["family"] not in FAMILIES:
        raise ValueError(f"unknown embedded family {entry['family']!r}")
    return FAMILIES[entry["family"]].restore(data, dict(entry["params"]))


# -- adaptation ------------------------------------------------------------------------------------
def adapt_dataset(source, dataset, target: str | None = None, method: str = "auto",
                  seed: int = 0, overhead: str = "auto"):
    """`source` (a LatencyModel or its directory) adapted to the models measured in `dataset`
    (a Dataset or its directory) for `target`, by default the dataset's only target."""
    from pathlib import Path

    from latpred.dataset import Dataset
    from latpred.predictors.model import LatencyModel
    from latpred.predictors.training import load_tables

    if not isinstance(source, LatencyModel):
        source = LatencyModel.load(source)
    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)
    if target is None:
        targets = ds.targets()
        if len(targets) != 1:
            raise PredictorError(f"The dataset at {ds.root} measures {len(targets)} targets "
                                 f"({', '.join(targets) or 'none'}); name one with --target.")
        target = targets[0]
    kernels, models = load_tables(ds, target)
    info = {"dataset": str(Path(ds.root).resolve())}
    return adapt(source, kernels, models, target, method, seed, info, overhead)


def adapt(source, kernels: pd.DataFrame, models: pd.DataFrame, target: str,
          method: str = "auto", seed: int = 0, info: dict[str, Any] | None = None,
          overhead: str = "auto"):
    """The LatencyModel `source` adapted to `target` from the few models' tables (kernel rows
    and model rows as `predictors.training` builds them); `overhead` one of OVERHEADS."""
    from latpred.predictors.model import LatencyModel

    if method not in METHODS:
        raise PredictorError(f"Unknown adaptation method {method!r}; choose one of "
                             f"{', '.join(METHODS)}.")
    if overhead not in OVERHEADS:
        raise PredictorError(f"Unknown overhead {overhead!r}; choose one of "
                             f"{', '.join(OVERHEADS)}.")
    if kernels.empty or models.empty:
        raise PredictorError(f"No model of target {target} has its end-to-end and kernel "
                             "latencies measured; adaptation needs a few such models.")
    methods = SIMPLEST_FIRST if method == "auto" else (method,)
    overheads = OVERHEAD_SIMPLEST_FIRST if overhead == "auto" else (overhead,)
    (chosen, over), cv, over_cv = _choose(source, kernels, models, target, methods, overheads,
                                          seed)
    types, common = adapt_types(source, kernels, target, chosen, seed)
    ids = sorted(set(kernels["model_id"]) | set(models["model_id"]))
    training = {**(info or {}), "adapted_from": source.target, "source_family": source.family,
                "source_training": dict(source.training), "method": chosen,
                "method_cv_mape": cv, "overhead": over, "overhead_cv_mape": over_cv,
                "common_factor": common, "n_models": len(ids),
                "n_kernel_rows": int(len(kernels)), "seed": seed, "train_models": ids}
    fallback = fit_fallback(kernels) or source.fallback
    return LatencyModel(target, source.family, types,
                        _overhead(over, source.overhead, common, models, seed), fallback,
                        training, source.analytical_features)


def scaled_overhead(overhead, factor: float):
    """The source's overhead with its milliseconds (intercept, per kernel) times `factor`; its
    share of the kernel sum stays, as the sum is already the new device's."""
    return dataclasses.replace(overhead, intercept=overhead.intercept * factor,
                               per_kernel=overhead.per_kernel * factor)


def _overhead(kind: str, source_overhead, factor: float, models: pd.DataFrame, seed: int):
    from latpred.predictors.overhead import fit_overhead

    if kind == "scaled":
        return scaled_overhead(source_overhead, factor)
    return fit_overhead(models["n_kernels"].to_numpy(), models["kernel_sum_ms"].to_numpy(),
                        models["latency_ms"].to_numpy(), "auto", seed)


def adapt_types(source, kernels: pd.DataFrame, target: str, method: str, seed: int
                ) -> tuple[dict[str, TypeFit], float]:
    """Per kernel type of `kernels`: the source's regressor rescaled (and residual-tuned), or a
    regressor of the new device's rows where the source has none (or lacks its features); and
    the common factor (of every kernel the source can predict)."""
    ratio = _bytes_ratio(source.target, target)
    base_pred = _source_predictions(source, kernels, ratio)
    y = kernels["latency_ms"].to_numpy(np.float64)
    known = np.isfinite(base_pred)
    overall = _factor(base_pred[known], y[known]) if known.any() else 1.0
    fits: dict[str, TypeFit] = {}
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        rows = kernels.iloc[idx]
        if not np.isfinite(base_pred[idx]).all():
            fits[ktype] = _fresh_fit(ktype, rows, seed)
            continue
        p, t = base_pred[idx], y[idx]
        # `global`: every type takes the common factor (the type's own is kept for the record)
        w = 0.0 if method == "global" else len(idx) / (len(idx) + SHRINK_ROWS)
        own = _factor(p, t)
        scale = w * own + (1 - w) * overall
        src = source.types[ktype]
        residual = None
        X = pd.DataFrame(rows[[FEATURE_PREFIX + f for f in src.features]].to_numpy(np.float64),
                         columns=list(src.features))
        if method == "residual" and len(idx) >= RESIDUAL_MIN_ROWS:
            residual = _ratio_trees(X, t / (p * scale), seed, **RESIDUAL_TREES,
                                    min_child_samples=max(10, len(idx) // 10))
        reg = AdaptedRegressor(src.regressor, scale, residual,
                               _feature_scale(src.features, ratio))
        stacked_cv, trees_cv = None, None
        if method == "stacked" and len(idx) >= STACKED_MIN_ROWS:
            # `reg` is the factor alone here (no residual): its prediction is p * scale
            reg, stacked_cv = _stacked_if_better(ktype, rows, X, reg, p * scale, t, seed)
            if isinstance(reg, StackedRegressor) and len(idx) >= RESIDUAL_MIN_ROWS:
                reg, trees_cv = _trees_if_better(rows["model_id"].to_numpy(), X, reg, t, seed)
        pred = reg.predict(X.to_numpy())
        fits[ktype] = TypeFit(ktype, src.features, reg, {
            "n_rows": int(len(idx)), "scale": float(scale), "type_factor": own,
            "common_factor": overall, "residual": residual is not None,
            "stacked": isinstance(reg, StackedRegressor), "stacked_cv_mape": stacked_cv,
            "stacked_trees": isinstance(reg, StackedRegressor) and reg.residual is not None,
            "stacked_trees_cv_mape": trees_cv,
            "source_rows": src.metrics.get("n_rows"),
            "train_mape": float(np.mean(np.abs(pred - t) / t))})
    return fits, overall


def _bytes_ratio(source_target: str, target: str) -> float:
    """Bytes per float element on the source's precision over the new target's (1 when equal)."""
    from latpred.target import parse_target

    src, new = parse_target(source_target).precision, parse_target(target).precision
    return ELEMENT_BYTES.get(src, 4) / ELEMENT_BYTES.get(new, 4)


def _feature_scale(features: Sequence[str], ratio: float) -> tuple[float, ...] | None:
    """Per-feature multipliers that show the source a kernel in its own precision's bytes."""
    if ratio == 1.0:
        return None
    return tuple(ratio if f in BYTE_FEATURES else 1.0 for f in features)


def _source_predictions(source, kernels: pd.DataFrame, ratio: float = 1.0) -> np.ndarray:
    """The source's prediction for every kernel row (bytes shown in the source's precision);
    NaN where the source has no regressor for the type or the rows lack one of its features."""
    out = np.full(len(kernels), np.nan)
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        fit = source.types.get(ktype)
        if fit is None:
            continue
        cols = [FEATURE_PREFIX + f for f in fit.features]
        if any(c not in kernels for c in cols):
            continue
        X = kernels.iloc[idx][cols].to_numpy(np.float64)
        scale = _feature_scale(fit.features, ratio)
        if np.isfinite(X).all():
            out[idx] = fit.regressor.predict(X if scale is None else X * np.asarray(scale))
    return out


def _factor(p: np.ndarray, y: np.ndarray) -> float:
    """argmin_s sum(y * ((s p - y) / y)^2) = sum(p) / sum(p^2 / y): the squared percentage
    error weighted by each kernel's time. Unweighted, the many few-microsecond kernels set the
    factor, while the long convolutions set the end-to-end latency (two threads speed those up
    most): on host t1 -> t2 the unweighted factor left a +7% end-to-end bias."""
    return float(np.sum(p) / np.sum(p * p / y))


def _ratio_trees(X: pd.DataFrame, ratio: np.ndarray, seed: int, **settings):
    """A GBDT on ratio = measured / prediction, fitted on Eq. 1 (weights 1/r^2), so the
    product's percentage error is what it minimises (as `LinearBaseMixin` argues)."""
    from latpred.predictors.gbdt import PercentGBDT

    return PercentGBDT(**settings, random_state=seed).fit(X, ratio)


def _stacked_if_better(ktype: str, rows: pd.DataFrame, X: pd.DataFrame, base: AdaptedRegressor,
                       p: np.ndarray, y: np.ndarray, seed: int
                       ) -> tuple[LatencyRegressor, float | None]:
    """The linear family's searched fit on the type's features plus `base`'s prediction `p`,
    kept where its grouped cross-validated kernel MAPE beats `base`'s own kernel MAPE on the
    rows (a factor fitted on hundreds of rows barely overfits); else `base`. A few dozen grouped
    convolutions from 10 models are too few for the terms (int8: 44% against the factor's
    28%), while 1,100 int8 convolutions take them from 33% to 15%."""
    from latpred.predictors.search import load_search

    extra = rows.assign(**{FEATURE_PREFIX + SOURCE_COLUMN: p})
    head = fit_type(ktype, extra, load_search("lasso", "latpred"), seed,
                    features=(*X.columns, SOURCE_COLUMN))
    cv = head.metrics.get("cv_mape")   # None: too few rows for the search's folds
    if cv is not None and cv < float(np.mean(np.abs(p - y) / y)):
        return StackedRegressor(base, head.regressor), float(cv)
    return base, cv


def _trees_if_better(groups: np.ndarray, X: pd.DataFrame, reg: StackedRegressor,
                     y: np.ndarray, seed: int) -> tuple[StackedRegressor, float | None]:
    """`reg` with residual trees on measured / stacked prediction (STACKED_TREES), kept where
    their 3-fold CV grouped by model (`groups`) beats the stacked fit's own kernel MAPE on the
    rows. The linear terms miss interactions a tree finds (int8 convolutions from 30 models:
    conv2d 15.1% -> 8.5% per kernel on held-out models)."""
    from sklearn.model_selection import GroupKFold

    if len(set(groups)) < 3:
        return reg, None
    p = reg.predict(X.to_numpy())
    errors = []
    for a, b in GroupKFold(3).split(X, groups=groups):
        trees = _ratio_trees(X.iloc[a], y[a] / p[a], seed, **STACKED_TREES)
        errors.append(np.mean(np.abs(p[b] * trees.predict(X.iloc[b]) - y[b]) / y[b]))
    cv = float(np.mean(errors))
    if cv >= float(np.mean(np.abs(p - y) / y)):
        return reg, cv
    return StackedRegressor(reg.base, reg.head, _ratio_trees(X, y / p, seed, **STACKED_TREES)), cv


def _fresh_fit(ktype: str, rows: pd.DataFrame, seed: int) -> TypeFit:
    """A type the source cannot predict: a Lasso on the new device's own rows (its alpha
    searched where there are rows enough), or the cost-feature fallback when the rows lack the
    type's feature schema."""
    from latpred.errors import DatasetError
    from latpred.predictors.search import load_search

    try:
        return fit_type(ktype, rows, load_search("lasso", "latpred"), seed)
    except DatasetError:  # no usable schema: the shared cost features still are
        fb = fit_fallback(rows)
        if fb is None:
            raise PredictorError(f"Kernel type {ktype} is new on this device and its rows carry "
                                 "no cost features to learn it from.") from None
        return TypeFit(ktype, fb.features, fb.regressor, fb.metrics)


def _choose(source, kernels: pd.DataFrame, models: pd.DataFrame, target: str,
            methods: Sequence[str], overheads: Sequence[str], seed: int
            ) -> tuple[tuple[str, str], dict[str, float], dict[str, float]]:
    """(method, overhead) by end-to-end MAPE over grouped folds of the few models: the simplest
    overhead whose best method is within AUTO_TOLERANCE of the best of all, then the simplest
    method within AUTO_TOLERANCE of the best with that overhead; with the cross-validated
    errors per method (with the chosen overhead) and per overhead (with its best method)."""
    from sklearn.model_selection import KFold

    ids = np.array(sorted(models["model_id"]))
    if len(methods) == len(overheads) == 1 or len(ids) < 4:
        return (methods[0], overheads[0]), {}, {}
    errors: dict[tuple[str, str], list[float]] = {(m, o): [] for m in methods for o in overheads}
    for train, test in KFold(min(5, len(ids)), shuffle=True, random_state=seed).split(ids):
        tr, te = set(ids[train]), set(ids[test])
        k_tr, k_te = kernels[kernels["model_id"].isin(tr)], kernels[kernels["model_id"].isin(te)]
        m_tr, m_te = models[models["model_id"].isin(tr)], models[models["model_id"].isin(te)]
        fallback = fit_fallback(k_tr) or source.fallback
        for method in methods:
            types, common = adapt_types(source, k_tr, target, method, seed)
            for over in overheads:
                oh = _overhead(over, source.overhead, common, m_tr, seed)
                errors[method, over].append(_e2e_mape(types, oh, fallback, k_te, m_te))
    cv = {key: float(np.mean(e)) for key, e in errors.items()}
    best = min(cv.values())
    over_cv = {o: min(cv[m, o] for m in methods) for o in overheads}
    over = next(o for o in overheads if over_cv[o] <= best * (1 + AUTO_TOLERANCE))
    per_method = {m: cv[m, over] for m in methods}
    best_m = min(per_method.values())
    method = next(m for m in methods if per_method[m] <= best_m * (1 + AUTO_TOLERANCE))
    return (method, over), (per_method if len(methods) > 1 else {}), \
        (over_cv if len(overheads) > 1 else {})


def _e2e_mape(types: dict[str, TypeFit], overhead, fallback: TypeFit, kernels: pd.DataFrame,
              models: pd.DataFrame) -> float:
    """End-to-end MAPE of adapted `types` plus `overhead` on measured kernel rows (their
    features, not re-deduced); a type the training folds lacked goes to `fallback`."""
    per_kernel = np.zeros(len(kernels))
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        fit = types.get(ktype) or fallback
        X = kernels.iloc[idx][[FEATURE_PREFIX + f for f in fit.features]].to_numpy(np.float64)
        per_kernel[idx] = fit.regressor.predict(X)
    sums = pd.Series(per_kernel, index=kernels.index).groupby(kernels["model_id"]).sum()
    m = models.set_index("model_id")
    s = sums.reindex(m.index).to_numpy()
    pred = s + overhead.predict(m["n_kernels"].to_numpy(), s)
    y = m["latency_ms"].to_numpy()
    return float(np.mean(np.abs(pred - y) / y))
