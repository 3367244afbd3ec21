"""Train and score each method of a report on one split: latpred families, baselines, ablations.

Every method is trained on the same training models and scored on the same test models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from latpred.evaluate.data import EvalSet
from latpred.evaluate.metrics import e2e_metrics, per_type_mape


@dataclass(frozen=True, eq=False)
class MethodResult:
    """One method's predictions for the test models and their figures."""

    name: str
    kind: str                      # "latpred", "baseline" or "ablation"
    predicted_ms: np.ndarray
    metrics: dict[str, Any]
    per_type: dict[str, dict[str, float]] = field(default_factory=dict)
    kernels: pd.DataFrame | None = None  # kernel_type, measured_ms, predicted_ms (test)
    fit_seconds: float = 0.0
    notes: tuple[str, ...] = ()


def score_latpred(model, test: EvalSet, name: str, kind: str = "latpred",
                  kernels=None, fit_seconds: float = 0.0) -> MethodResult:
    """Predict `test` with a LatencyModel (on the given, e.g. rewritten, kernels)."""
    kernels = test.kernels if kernels is None else kernels
    preds = model.predict_kernels(test.graphs, kernels, allow_fallback=True)
    total = np.array([p.total_ms for p in preds])
    notes = []
    fallback = sorted({t for p in preds for t in p.fallback_types})
    if fallback:
        notes.append(f"kernel types without a regressor, predicted by the flagged fallback: "
                     f"{', '.join(fallback)}")
    table = None
    if kernels is test.kernels:  # per-kernel figures only where kernels are the measured ones
        table = _kernel_table(test, preds)
    return MethodResult(name, kind, total, e2e_metrics(test.measured_ms, total),
                        per_type_mape(table) if table is not None else {}, table, fit_seconds,
                        tuple(notes))


def _kernel_table(test: EvalSet, preds) -> pd.DataFrame:
    parts = []
    for aligned, ks, ms, p in zip(test.aligned, test.kernels, test.kernel_ms, preds):
        if aligned:
            parts.append(pd.DataFrame({"kernel_type": [k.type for k in ks], "measured_ms": ms,
                                       "predicted_ms": p.kernel_ms}))
    if not parts:
        return pd.DataFrame(columns=["kernel_type", "measured_ms", "predicted_ms"])
    table = pd.concat(parts, ignore_index=True)
    return table[np.isfinite(table["measured_ms"]) & (table["measured_ms"] > 0)]


def fit_latpred(dataset, train_ids, target: str, family: str, search: str, seed: int,
                analytical: bool = False):
    """A LatencyModel trained on `train_ids` of `dataset`, and the seconds it took."""
    from latpred.predictors import LatencyModel

    start = time.perf_counter()
    model = LatencyModel.fit(dataset, target, family=family, search=search,
                             model_ids=train_ids, seed=seed, analytical_features=analytical)
    return model, time.perf_counter() - start


def method_name(family: str, search: str, analytical: bool = False) -> str:
    return (f"latpred {family}" + ("" if search == "latpred" else f" ({search} grid)")
            + (" + analytical" if analytical else ""))


def run_baselines(train: EvalSet, test: EvalSet) -> list[MethodResult]:
    """FLOPs-linear and nn-Meter's RF, trained on `train`, scored on `test`."""
    from latpred.baselines import FlopsLinear, NnMeterBaseline, model_flops

    out = []
    start = time.perf_counter()
    flops_train = [model_flops(g) for g in train.graphs]
    lin = FlopsLinear.fit(flops_train, train.measured_ms)
    pred = lin.predict([model_flops(g) for g in test.graphs])
    out.append(MethodResult("FLOPs-linear", "baseline", pred,
                            e2e_metrics(test.measured_ms, pred),
                            fit_seconds=time.perf_counter() - start))
    complete = np.flatnonzero(train.complete())
    if len(complete):
        start = time.perf_counter()
        nnm = NnMeterBaseline.fit([train.graphs[i] for i in complete],
                                  [train.kernels[i] for i in complete],
                                  [train.kernel_ms[i] for i in complete], train.target)
        pred = nnm.predict(test.graphs, test.kernels)
        out.append(MethodResult(
            "nn-Meter RF", "baseline", pred, e2e_metrics(test.measured_ms, pred),
            fit_seconds=time.perf_counter() - start,
            notes=(f"backend {nnm.backend}, trained on {len(complete)} models with every kernel "
                   "measured; ops without an nn-Meter predictor are left out of its sum",)))
    return out


def run_ablations(train: EvalSet, test: EvalSet, family: str, search: str,
                  seed: int) -> list[MethodResult]:
    """latpred without fusion / without kernel selection (skipped where they change nothing)."""
    from latpred.evaluate.ablation import (ABLATIONS, rewritten_kernels, training_tables,
                                           unchanged)
    from latpred.predictors import LatencyModel

    out = []
    for label, rewrite in ABLATIONS.items():
        if unchanged(train, rewrite) and unchanged(test, rewrite):
            continue
        start = time.perf_counter()
        kt, mt = training_tables(train, rewrite)
        if kt.empty or mt.empty:
            continue
        model = LatencyModel.fit_tables(kt, mt, train.target, family, search, seed=seed)
        out.append(score_latpred(model, test, f"latpred {family} {label}", "ablation",
                                 rewritten_kernels(test, rewrite),
                                 time.perf_counter() - start))
    return out
