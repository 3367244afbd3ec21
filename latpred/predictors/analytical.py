"""The analytical features (tile/wave quantization, TMModel) as extra regressor columns.

Off by default: docs/analytical-features.md ("Model-level ablation") has the numbers behind
that. A LatencyModel trained with `analytical_features=True` gives the regressors of the
conv-like kernel types (`CONV_LIKE`) the columns of `latpred.features.tile.analytical_features`
on top of `FEATURES[type]`, those with a value on every training row of the type: on a CPU
target the GEMM sizes and TMModel's work groups, on a GPU target whose profile has tile shapes
also the per-tile grid / wave / utilisation columns and TMModel's occupancy terms.

Training rows get the columns from the models' graphs, rebuilt from the dataset's `arch` column
and deduced again (the dataset stores only `kernel_features`' columns); a measured kernel is
matched by model, kernel index and kernel type. Prediction computes them with `featurizer`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

import pandas as pd

from latpred.errors import DatasetError
from latpred.features import FEATURES, kernel_features

CONV_LIKE = frozenset({"conv2d", "grouped_conv2d", "dwconv2d", "dwconv2d_igemm", "fc",
                       "batch_matmul", "winograd_matmul"})
PREFIX = "f_"
KEYS = ("model_id", "kernel_index", "kernel_type")


def featurizer(enabled: bool) -> Callable[[Any, Any, Any], dict]:
    """`kernel_features` itself when off (the fast path), else one that adds the analytical
    columns to the kernels of the conv-like types."""
    if not enabled:
        return kernel_features
    from latpred.features.tile import analytical_features

    def with_analytical(graph, kernel, target) -> dict:
        f = kernel_features(graph, kernel, target)
        if kernel.type in CONV_LIKE:
            return {**f, **analytical_features(graph, kernel, target)}
        return f

    return with_analytical


def dataset_columns(dataset: Any, target: str,
                    model_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """model_id, kernel_index, kernel_type and the f_ analytical columns of every conv-like
    kernel of the dataset's models of `target` (rebuilt from `arch`; models without one are
    skipped)."""
    from latpred.deduce import deduce
    from latpred.features.tile import analytical_features
    from latpred.sampler import build_graph
    from latpred.target import parse_target

    models = dataset.models(target)
    if model_ids is not None:
        models = models[models["model_id"].isin(set(model_ids))]
    t = parse_target(target)
    rows = []
    keys = analytical_keys(t)
    for mid, arch in zip(models["model_id"], models["arch"].fillna("")):
        if not arch:
            continue
        g = build_graph(json.loads(arch))
        for i, k in enumerate(deduce(g, t)):
            if k.type in CONV_LIKE:
                f = analytical_features(g, k, t)
                rows.append([mid, i, k.type, *(f[n] for n in keys)])
    return pd.DataFrame(rows, columns=list(KEYS) + [PREFIX + n for n in keys])


def add_columns(kernels: pd.DataFrame, columns: pd.DataFrame) -> pd.DataFrame:
    """The dataset's kernel table with the analytical columns joined in (NaN where no rebuilt
    kernel matches: another deduction, or no architecture to rebuild)."""
    new = [c for c in columns.columns if c not in KEYS]
    return kernels.drop(columns=[c for c in new if c in kernels]).merge(
        columns, on=list(KEYS), how="left")


def analytical_keys(target: Any) -> tuple[str, ...]:
    """The keys `analytical_features` returns for `target` (fixed per device profile)."""
    from latpred.features.tile import gemm_features
    from latpred.features.tmmodel import KEYS as TM_KEYS

    gpu = getattr(getattr(target, "device", None), "gpu", None)
    shapes = gpu.tile_shapes if gpu is not None else ()
    units = gpu.compute_units if gpu is not None else None
    return tuple(gemm_features(None, shapes, units)) + TM_KEYS


def schemas(kernels: pd.DataFrame, target: Any) -> tuple[dict[str, tuple[str, ...]],
                                                          pd.DataFrame]:
    """Per conv-like kernel type in the training rows: FEATURES[type] plus the analytical
    columns with a value on every row of the type; and the rows to train on (conv-like rows
    without analytical values, i.e. not matched to a rebuilt kernel, are left out).

    Refuses tables without analytical columns: a predictor trained with the option must see
    them, or it would silently be the plain one.
    """
    keys = analytical_keys(target)
    first = PREFIX + keys[0]
    if first not in kernels:
        raise DatasetError(f"The kernel rows carry no analytical feature columns ({first}, ...); "
                           "build them with latpred.predictors.analytical.add_columns.")
    conv = kernels["kernel_type"].isin(CONV_LIKE)
    kept = kernels[~conv | kernels[first].notna()].reset_index(drop=True)
    out: dict[str, tuple[str, ...]] = {}
    for ktype, rows in kept[kept["kernel_type"].isin(CONV_LIKE)].groupby("kernel_type"):
        full = tuple(n for n in keys if PREFIX + n in rows and rows[PREFIX + n].notna().all())
        out[str(ktype)] = FEATURES[str(ktype)] + full
    return out, kept

