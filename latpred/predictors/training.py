"""From a measured dataset to the tables a LatencyModel trains on, and the per-type fits.

Two tables, both pandas:
- kernel rows (`kernel_rows`): one per measured kernel with status "ok" and a positive latency:
  `model_id`, `kernel_type`, `latency_ms` and the `f_<feature>` columns, and where the dataset
  has it (CUDA) the `launches` column, which trains the launch-pattern stage
  (predictors/launch.py);
- model rows (`model_rows`): one per model whose end-to-end latency and all of whose kernels were
  measured: `model_id`, `latency_ms` (end to end), `n_kernels`, `kernel_sum_ms`; these drive the
  overhead.

Evaluation builds the same two tables from re-deduced graphs for baselines and ablations and
hands them to `LatencyModel.fit_tables`, so every model trains through one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from latpred.errors import DatasetError
from latpred.predictors import cluster, launch
from latpred.predictors.base import LatencyRegressor
from latpred.predictors.lasso import PositiveLasso
from latpred.predictors.search import SearchSpec, alpha_search, fit_searched

FEATURE_PREFIX = "f_"

# Features every kernel type is expected to carry (op_features' cost figures); the fallback
# regressor for kernel types without one of their own is a Lasso on those that are present.
FALLBACK_FEATURES = ("flops", "bytes_read", "bytes_written", "param_bytes")


def load_tables(dataset: Any, target: str, model_ids: Iterable[str] | None = None,
                analytical: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernel rows, model rows) of `target` from a Dataset or dataset directory; with
    `analytical`, the kernel rows also carry the analytical columns (predictors/analytical.py).
    """
    from latpred.dataset import Dataset

    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)
    models, kernels = ds.models(target), ds.kernels(target)
    if models.empty and kernels.empty:
        raise DatasetError(f"The dataset at {ds.root} has no measurements for target {target}; "
                           f"it has {', '.join(ds.targets()) or 'none'}.")
    if model_ids is not None:
        keep = set(model_ids)
        models = models[models["model_id"].isin(keep)]
        kernels = kernels[kernels["model_id"].isin(keep)]
    if analytical:
        from latpred.predictors.analytical import add_columns, dataset_columns

        rows = add_columns(kernels, dataset_columns(ds, target, model_ids))
        return kernel_rows(rows), model_rows(models, kernels)
    return kernel_rows(kernels), model_rows(models, kernels)


def kernel_rows(kernels: pd.DataFrame) -> pd.DataFrame:
    """Measured kernels usable for training: status ok and a positive, finite latency."""
    kernels = with_graph_columns(kernels)
    ok = (kernels["status"] == "ok") & np.isfinite(kernels["latency_ms"]) & \
        (kernels["latency_ms"] > 0)
    cols = ["model_id", "kernel_type", "latency_ms"] + \
        [c for c in kernels.columns if c.startswith(FEATURE_PREFIX)] + \
        [launch.LAUNCH_COLUMN] * (launch.LAUNCH_COLUMN in kernels)
    return kernels.loc[ok, cols].reset_index(drop=True)


def with_graph_columns(kernels: pd.DataFrame) -> pd.DataFrame:
    """`f_op_code` where missing and `f_context_bytes`, the bytes all kernels of the row's model
    read and write (see `latpred.features.kernel`), summed over every row of the model; tables
    that already have it (datasets never store it) are left as they are."""
    from latpred.features import CONTEXT, context_bytes

    kernels = with_group_columns(with_op_code(kernels))
    if FEATURE_PREFIX + CONTEXT in kernels:
        return kernels
    moved = kernels[FEATURE_PREFIX + "bytes_read"] + kernels[FEATURE_PREFIX + "bytes_written"]
    total = moved.groupby(kernels["model_id"]).transform("sum").to_numpy(np.float64)
    return kernels.assign(**{FEATURE_PREFIX + CONTEXT: context_bytes(total)})


def with_group_columns(kernels: pd.DataFrame) -> pd.DataFrame:
    """The grouped convolutions' per-group columns (`latpred.features.kernel.group_columns`)
    filled in where a dataset featurized before they existed lacks them."""
    from latpred.features.kernel import GROUP_COLUMNS, group_columns

    rows = (kernels["kernel_type"] == "grouped_conv2d").to_numpy() if "kernel_type" in kernels \
        else np.zeros(len(kernels), bool)
    cols = [FEATURE_PREFIX + c for c in GROUP_COLUMNS]
    if not rows.any() or all(c in kernels and kernels.loc[rows, c].notna().all() for c in cols):
        return kernels
    sub = kernels.loc[rows]
    derived = group_columns({c[len(FEATURE_PREFIX):]: sub[c] for c in sub.columns
                             if c.startswith(FEATURE_PREFIX)})
    kernels = kernels.copy()
    for name, values in derived.items():
        col = FEATURE_PREFIX + name
        if col not in kernels:
            kernels[col] = np.nan
        kernels.loc[rows, col] = kernels.loc[rows, col].fillna(
            pd.Series(values.astype(np.float64), index=sub.index))
    return kernels


def with_op_code(kernels: pd.DataFrame) -> pd.DataFrame:
    """`f_op_code` filled in from the `ops` column where a dataset measured before the feature
    existed lacks it: the kernel's main op is the first of its ops, as in `kernel_features`."""
    col = FEATURE_PREFIX + "op_code"
    if "ops" not in kernels or (col in kernels and kernels[col].notna().all()):
        return kernels
    from latpred.features.operation import op_code

    main = kernels["ops"].astype(str).str.split("+", n=1).str[0]
    code = main.map(op_code).astype(np.float64)
    return kernels.assign(**{col: kernels[col].fillna(code) if col in kernels else code})


def model_rows(models: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Models with an ok end-to-end latency and every kernel measured ok, with kernel sums."""
    per_model = kernels.groupby("model_id").agg(
        n_kernels=("kernel_index", "size"),
        n_ok=("status", lambda s: int((s == "ok").sum())),
        kernel_sum_ms=("latency_ms", "sum"))
    m = models[(models["status"] == "ok") & (models["latency_ms"] > 0)]
    m = m[["model_id", "latency_ms"]].merge(per_model, left_on="model_id", right_index=True)
    m = m[m["n_ok"] == m["n_kernels"]].drop(columns="n_ok")
    return m.reset_index(drop=True)


def type_counts(kernels: pd.DataFrame, model_ids) -> pd.DataFrame:
    """Each model's number of kernels of each type (rows in `model_ids` order, a column a
    type): what the typed overhead (predictors/overhead.py) is fitted on."""
    counts = kernels.groupby(["model_id", "kernel_type"]).size().unstack(fill_value=0)
    return counts.reindex(list(model_ids), fill_value=0).astype(np.float64)


def feature_schema(kernel_type: str, rows: pd.DataFrame) -> tuple[str, ...]:
    """The features a kernel type's regressor trains on, in column order.

    `latpred.features.FEATURES[kernel_type]` for the kernel types featurization knows (the
    dataset must hold all of them); for any other type, the f_ columns with a value on every
    row but `context_bytes` (the dataset writes NaN where a feature does not apply to a kernel
    type).
    """
    from latpred.features import FEATURES

    if kernel_type in FEATURES:
        names = FEATURES[kernel_type]
        cols = [FEATURE_PREFIX + f for f in names]
        lacking = [c for c in cols if c not in rows or rows[c].isna().any()]
        if lacking:
            raise DatasetError(f"The {kernel_type} rows lack feature values {lacking[:4]}; "
                               "re-featurize the dataset with this latpred.")
        return tuple(names)
    from latpred.features import CONTEXT

    # The graph-level column is for the types FEATURES gives it to.
    cols = [c for c in rows.columns if c.startswith(FEATURE_PREFIX) and c[2:] != CONTEXT]
    full = rows[cols].notna().all(axis=0)
    return tuple(c[len(FEATURE_PREFIX):] for c in cols if full[c])


@dataclass(frozen=True)
class TypeFit:
    """One kernel type's trained regressor and what training measured about it."""

    kernel_type: str
    features: tuple[str, ...]
    regressor: LatencyRegressor
    metrics: dict[str, Any]


def fit_type(kernel_type: str, rows: pd.DataFrame, spec: SearchSpec, seed: int,
             features: tuple[str, ...] | None = None) -> TypeFit:
    """Search and fit the regressor of one kernel type on its rows (on `features`, by default
    its `feature_schema`); a type of `launch.LAUNCH_TYPES` whose rows carry `launches` gets
    the launch-pattern stage (predictors/launch.py): its regressor also sees the launch pattern
    (trained on the true one, given a pattern classifier's at prediction), and the fit holds a
    `LaunchStaged` regressor."""
    features = features or feature_schema(kernel_type, rows)
    if not features:
        raise DatasetError(f"Kernel type {kernel_type} has no feature column with a value on "
                           "every row; the dataset was not featurized.")
    # Named columns: the linear family builds its cost terms from them (predictors/lasso_terms).
    X = pd.DataFrame(rows[[FEATURE_PREFIX + f for f in features]].to_numpy(np.float64),
                     columns=list(features))
    y = rows["latency_ms"].to_numpy(np.float64)
    groups = rows["model_id"].to_numpy() if "model_id" in rows else None
    stage = launch.fit_stage(X.to_numpy(), features, rows, seed) \
        if launch.applies(kernel_type, rows) else None
    reps = np.ones(len(y))
    if stage is not None:
        classifier, classes, reps, _ = stage
        X = pd.concat([X, pd.DataFrame(classes, columns=classifier.columns())], axis=1)
    # With the stage, a per-group loop's regressor learns the latency per repetition.
    result = fit_searched(spec, X, y / reps, seed=seed, groups=groups)
    # The training error on the columns the regressor was fitted on (with the stage: the
    # true pattern classes, not the classifier's).
    pred = result.estimator.predict(X) * reps
    metrics = {"n_rows": int(len(y)), "search": spec.name, "n_candidates": result.n_candidates,
               "best_params": result.best_params, "cv_mape": result.cv_mape,
               "train_mape": float(np.mean(np.abs(pred - y) / y))}
    if stage is None:
        return TypeFit(kernel_type, features, result.estimator, metrics)
    return TypeFit(kernel_type, features, launch.LaunchStaged(result.estimator, stage[0]),
                   {**metrics, "launch": stage[3]})


def fit_fallback(rows: pd.DataFrame) -> TypeFit | None:
    """A Lasso on the cost features all kernels share, for kernel types never measured.

    A linear cost model in FLOPs and bytes moved extrapolates to an unseen kernel type far more
    sensibly than any per-type model could; it is only used when the caller allows it, and its
    predictions are flagged. None when the rows share none of FALLBACK_FEATURES.
    """
    features = tuple(f for f in FALLBACK_FEATURES
                     if FEATURE_PREFIX + f in rows and rows[FEATURE_PREFIX + f].notna().all())
    if not features or len(rows) < 2:
        return None
    X = rows[[FEATURE_PREFIX + f for f in features]].to_numpy(np.float64)
    y = rows["latency_ms"].to_numpy(np.float64)
    from sklearn.model_selection import KFold

    if len(y) >= 10:
        reg = alpha_search(PositiveLasso(), list(np.logspace(-5, 2, 8)), X, y,
                           KFold(5, shuffle=True, random_state=0)).estimator
    else:
        reg = PositiveLasso().fit(X, y)
    mape = float(np.mean(np.abs(reg.predict(X) - y) / y))
    return TypeFit("_fallback", features, reg, {"n_rows": int(len(y)), "train_mape": mape})


def fit_all_types(kernels: pd.DataFrame, spec: SearchSpec, seed: int = 0,
                  progress: Callable[[str, int, int], None] | None = None,
                  schema: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, TypeFit]:
    """One TypeFit per kernel type present in `kernels`, most rows first.

    `progress(kernel_type, rows, total_rows)` is called before each type is fitted; `schema`
    gives some kernel types other feature columns than their `feature_schema`.
    """
    from threadpoolctl import threadpool_limits

    schema = schema or {}
    fits: dict[str, TypeFit] = {}
    groups = sorted(kernels.groupby("kernel_type"), key=lambda kv: -len(kv[1]))
    # One BLAS/OpenMP thread: the fits are single-threaded by design (LightGBM n_jobs=1, the
    # Lasso's coordinate descent), and idle pool threads spinning on a busy shared machine
    # made training 3-8x slower on this project's 2-core VMs.
    with threadpool_limits(limits=1):
        for ktype, rows in groups:
            if progress:
                progress(str(ktype), len(rows), len(kernels))
            fits[ktype] = fit_type(ktype, rows, spec, seed, schema.get(ktype))
    return fits


def out_of_fold_kernels(kernels: pd.DataFrame, fits: Mapping[str, TypeFit], spec: SearchSpec,
                        seed: int = 0, folds: int = 5) -> np.ndarray:
    """Each kernel row's latency predicted by its type's regressor refitted without the row's
    model (GroupKFold by model, the type's searched hyperparameters, no new search): what the
    end-to-end residual stage (predictors/residual.py) trains on. A type measured in a single
    model keeps its own fit's prediction. The refits are independent jobs (`cluster.run_all`:
    tasks on a Ray cluster inside `cluster.on_ray`)."""
    from sklearn.model_selection import GroupKFold
    from threadpoolctl import threadpool_limits

    out = np.zeros(len(kernels))
    jobs, rows_of_job = [], []
    for ktype, rows in kernels.groupby("kernel_type"):
        fit = fits[ktype]
        pos = kernels.index.get_indexer(rows.index)
        X = rows[[FEATURE_PREFIX + f for f in fit.features]].to_numpy(np.float64)
        groups = rows["model_id"].to_numpy()
        k = min(folds, len(np.unique(groups)))
        if k < 2:
            out[pos] = fit.regressor.predict(X)
            continue
        fixed = SearchSpec(spec.family, "fixed", method="none",
                           fixed={**spec.fixed, **fit.metrics.get("best_params", {})})
        # what fit_type reads, shipped once a type to a cluster's workers
        needed = rows[[c for c in rows.columns if c.startswith(FEATURE_PREFIX)
                       or c in ("latency_ms", "model_id", launch.LAUNCH_COLUMN)]]
        for train, test in GroupKFold(k, shuffle=True, random_state=seed).split(X, None, groups):
            jobs.append((str(ktype), needed, train, fixed, seed, fit.features, X[test]))
            rows_of_job.append(pos[test])
    with threadpool_limits(limits=1):
        for at, predicted in zip(rows_of_job, cluster.run_all(_refit_predict, jobs)):
            out[at] = predicted
    return out


def _refit_predict(kernel_type: str, rows: pd.DataFrame, train: np.ndarray, spec: SearchSpec,
                   seed: int, features: tuple[str, ...], X_test: np.ndarray) -> np.ndarray:
    """`fit_type` on `rows`' `train` rows, predicting `X_test`."""
    return fit_type(kernel_type, rows.iloc[train], spec, seed, features).regressor.predict(X_test)
