"""Low-quantile latency estimators, per-round statistics and the sequential stopping rule.

Interference on a shared host only ever slows a run down (another process takes the core, the
caches are cold, the hypervisor steals time), so the fastest runs are the ones that measured the
model and nothing else. Measured on 2026-11-23 on the 2-core VM (issue 12): the same 33 real
models in six interleaved rounds of 15 runs, odd rounds against even rounds, retest MdAPE

    median 3.4% (worst model 29%) | 10th percentile 1.8% | minimum 1.5% (worst 5.0%)

and a plain median-of-30 loop retested at 8.7%. The minimum is therefore the default
(`DEFAULT_ESTIMATOR`); it ran ~9% below the median. The others stay selectable
(`InterleavedProtocol.estimator`, `latpred profile --estimator`), and because the raw per-round
statistics are stored in the dataset (`rounds_json`) another estimator can be computed later:

- "min": the fastest run. Steadiest on this host; per kernel it is also what XNNPACK's
  truncated whole-microsecond readings reproduce best (the floor of a kernel's fastest run).
- "p05", "p10": the 5th / 10th percentile (linear interpolation), a little less sensitive to
  a single run that was fast by luck (there is no such luck on a CPU, hence the minimum).
- "lowmean": the mean of the fastest 20% of the runs (at least one), a trimmed low mean: finer
  than the minimum for kernels whose readings are whole microseconds.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from latpred.errors import MeasurementError

DEFAULT_ESTIMATOR = "min"
LOWMEAN_FRACTION = 0.2


def _lowmean(values: np.ndarray) -> float:
    k = max(1, int(math.ceil(LOWMEAN_FRACTION * values.size)))
    return float(np.mean(np.sort(values)[:k]))


ESTIMATORS: dict[str, Callable[[np.ndarray], float]] = {
    "min": lambda v: float(np.min(v)),
    "p05": lambda v: float(np.percentile(v, 5)),
    "p10": lambda v: float(np.percentile(v, 10)),
    "lowmean": _lowmean,
}


def check_estimator(name: str) -> str:
    """`name` if it is a known estimator, else a MeasurementError naming the known ones."""
    if name not in ESTIMATORS:
        raise MeasurementError(f"Unknown estimator {name!r}; use one of {', '.join(ESTIMATORS)}.")
    return name


def estimate(values: Sequence[float] | np.ndarray, name: str = DEFAULT_ESTIMATOR) -> float:
    """The estimator `name` over `values` (NaN when there are none)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return math.nan
    return ESTIMATORS[check_estimator(name)](v)


def round_stats(values: Sequence[float] | np.ndarray, scale: float = 1.0) -> dict[str, float]:
    """What the dataset keeps of one round of one model or kernel: n, min, p10, median, lowmean
    (times `scale`, e.g. 1e-3 for microseconds to milliseconds; 5 significant digits)."""
    v = np.asarray(values, dtype=np.float64).ravel() * scale
    if v.size == 0:
        return {"n": 0}
    return {"n": int(v.size), "min": _sig(np.min(v)), "p10": _sig(np.percentile(v, 10)),
            "p50": _sig(np.median(v)), "lowmean": _sig(_lowmean(v))}


def _sig(x: float) -> float:
    return float(f"{float(x):.5g}")


def is_stable(history: Sequence[float], tolerance: float, window: int = 2) -> bool:
    """Whether an estimator, recomputed after every round (`history`), moved by less than
    `tolerance` (a fraction) over the last `window` rounds: |e[-1] - e[-1-window]| / e[-1]."""
    if len(history) <= window:
        return False
    last, before = history[-1], history[-1 - window]
    if not (last > 0) or math.isnan(before):
        return False
    return abs(last - before) / last < tolerance


def pct_diffs(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """|b - a| / a in percent per (a, b) pair with a > 0 and both finite."""
    out = [abs(b - a) / a * 100.0 for a, b in pairs
           if a > 0 and not (math.isnan(a) or math.isnan(b))]
    return np.asarray(out, dtype=np.float64)


def retest_figures(pairs: Sequence[tuple[float, float]]) -> dict[str, float | int | None]:
    """Median and 90th percentile of the test-retest differences (percent) and their count."""
    d = pct_diffs(pairs)
    if d.size == 0:
        return {"mdape": None, "p90": None, "n": 0}
    return {"mdape": round(float(np.median(d)), 3), "p90": round(float(np.percentile(d, 90)), 3),
            "n": int(d.size)}
