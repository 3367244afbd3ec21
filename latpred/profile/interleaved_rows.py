"""Dataset rows from the raw rounds of the interleaved protocol (`interleaved.ModelRounds`).

A model's latency is the estimator over all its plain runs (profiler stopped); a kernel's is the
estimator over its per-run times, each run's time being the sum of the readings of the profiled
operators attributed to the kernel's ops in that run (`op_attribution.attribute_to_graph`; +0.5
us per XNNPACK reading, which XNNPACK truncates to whole microseconds). Per run the kernels add up
to that run's operator sum, so kernel figures and the end to end come from the same blocks.

Besides the usual columns, rows carry the raw per-round statistics (`rounds_json`) so that
another estimator can be computed later without re-measuring:

- models: `{"plain": [round, ...], "profiled": [...], "op_sum": [...]}`, kernels:
  `[round, ...]`; a round is `{"n", "min", "p10", "p50", "lowmean"}` in milliseconds.
- models also get `estimator`, `n_rounds`, `stopped` ("stable"/"cap"), `measured_at` (Unix
  time, the middle of the model's rounds, which drift correction interpolates at),
  `profiled_ms` and `op_sum_ms` (the estimator over the profiled runs' wall clock and operator
  sums: their ratio to `latency_ms` shows the profiler's cost and what the kernels cover).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from latpred.errors import LatpredError, MeasurementError
from latpred.profile.estimators import estimate, round_stats
from latpred.profile.interleaved import ModelRounds

_XNNPACK_BIAS_US = 0.5


@dataclass(frozen=True)
class _Op:
    """The fields of `litert_profiler.OpTiming` that `attribute_to_graph` reads."""

    index: int
    name: str
    source: str
    mean_us: float = 0.0
    iqr_us: float = 0.0
    min_us: float = 0.0


@dataclass(frozen=True)
class _Ops:
    ops: tuple[_Op, ...]


# Below a few ticks of the profiler's whole-microsecond readings a low quantile says nothing:
# a 0.3 us SHAPE reads 0 in most runs and 1 in some, so its minimum is 0 (and a kernel label of
# 0 cannot be learned in percent). The mean of truncated readings of a duration that starts at a
# random phase of the clock is unbiased, and interference rarely lands inside so short a kernel:
# kernels whose estimate is under SUB_TICK_MS take the mean of their runs instead.
SUB_TICK_MS = 0.003


def _pooled_stats(per_round: Sequence[np.ndarray], estimator: str,
                  sub_tick_mean: bool = False) -> dict[str, Any]:
    every = np.concatenate([np.asarray(r, dtype=np.float64) for r in per_round]) / 1000.0
    q1, q3 = np.percentile(every, [25, 75])
    value = estimate(every, estimator)
    if sub_tick_mean and value < SUB_TICK_MS:
        value = float(np.mean(every))
    return {"status": "ok", "latency_ms": value,
            "latency_iqr_ms": float(q3 - q1), "latency_min_ms": float(every.min()),
            "n_runs": int(every.size)}


def _rounds(per_round: Sequence[np.ndarray]) -> list[dict[str, float]]:
    return [round_stats(r, 1e-3) for r in per_round]


def model_stats(rounds: ModelRounds, estimator: str) -> dict[str, Any]:
    """A models.parquet row's latency columns and the interleaved extras."""
    op_sums = [ops.sum(axis=1) + _bias(rounds.op_keys) for ops in rounds.op_us]
    raw = {"plain": _rounds(rounds.plain_us), "profiled": _rounds(rounds.profiled_us),
           "op_sum": _rounds(op_sums)}
    return {**_pooled_stats(rounds.plain_us, estimator), **extras(rounds, estimator),
            "profiled_ms": estimate(np.concatenate(rounds.profiled_us), estimator) / 1000.0,
            "op_sum_ms": estimate(np.concatenate(op_sums), estimator) / 1000.0,
            "rounds_json": json.dumps(raw, separators=(",", ":"))}


def extras(rounds: ModelRounds | None, estimator: str) -> dict[str, Any]:
    """The extra model columns, with neutral values for a model that was not measured."""
    if rounds is None or not rounds.ok:
        return {"estimator": estimator, "n_rounds": 0, "stopped": "", "measured_at": math.nan,
                "profiled_ms": math.nan, "op_sum_ms": math.nan, "rounds_json": ""}
    return {"estimator": estimator, "n_rounds": len(rounds.plain_us), "stopped": rounds.stopped,
            "measured_at": (rounds.started + rounds.finished) / 2.0}


def _bias(keys: Sequence[tuple[int, str, str]]) -> float:
    return _XNNPACK_BIAS_US * sum(k[2] == "xnnpack" for k in keys)


def kernel_events(graph, kernels, keys: Sequence[tuple[int, str, str]]) -> list[list[int]]:
    """Per kernel, the indices of the profiled operators that belong to its ops."""
    from latpred.profile.op_attribution import attribute_to_graph, kernel_members

    try:
        attributed = attribute_to_graph(graph, _Ops(tuple(_Op(*k) for k in keys)))
    except (ValueError, IndexError) as err:
        raise MeasurementError(f"The profile does not map onto the model's ops ({err}).") from None
    return [[j for a in members for j in a.events]
            for members in kernel_members(attributed, kernels)]


def kernel_stats(graph, kernels, rounds: ModelRounds, estimator: str) -> list[dict[str, Any]]:
    """Per kernel, a kernels.parquet row's latency columns plus `rounds_json`. Raises
    `MeasurementError` when the operators cannot be attributed to the graph's ops."""
    keys = rounds.op_keys
    out = []
    for events in kernel_events(graph, kernels, keys):
        bias = _bias([keys[j] for j in events])
        per_round = [ops[:, events].sum(axis=1) + bias for ops in rounds.op_us]
        out.append({**_pooled_stats(per_round, estimator, sub_tick_mean=True),
                    "rounds_json": json.dumps(_rounds(per_round), separators=(",", ":"))})
    return out


def e2e_and_kernels(prep, rounds: ModelRounds, estimator: str) -> tuple[float, list[float]]:
    """The end-to-end estimate and each planned kernel's (empty when they cannot be split out);
    what the start and end retests compare."""
    e2e = estimate(np.concatenate(rounds.plain_us), estimator) / 1000.0
    if not prep.plans:
        return e2e, []
    try:
        stats = kernel_stats(prep.graph, [p.kernel for p in prep.plans], rounds, estimator)
    except LatpredError:
        return e2e, []
    return e2e, [s["latency_ms"] for s in stats]


def rounds_estimate(rounds_json: str, estimator: str = "min", series: str = "plain") -> float:
    """An estimate recomputed from a stored `rounds_json` (a model's `series`, or a kernel's
    list): "min" exactly; the others as the median over rounds of that round statistic
    ("p10", "p50", "lowmean"). NaN without rounds."""
    data = json.loads(rounds_json) if rounds_json else []
    rounds = data.get(series, []) if isinstance(data, dict) else data
    rounds = [r for r in rounds if r.get("n")]
    if not rounds:
        return math.nan
    if estimator == "min":
        return float(min(r["min"] for r in rounds))
    if estimator not in ("p10", "p50", "lowmean"):
        raise LatpredError(f"Cannot recompute {estimator!r} from per-round statistics; use "
                           "min, p10, p50 or lowmean.")
    return float(np.median([r[estimator] for r in rounds]))


def split_half_figures(rounds_jsons: Sequence[str], estimators: Sequence[str] = (
        "min", "p10", "p50", "lowmean"), series: str | None = "plain") -> dict[str, dict]:
    """How well each estimator repeats within a campaign: per model (or kernel, `series=None`),
    the estimate from its odd rounds against the one from its even rounds (`rounds_estimate`),
    as test-retest MdAPE / p90 in percent over the rows with at least two rounds. This is how
    issue 12 chose the minimum; run it on a new campaign (`latpred dataset estimators`)."""
    from latpred.profile.estimators import retest_figures

    halves: dict[str, list[tuple[float, float]]] = {e: [] for e in estimators}
    for text in rounds_jsons:
        if not text:
            continue
        data = json.loads(text)
        rounds = data.get(series, []) if isinstance(data, dict) else data
        if len(rounds) < 2:
            continue
        odd, even = json.dumps(rounds[0::2]), json.dumps(rounds[1::2])
        for e in estimators:
            halves[e].append((rounds_estimate(odd, e), rounds_estimate(even, e)))
    return {e: retest_figures(pairs) for e, pairs in halves.items()}
