"""The GPU timing protocol, free of LiteRT: passes of back-to-back calls, warm-up, estimators.

`litert_gpu` compiles and runs the models; this module decides how they are timed and how the
timings are summarised, so it can be tested with fake models and a fake clock. The reasons for
each step are in `litert_gpu`'s docstring and in docs/measurement.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from latpred.errors import MeasurementError


class Runnable(Protocol):
    """What the timing needs of a compiled model: one call, and a read-back that waits."""

    def run(self) -> None: ...

    def sync(self) -> None: ...


ESTIMATORS = ("pass_mean_median", "call_median", "call_min", "trimmed_mean")


@dataclass(frozen=True)
class GpuProtocol:
    """How a model is timed on the GPU.

    - `warmup`: untimed calls after compilation (the first calls build pipelines and upload).
    - `warmup_s`: then keep calling, untimed, for this many seconds. The GPU's clocks follow its
      load: after the idle gap of a compilation, a model timed within a few milliseconds can
      run 2-3x slower than the same model a second later (see docs/measurement.md). Models
      timed right after another (a batch) had the GPU busy just before and get `rewarm_s`.
    - `passes` passes of back-to-back calls, each pass closed by one read-back (module doc).
    - `calls`: the least number of calls in a pass; with `pass_ms` > 0 a pass holds as many
      calls as fill about `pass_ms` milliseconds (estimated by one calibration pass after the
      warm-up), at most `max_calls`, so that the read-back's jitter is small against the pass.
    - `estimator`: which of `ESTIMATORS` is reported as the latency.
    - `trim`: fraction cut from each end for `trimmed_mean`.
    - `interleave`: time pass k of every model of a batch before pass k + 1 of any (spreads a
      drift over all of them); off by default because the first call after switching models
      is slow (about 1 ms on the H100), which biases short passes upwards.
    """

    warmup: int = 10
    warmup_s: float = 0.0
    rewarm_s: float = 0.0
    passes: int = 5
    calls: int = 10
    pass_ms: float = 10.0
    max_calls: int = 4000
    estimator: str = "pass_mean_median"
    trim: float = 0.1
    interleave: bool = False

    def __post_init__(self) -> None:
        if min(self.warmup, self.warmup_s, self.rewarm_s) < 0 or self.passes < 1 or self.calls < 1:
            raise MeasurementError("A GPU timing protocol needs at least one pass of one call.")
        if self.max_calls < self.calls or self.pass_ms < 0:
            raise MeasurementError("max_calls must be at least calls, and pass_ms not negative.")
        if self.estimator not in ESTIMATORS:
            raise MeasurementError(f"Unknown estimator {self.estimator!r}; use one of "
                                   f"{', '.join(ESTIMATORS)}.")
        if not 0.0 <= self.trim < 0.5:
            raise MeasurementError("The trimmed fraction must be in [0, 0.5).")

    def calls_per_pass(self, per_call_ms: float) -> int:
        """Calls in each pass for a model whose back-to-back call takes `per_call_ms`."""
        if self.pass_ms <= 0:
            return self.calls
        if per_call_ms <= 0:
            return self.max_calls
        return int(min(max(self.calls, math.ceil(self.pass_ms / per_call_ms)), self.max_calls))

    def as_dict(self) -> dict:
        return {"warmup": self.warmup, "warmup_s": self.warmup_s, "rewarm_s": self.rewarm_s,
                "passes": self.passes, "calls": self.calls,
                "pass_ms": self.pass_ms, "max_calls": self.max_calls,
                "estimator": self.estimator, "trim": self.trim, "interleave": self.interleave}


@dataclass(frozen=True)
class PassTimes:
    """One pass, in ns: each call's time, the whole pass (calls + closing read-back), and one
    more read-back once the GPU is idle, which is the transfer cost to take out of the total."""

    calls_ns: tuple[int, ...]
    total_ns: int
    idle_read_ns: int = 0

    @property
    def mean_ns(self) -> float:
        """Per-call time over the pass: waits for the queued GPU work, not for the transfer."""
        return max(self.total_ns - self.idle_read_ns, 0) / len(self.calls_ns)


@dataclass(frozen=True)
class Estimates:
    """A timed model in milliseconds: every estimator, the spread, and the chosen latency."""

    latency_ms: float
    iqr_ms: float
    min_ms: float
    n_runs: int
    pass_mean_median_ms: float
    call_median_ms: float
    trimmed_mean_ms: float
    pass_means_ms: tuple[float, ...]

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def estimate(passes: Sequence[PassTimes], protocol: GpuProtocol) -> Estimates:
    """Summarise timed passes with every estimator; `protocol.estimator` picks the latency."""
    passes = [p for p in passes if p.calls_ns]
    if not passes:
        raise MeasurementError("No timed GPU calls to summarise.")
    calls = np.concatenate([np.asarray(p.calls_ns, dtype=np.float64) for p in passes]) / 1e6
    pass_means = tuple(p.mean_ns / 1e6 for p in passes)
    q1, q3 = np.percentile(calls, [25, 75])
    values = {
        "pass_mean_median": float(np.median(pass_means)),
        "call_median": float(np.median(calls)),
        "call_min": float(calls.min()),
        "trimmed_mean": trimmed_mean(calls, protocol.trim),
    }
    return Estimates(latency_ms=values[protocol.estimator], iqr_ms=float(q3 - q1),
                     min_ms=values["call_min"], n_runs=int(calls.size),
                     pass_mean_median_ms=values["pass_mean_median"],
                     call_median_ms=values["call_median"],
                     trimmed_mean_ms=values["trimmed_mean"], pass_means_ms=pass_means)


def trimmed_mean(values: np.ndarray, trim: float) -> float:
    """Mean of the values left after cutting `trim` of them from each end (scipy's definition)."""
    from scipy.stats import trim_mean

    return float(trim_mean(values, trim))


# -- timing ---------------------------------------------------------------------------------------
Clock = Callable[[], int]


def time_pass(model: Runnable, calls: int, clock: Clock = time.perf_counter_ns) -> PassTimes:
    """`calls` back-to-back runs, each timed, then one read-back counted in the pass total."""
    times = []
    start = clock()
    for _ in range(calls):
        t0 = clock()
        model.run()
        times.append(clock() - t0)
    model.sync()
    total = clock() - start
    t0 = clock()
    model.sync()
    return PassTimes(calls_ns=tuple(times), total_ns=total, idle_read_ns=clock() - t0)


def time_models(models: Sequence[Runnable], protocol: GpuProtocol,
                clock: Clock = time.perf_counter_ns) -> list[list[PassTimes]]:
    """For each model: warm up, size the passes, time them back to back. With
    `protocol.interleave`: warm every model up first, then pass k of each before pass k + 1."""
    if not protocol.interleave:
        out = []
        for i, model in enumerate(models):  # warmed right before its passes
            size = _warm_up(model, protocol, clock, first=i == 0)
            out.append([time_pass(model, size, clock) for _ in range(protocol.passes)])
        return out
    sizes = [_warm_up(model, protocol, clock, first=i == 0) for i, model in enumerate(models)]
    passes: list[list[PassTimes]] = [[] for _ in models]
    for _ in range(protocol.passes):
        for i, model in enumerate(models):
            passes[i].append(time_pass(model, sizes[i], clock))
    return passes


def _warm_up(model: Runnable, protocol: GpuProtocol, clock: Clock, first: bool = True) -> int:
    """Untimed calls, then (with `pass_ms`) one calibration pass; returns calls per pass."""
    for _ in range(protocol.warmup):
        model.run()
    model.sync()
    deadline = clock() + (protocol.warmup_s if first else protocol.rewarm_s) * 1e9
    while clock() < deadline:  # sustained load, read back now and then so the queue stays short
        for _ in range(20):
            model.run()
        model.sync()
    if protocol.pass_ms <= 0:
        return protocol.calls
    return protocol.calls_per_pass(time_pass(model, protocol.calls, clock).mean_ns / 1e6)
