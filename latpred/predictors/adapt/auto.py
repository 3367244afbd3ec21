"""`auto`: the adaptation chosen by cross-validation over the few models (folds by model, so no
model is in its own test fold), and the blend of the adapted types with types trained on the
new device's rows alone (docs/fewshot.md).

One pass of folds gives every kernel row an out-of-fold prediction from each method and from
each scratch partner (blend.PARTNERS) trained on the other folds' rows, and every model each
fold's overheads; from those: the method and overhead by end-to-end MAPE, then per partner and
kernel type the weight of the adapted prediction against the partner's by the type's per-model
kernel errors (the few models' hundreds of kernel labels, not their 10-30 end-to-end ones,
judge each type), and the partner by its blend's end-to-end MAPE."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from latpred.predictors.adapt.blend import PARTNERS, scratch_types, type_weights
from latpred.predictors.adapt.types import adapt_types
from latpred.predictors.adapt.wrappers import mixed
from latpred.predictors.training import FEATURE_PREFIX, TypeFit, fit_fallback

# From the simplest to the most flexible: `auto` keeps the simplest method whose cross-validated
# error is within AUTO_TOLERANCE (relative) of the best, as a few models cannot tell apart
# methods closer than that, and the simpler one carried better to real models (docs/fewshot.md).
SIMPLEST_FIRST = ("global", "scale", "residual", "stacked")
# The source's overhead scaled fits nothing on the few models; `pinned` fits two coefficients on
# them, keeping the source's cost per kernel; `refit` fits one to three (`pinned_overhead` says
# why `auto` no longer weighs `refit`).
OVERHEAD_SIMPLEST_FIRST = ("scaled", "pinned")
OVERHEAD_KINDS = ("scaled", "pinned", "refit")
PINNED_MIN_MODELS = 4      # two coefficients need more than two models
AUTO_TOLERANCE = 0.05
FOLDS = 5


def scaled_overhead(overhead, factor: float):
    """The source's overhead with its milliseconds (intercept, per kernel) times `factor`; its
    share of the kernel sum stays, as the sum is already the new device's."""
    return dataclasses.replace(overhead, intercept=overhead.intercept * factor,
                               per_kernel=overhead.per_kernel * factor,
                               per_type=tuple((t, c * factor) for t, c in overhead.per_type))


def fit_adapted_overhead(kind: str, source_overhead, factor: float, models: pd.DataFrame,
                         seed: int):
    """`scaled`: the source's overhead times `factor`; `pinned`: its cost per kernel times
    `factor`, the intercept and the share of the kernel sum re-fitted on `models`; `refit`:
    one fitted on `models`."""
    from latpred.predictors.overhead import fit_overhead

    if kind == "scaled":
        return scaled_overhead(source_overhead, factor)
    n, s, e = (models[c].to_numpy(np.float64) for c in ("n_kernels", "kernel_sum_ms",
                                                         "latency_ms"))
    if kind == "pinned":
        return pinned_overhead(source_overhead, factor, n, s, e)
    return fit_overhead(n, s, e, "auto", seed)


def pinned_overhead(source_overhead, factor: float, n: np.ndarray, s: np.ndarray,
                    e: np.ndarray):
    """The overhead a + b * n_kernels + c * kernel_sum_ms with b the source's cost per kernel
    times `factor` and a, c fitted on the few models (`n`, `s`, `e`: their kernel counts,
    measured kernel sums and end-to-end latencies) by least squares weighted 1 / e^2, as
    `overhead.fit_overhead` does; under PINNED_MIN_MODELS models only a is fitted, c is the
    source's.

    Why b is kept: the few synthetic models span 15-56 kernels and their kernel count grows
    with their latency, so a re-fit's b swings between draws (-0.3 to 8.3 us a kernel on the
    third VM's t2 pool, the source's 1.3) and the zoo's 20-341 kernels multiply the swing;
    the intercept and the share of the kernel sum are what the few models do show. Overhead
    alone (measured kernel sums plus each overhead) on the ten zoo pairs, 10 / 30 models:
    pinned 1.7 / 1.8% MAPE, scaled 2.1 / 2.1%, refit 7.6 / 3.1% (docs/fewshot.md,
    session 27). A typed source's costs per type are not kept: b is its mean cost a kernel."""
    from sklearn.linear_model import LinearRegression

    from latpred.predictors.overhead import OverheadModel

    b = source_overhead.per_kernel * factor
    rest = e - s - b * n
    if len(e) < PINNED_MIN_MODELS:
        c = source_overhead.per_kernel_ms
        a = float(np.average(rest - c * s, weights=1.0 / e**2))
    else:
        reg = LinearRegression().fit(s[:, None], rest, sample_weight=1.0 / e**2)
        a, c = float(reg.intercept_), float(reg.coef_[0])
    return OverheadModel("pinned", a, b, c, n_models=len(e))


@dataclasses.dataclass
class OutOfFold:
    """The folds' predictions: per kernel row (of `kernels`, the few models' rows) each
    method's and each scratch partner's, from the fold that held its model out; per model (of
    `models`) its fold and the kernel rows' model positions."""

    kernels: pd.DataFrame
    models: pd.DataFrame
    row_model: np.ndarray                  # per kernel row: its model's position in `models`
    fold: np.ndarray                       # per model: its fold
    adapted: dict[str, np.ndarray]         # per method: per kernel row
    # per method: per kernel row, the smallest prediction of its fold's adapted types on the
    # fold's training rows of its type (below it the scratch share shrinks, wrappers.mixed)
    low: dict[str, np.ndarray]
    scratch: dict[str, np.ndarray]         # per partner: per kernel row (empty: none)
    overheads: dict[tuple[str, str], list]  # per (method, overhead kind): per fold

    def e2e_mape(self, method: str, over: str, kernel_ms: np.ndarray | None = None) -> float:
        """End-to-end MAPE of per-kernel predictions (by default `method`'s) summed per model
        plus the fold's overhead (`over` fitted with `method`)."""
        kernel_ms = self.adapted[method] if kernel_ms is None else kernel_ms
        s = np.bincount(self.row_model, weights=kernel_ms, minlength=len(self.models))
        n = self.models["n_kernels"].to_numpy()
        counts = self.model_type_counts()
        pred = np.empty(len(s))
        for f, oh in enumerate(self.overheads[method, over]):
            at = self.fold == f
            pred[at] = s[at] + oh.predict(n[at], s[at], {t: c[at] for t, c in counts.items()})
        y = self.models["latency_ms"].to_numpy()
        return float(np.mean(np.abs(pred - y) / y))

    def model_type_counts(self) -> dict[str, np.ndarray]:
        """Per kernel type, each model's count of its kernel rows (a typed overhead's input)."""
        types = self.kernels["kernel_type"].to_numpy()
        return {t: np.bincount(self.row_model[types == t], minlength=len(self.models)
                               ).astype(np.float64) for t in np.unique(types)}

    def blend_weights(self, method: str, partner: str = PARTNERS[0]
                      ) -> tuple[dict[str, float], dict[str, dict]]:
        """Per kernel type, the weight of `method`'s prediction against `partner`'s
        (blend.type_weights), with the time-weighted kernel errors per weight."""
        return type_weights(self.kernels, self.row_model, self.adapted[method],
                            self.scratch[partner], self.low[method], AUTO_TOLERANCE)

    def blended(self, method: str, weights: dict[str, float], partner: str = PARTNERS[0]
                ) -> np.ndarray:
        """Per kernel row: the adapted and scratch predictions mixed by the type's weight."""
        w = self.kernels["kernel_type"].map(weights).to_numpy(np.float64)
        return mixed(self.adapted[method], self.scratch[partner], w, self.low[method])

    def choose_blend(self, method: str, over: str
                     ) -> tuple[str, dict[str, float], float, dict[str, float]]:
        """The partner, its type weights and its blend's out-of-fold end-to-end MAPE: of
        PARTNERS, the first whose blend is within AUTO_TOLERANCE of the best partner's; with
        every partner's blend MAPE."""
        found = {p: self.blend_weights(method, p)[0] for p in PARTNERS if p in self.scratch}
        cv = {p: self.e2e_mape(method, over, self.blended(method, w, p))
              for p, w in found.items()}
        best = min(cv.values())
        partner = next(p for p in found if cv[p] <= best * (1 + AUTO_TOLERANCE))
        return partner, found[partner], cv[partner], cv


def cross_validate(source, kernels: pd.DataFrame, models: pd.DataFrame, target: str,
                   methods: Sequence[str], overheads: Sequence[str], seed: int,
                   scratch: bool = True) -> OutOfFold | None:
    """The out-of-fold predictions of FOLDS folds over the models (None under 4 models); the
    scratch partners' only with `scratch`."""
    from sklearn.model_selection import KFold

    models = models.sort_values("model_id").reset_index(drop=True)
    ids = models["model_id"].to_numpy()
    if len(ids) < 4:
        return None
    kernels = kernels[kernels["model_id"].isin(set(ids))].reset_index(drop=True)
    pos = {m: i for i, m in enumerate(ids)}
    row_model = kernels["model_id"].map(pos).to_numpy()
    fold = np.empty(len(ids), dtype=int)
    adapted = {m: np.full(len(kernels), np.nan) for m in methods}
    low = {m: np.zeros(len(kernels)) for m in methods}
    from_scratch = {p: np.full(len(kernels), np.nan) for p in (PARTNERS if scratch else ())}
    fold_overheads: dict[tuple[str, str], list] = {(m, o): [] for m in methods
                                                   for o in overheads}
    splits = KFold(min(FOLDS, len(ids)), shuffle=True, random_state=seed).split(ids)
    for f, (train, test) in enumerate(splits):
        fold[test] = f
        tr, te = np.isin(row_model, train), np.isin(row_model, test)
        k_tr, k_te, m_tr = kernels[tr], kernels[te], models.iloc[train]
        fallback = fit_fallback(k_tr) or source.fallback
        for method in methods:
            types, common = adapt_types(source, k_tr, target, method, seed)
            adapted[method][te] = predict_rows(types, fallback, k_te)
            low[method][te] = k_te["kernel_type"].map(
                type_low(types, fallback, k_tr)).fillna(0.0).to_numpy(np.float64)
            for over in overheads:
                fold_overheads[method, over].append(
                    fit_adapted_overhead(over, source.overhead, common, m_tr, seed))
        for partner, rows in from_scratch.items():
            rows[te] = predict_rows(scratch_types(k_tr, seed, partner), fallback, k_te)
    return OutOfFold(kernels, models, row_model, fold, adapted, low, from_scratch,
                     fold_overheads)


def choose(oof: OutOfFold, methods: Sequence[str], overheads: Sequence[str]
           ) -> tuple[tuple[str, str], dict[str, float], dict[str, float]]:
    """(method, overhead) by end-to-end MAPE over the folds: the simplest overhead whose best
    method is within AUTO_TOLERANCE of the best of all, then the simplest method within
    AUTO_TOLERANCE of the best with that overhead; with the cross-validated errors per method
    (with the chosen overhead) and per overhead (with its best method)."""
    cv = {(m, o): oof.e2e_mape(m, o) for m in methods for o in overheads}
    best = min(cv.values())
    over_cv = {o: min(cv[m, o] for m in methods) for o in overheads}
    over = next(o for o in overheads if over_cv[o] <= best * (1 + AUTO_TOLERANCE))
    per_method = {m: cv[m, over] for m in methods}
    best_m = min(per_method.values())
    method = next(m for m in methods if per_method[m] <= best_m * (1 + AUTO_TOLERANCE))
    return (method, over), (per_method if len(methods) > 1 else {}), \
        (over_cv if len(overheads) > 1 else {})


def type_low(types: dict[str, TypeFit], fallback: TypeFit, kernels: pd.DataFrame
             ) -> dict[str, float]:
    """Per kernel type of `kernels`, the smallest prediction of `types` on its rows: below it
    a regressor trained on those rows extrapolates (`wrappers.mixed`)."""
    pred = pd.Series(predict_rows(types, fallback, kernels), index=kernels.index)
    return pred.groupby(kernels["kernel_type"]).min().to_dict()


def predict_rows(types: dict[str, TypeFit], fallback: TypeFit, kernels: pd.DataFrame
                 ) -> np.ndarray:
    """Per kernel row, its type's prediction from its measured features (not re-deduced); a
    type that `types` lacks goes to `fallback`."""
    out = np.zeros(len(kernels))
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        fit = types.get(ktype) or fallback
        X = kernels.iloc[idx][[FEATURE_PREFIX + f for f in fit.features]].to_numpy(np.float64)
        out[idx] = fit.regressor.predict(X)
    return out
