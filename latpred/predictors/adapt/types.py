"""Per kernel type, the source's regressor carried to the new device's rows (adapt's methods
`global`, `scale`, `residual`, `stacked`; docs/fewshot.md), or a regressor of the new rows
alone where the source cannot predict the type."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from latpred.errors import PredictorError
from latpred.predictors.adapt.wrappers import AdaptedRegressor, StackedRegressor
from latpred.predictors.base import LatencyRegressor
from latpred.predictors.training import FEATURE_PREFIX, TypeFit, fit_fallback, fit_type

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


def adapt_types(source, kernels: pd.DataFrame, target: str, method: str, seed: int
                ) -> tuple[dict[str, TypeFit], float]:
    """Per kernel type of `kernels`: the source's regressor rescaled (and residual-tuned), or a
    regressor of the new device's rows where the source has none (or lacks its features); and
    the common factor (of every kernel the source can predict)."""
    ratio = bytes_ratio(source.target, target)
    base_pred = source_predictions(source, kernels, ratio)
    y = kernels["latency_ms"].to_numpy(np.float64)
    known = np.isfinite(base_pred)
    overall = factor(base_pred[known], y[known]) if known.any() else 1.0
    fits: dict[str, TypeFit] = {}
    for ktype, idx in kernels.groupby("kernel_type").indices.items():
        rows = kernels.iloc[idx]
        if not np.isfinite(base_pred[idx]).all():
            fits[ktype] = fresh_fit(ktype, rows, seed)
            continue
        p, t = base_pred[idx], y[idx]
        # `global`: every type takes the common factor (the type's own is kept for the record)
        w = 0.0 if method == "global" else len(idx) / (len(idx) + SHRINK_ROWS)
        own = factor(p, t)
        scale = w * own + (1 - w) * overall
        src = source.types[ktype]
        residual, residual_cv = None, None
        X = pd.DataFrame(rows[[FEATURE_PREFIX + f for f in src.features]].to_numpy(np.float64),
                         columns=list(src.features))
        if method == "residual" and len(idx) >= RESIDUAL_MIN_ROWS:
            residual, residual_cv = _residual_if_better(rows["model_id"].to_numpy(), X,
                                                        p * scale, t, seed)
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
            "residual_cv_error": residual_cv,
            "stacked": isinstance(reg, StackedRegressor), "stacked_cv_mape": stacked_cv,
            "stacked_trees": isinstance(reg, StackedRegressor) and reg.residual is not None,
            "stacked_trees_cv_mape": trees_cv,
            "source_rows": src.metrics.get("n_rows"),
            "train_mape": float(np.mean(np.abs(pred - t) / t))})
    return fits, overall


def bytes_ratio(source_target: str, target: str) -> float:
    """Bytes per float element on the source's precision over the new target's (1 when equal)."""
    from latpred.target import parse_target

    src, new = parse_target(source_target).precision, parse_target(target).precision
    return ELEMENT_BYTES.get(src, 4) / ELEMENT_BYTES.get(new, 4)


def _feature_scale(features: Sequence[str], ratio: float) -> tuple[float, ...] | None:
    """Per-feature multipliers that show the source a kernel in its own precision's bytes."""
    if ratio == 1.0:
        return None
    return tuple(ratio if f in BYTE_FEATURES else 1.0 for f in features)


def source_predictions(source, kernels: pd.DataFrame, ratio: float = 1.0) -> np.ndarray:
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


def factor(p: np.ndarray, y: np.ndarray) -> float:
    """argmin_s sum(y * ((s p - y) / y)^2) = sum(p) / sum(p^2 / y): the squared percentage
    error weighted by each kernel's time. Unweighted, the many few-microsecond kernels set the
    factor, while the long convolutions set the end-to-end latency (two threads speed those up
    most): on host t1 -> t2 the unweighted factor left a +7% end-to-end bias."""
    return float(np.sum(p) / np.sum(p * p / y))


def ratio_trees(X: pd.DataFrame, p: np.ndarray, y: np.ndarray, seed: int, **settings):
    """A GBDT on ratio = measured `y` / prediction `p`, fitted on Eq. 1 (weights 1/r^2), so
    the product's percentage error is what it minimises (as `LinearBaseMixin` argues). Rows
    predicted at 0 have no ratio and are left out: a stacked linear head clipped at 0 gave
    one such row (a 2 us kernel) and an infinite target."""
    from latpred.predictors.gbdt import PercentGBDT

    ok = p > 0
    return PercentGBDT(**settings, random_state=seed).fit(X[ok], y[ok] / p[ok])


def _residual_if_better(groups: np.ndarray, X: pd.DataFrame, p: np.ndarray, y: np.ndarray,
                        seed: int) -> tuple[LatencyRegressor | None, float | None]:
    """`residual`'s trees on measured / scaled prediction `p` (RESIDUAL_TREES), kept where
    their 3-fold CV grouped by model (`groups`) has less time-weighted kernel error
    (sum |p r - y| / sum y, what the end-to-end latency adds up) than the factor alone on the
    same rows; else None. Fitted on every type of 40+ rows, trees learned on 30 synthetic t2
    models (about half of them no better than the factor on held-out models) priced the zoo's
    small models' kernels 10-14% too slow (docs/fewshot.md, session 17)."""
    settings = dict(RESIDUAL_TREES, min_child_samples=max(10, len(y) // 10))
    oof = _out_of_fold_trees(groups, X, p, y, seed, settings)
    if oof is None:
        return None, None
    cv = float(np.sum(np.abs(oof[0] - y)) / np.sum(y))
    if cv >= float(np.sum(np.abs(p - y)) / np.sum(y)):
        return None, cv
    return ratio_trees(X, p, y, seed, **settings), cv


def _out_of_fold_trees(groups: np.ndarray, X: pd.DataFrame, p: np.ndarray, y: np.ndarray,
                       seed: int, settings: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """Ratio trees (`settings`) on y / p in a 3-fold cross-validation grouped by model
    (`groups`): per row its out-of-fold prediction p * trees(X) and its fold; None under three
    models."""
    from sklearn.model_selection import GroupKFold

    if len(set(groups)) < 3:
        return None
    fitted, fold = np.empty_like(p), np.empty(len(p), np.int64)
    for k, (a, b) in enumerate(GroupKFold(3).split(X, groups=groups)):
        trees = ratio_trees(X.iloc[a], p[a], y[a], seed, **settings)
        fitted[b], fold[b] = p[b] * trees.predict(X.iloc[b]), k
    return fitted, fold


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
    p = reg.predict(X.to_numpy())
    oof = _out_of_fold_trees(groups, X, p, y, seed, STACKED_TREES)
    if oof is None:
        return reg, None
    ape, fold = np.abs(oof[0] - y) / y, oof[1]
    cv = float(np.mean([np.mean(ape[fold == k]) for k in range(3)]))   # the folds' mean
    if cv >= float(np.mean(np.abs(p - y) / y)):
        return reg, cv
    return StackedRegressor(reg.base, reg.head, ratio_trees(X, p, y, seed, **STACKED_TREES)), cv


def fresh_fit(ktype: str, rows: pd.DataFrame, seed: int) -> TypeFit:
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
