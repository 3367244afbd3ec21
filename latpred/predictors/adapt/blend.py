"""The blend of `auto` (docs/fewshot.md): each adapted kernel type mixed with a regressor trained
on the new device's rows alone (its scratch partner), by a weight the folds choose per type.

The partners: the Lasso family (its alpha searched, as `latpred train` fits it) and a GBDT of
fixed, small trees on the ratio to a Lasso baseline (no search: inside every fold of 10-30
models a search would cost minutes and choose on a few dozen rows). Where the new device
changes a type's cost shape in ways the Lasso's terms do not span (int8 convolutions: which
layers XNNPACK runs as IGEMM, the requantization's share), the trees follow it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latpred.predictors.adapt.wrappers import BlendedRegressor, mixed
from latpred.predictors.overhead import within_one_se
from latpred.predictors.search import SearchSpec
from latpred.predictors.training import TypeFit, fit_all_types, fit_type

# The adapted prediction's weight against the scratch one, the adapted alone first: a type
# moves towards its scratch partner only where that is more than `tolerance` better and more
# than one standard error of the gain over the few models (`overhead.within_one_se`).
BLEND_WEIGHTS = (1.0, 0.75, 0.5, 0.25, 0.0)
# The scratch partners, the one tried first first: `auto` keeps the first whose blend's
# out-of-fold end-to-end MAPE is within its tolerance of the best partner's.
PARTNERS = ("lasso", "gbdt")
# The GBDT partner's trees (predictors/gbdt.py: on Eq. 1, as the ratio to a Lasso baseline),
# and the fewest rows of a type it is fitted on (below: the Lasso partner's fit).
PARTNER_GBDT = dict(base="lasso", base_alpha=1e-4, n_estimators=200, learning_rate=0.05,
                    num_leaves=7, min_child_samples=5)
PARTNER_GBDT_MIN_ROWS = 10


def scratch_types(kernels: pd.DataFrame, seed: int, partner: str = "lasso"
                  ) -> dict[str, TypeFit]:
    """Every kernel type of `kernels` trained on those rows alone: `lasso`, the Lasso family
    searched; `gbdt`, PARTNER_GBDT's trees where a type has PARTNER_GBDT_MIN_ROWS rows, the
    Lasso elsewhere."""
    from threadpoolctl import threadpool_limits

    from latpred.predictors.search import load_search

    lasso = load_search("lasso", "latpred")
    if partner == "lasso":
        return fit_all_types(kernels, lasso, seed)
    few = kernels.groupby("kernel_type")["kernel_type"].transform("size") < PARTNER_GBDT_MIN_ROWS
    fits = fit_all_types(kernels[few], lasso, seed) if few.any() else {}
    spec = SearchSpec("gbdt", "partner", method="none", fixed=PARTNER_GBDT)
    with threadpool_limits(limits=1):
        for ktype, rows in kernels[~few].groupby("kernel_type"):
            fits[ktype] = fit_type(ktype, rows, spec, seed)
    return fits


def type_weights(kernels: pd.DataFrame, row_model: np.ndarray, adapted: np.ndarray,
                 scratch: np.ndarray, low: np.ndarray, tolerance: float
                 ) -> tuple[dict[str, float], dict[str, dict]]:
    """Per kernel type, the first of BLEND_WEIGHTS whose out-of-fold kernel error is within one
    standard error (or `tolerance`) of the best weight's (per-model absolute errors; each row
    mixed as `wrappers.mixed`, `low` per kernel row: its fold's); with the time-weighted
    errors (sum |p - y| / sum y over the type's rows) per weight."""
    y = kernels["latency_ms"].to_numpy(np.float64)
    weights, errors = {}, {}
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        a, s, lo, t = adapted[idx], scratch[idx], low[idx], y[idx]
        _, model = np.unique(row_model[idx], return_inverse=True)
        per_model = {w: np.bincount(model, weights=np.abs(mixed(a, s, w, lo) - t))
                     for w in BLEND_WEIGHTS}
        best = min(BLEND_WEIGHTS, key=lambda w: per_model[w].sum())
        weights[ktype] = next(w for w in BLEND_WEIGHTS
                              if within_one_se(per_model[w], per_model[best], tolerance))
        errors[ktype] = {w: float(e.sum() / np.sum(t)) for w, e in per_model.items()}
    return weights, errors


def blend_types(adapted: dict[str, TypeFit], scratch: dict[str, TypeFit],
                weights: dict[str, float], low: dict[str, float]) -> dict[str, TypeFit]:
    """Each adapted type mixed with its scratch fit by `weights` (1: the adapted fit as it is,
    0: the scratch fit, retrained from the new rows alone) down to `low` (per type, the
    smallest adapted prediction on the rows the scratch fit learned from; `wrappers.mixed`);
    a mixed type's metrics are the scratch fit's, with its `blend_weight`, `blend_low_ms` and
    the adapted fit's metrics under `adapted`."""
    out = {}
    for ktype, fit in adapted.items():
        w = weights.get(ktype, 1.0)
        if w == 1.0 or ktype not in scratch:
            out[ktype] = fit
            continue
        other = scratch[ktype]
        metrics = {**other.metrics, "blend_weight": w, "blend_low_ms": low[ktype],
                   "adapted": fit.metrics}
        features = (*fit.features, *(f for f in other.features if f not in fit.features))
        col = {f: i for i, f in enumerate(features)}
        reg = BlendedRegressor(fit.regressor, [col[f] for f in fit.features], other.regressor,
                               [col[f] for f in other.features], w, low[ktype])
        out[ktype] = TypeFit(ktype, features, reg, {**metrics, "n_rows": fit.metrics["n_rows"]})
    return out
