"""The interleaved timing protocol: a batch of loaded models timed round-robin, low quantiles.

On the shared 2-core VM a model timed to completion in one block inherits whatever its
neighbours did during those seconds (a plain median-of-30 retested at 8.7% MdAPE, the old
`latpred profile` at 11.9%). Here a batch of models (`InterleavedProtocol.batch_size`, plus the
drift reference) is loaded in one worker process and timed in rounds: each round gives every
model that is not yet stable one short block of runs, so a burst of interference spoils one
block of one round, not a whole model, and each model's runs are spread over the batch's time.

A block is `block_warmup` untimed runs (the other models evicted this one's weights from the
caches) and then `pairs` pairs of runs: one with LiteRT's profiler recording per-operator events
(the kernels' times) and one with it stopped (the end to end: recording costs 0.1-0.25 ms a run).
Both come from the same block, so per-kernel and end-to-end figures see the same conditions;
the per-run sum of the operators is kept too (`op_sum`). The estimator
(`latpred.profile.estimators`, the minimum by default) is recomputed over all runs after each
round; a model stops once it and the summed per-operator estimators moved by less than
`tolerance` / `kernel_tolerance` over the last `window` rounds and its fastest run was matched
(within `agree_tolerance`) by the fastest run of `agree_rounds` rounds, after `min_rounds` and
at most `max_rounds` rounds. The agreement guards against a minimum that one lucky round set
while the others ran slowed: on 24 models timed twice beside other users' jobs, per-round minima
of one model ranged over 15-28 ms, and a minimum seen in a single round did not come back.

`measure_batch` is what a `Worker` process runs (a crash takes one batch down; the campaign then
re-measures that batch's models one by one). `run_rounds` is the loop itself, over any objects
with `warm()`, `plain()` and `profiled()`, so tests drive it with fake timings.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol as TypingProtocol, Sequence

import numpy as np

from latpred.errors import LatpredError, MeasurementError
from latpred.profile.estimators import DEFAULT_ESTIMATOR, check_estimator, estimate, is_stable

OpKey = tuple[int, str, str]  # (operator or node index, name, source) as litert_profiler has it


@dataclass(frozen=True)
class InterleavedProtocol:
    """How a batch is timed (see the module docstring). Times in seconds, tolerances fractions.

    `pairs`: profiled + plain pairs per block, as many as fill `block_s` (estimated from the
    warm-up), between `min_pairs` and `max_pairs`.
    """

    batch_size: int = 12
    warmup: int = 3
    warmup_s: float = 0.02
    block_warmup: int = 1
    block_s: float = 0.12
    min_pairs: int = 3
    max_pairs: int = 20
    min_rounds: int = 4
    max_rounds: int = 12
    window: int = 2
    tolerance: float = 0.005
    kernel_tolerance: float = 0.01
    agree_rounds: int = 2
    agree_tolerance: float = 0.01
    estimator: str = DEFAULT_ESTIMATOR

    def __post_init__(self) -> None:
        check_estimator(self.estimator)
        if self.batch_size < 1 or self.min_pairs < 1 or self.max_pairs < self.min_pairs:
            raise MeasurementError("An interleaved protocol needs batch_size >= 1 and "
                                   "1 <= min_pairs <= max_pairs.")
        if not 1 <= self.min_rounds <= self.max_rounds or self.window < 1:
            raise MeasurementError("An interleaved protocol needs 1 <= min_rounds <= max_rounds "
                                   "and window >= 1.")
        if self.warmup < 1 or self.block_warmup < 0:
            raise MeasurementError("An interleaved protocol needs at least one warm-up run.")

    def pairs_for(self, run_s: float) -> int:
        """Pairs per block for a model whose single run takes about `run_s` seconds."""
        fit = int(self.block_s / (2 * run_s)) if run_s > 0 else self.max_pairs
        return max(self.min_pairs, min(fit, self.max_pairs))

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class ModelRounds:
    """What the rounds measured of one model, raw (microseconds).

    Per round: `plain_us` the wall clock of the runs with the profiler stopped, `profiled_us`
    of the profiled runs, `op_us` their per-operator readings (runs x operators, in the order of
    `op_keys`). `stopped`: "stable", "cap" (max_rounds reached) or "" with `error`.
    `started` / `finished`: Unix times of its first and last block.
    """

    error: str = ""
    op_keys: tuple[OpKey, ...] = ()
    plain_us: tuple[np.ndarray, ...] = ()
    profiled_us: tuple[np.ndarray, ...] = ()
    op_us: tuple[np.ndarray, ...] = ()
    stopped: str = ""
    started: float = 0.0
    finished: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.plain_us)


class TimedModel(TypingProtocol):
    """What `run_rounds` needs of a loaded model."""

    def warm(self) -> float: ...                                  # one untimed run; seconds
    def plain(self) -> float: ...                                 # wall us, profiler stopped
    def profiled(self) -> tuple[float, tuple[OpKey, ...], tuple[float, ...]]: ...


@dataclass
class _Track:
    """Mutable per-model state of one batch, private to `run_rounds`."""

    model: Any
    pairs: int = 0
    keys: tuple[OpKey, ...] | None = None
    plain: list[np.ndarray] = field(default_factory=list)
    profiled: list[np.ndarray] = field(default_factory=list)
    ops: list[np.ndarray] = field(default_factory=list)
    e2e_history: list[float] = field(default_factory=list)
    op_history: list[float] = field(default_factory=list)
    error: str = ""
    stopped: str = ""
    started: float = 0.0
    finished: float = 0.0

    def result(self) -> ModelRounds:
        return ModelRounds(error=self.error, op_keys=self.keys or (), plain_us=tuple(self.plain),
                           profiled_us=tuple(self.profiled), op_us=tuple(self.ops),
                           stopped=self.stopped, started=self.started, finished=self.finished)


def run_rounds(models: Sequence[Any], protocol: InterleavedProtocol,
               errors: Sequence[str] = ()) -> list[ModelRounds]:
    """Warm up every model, then time them round-robin until each is stable or capped.

    `models[i]` may be None with `errors[i]` saying why it could not be loaded.
    """
    tracks = [_Track(m, error=(errors[i] if i < len(errors) else "") if m is None else "")
              for i, m in enumerate(models)]
    for t in tracks:
        if t.model is not None:
            _guard(t, lambda t=t: _warm_up(t, protocol))
    for r in range(protocol.max_rounds):
        active = [t for t in tracks if t.model is not None and not t.error and not t.stopped]
        if not active:
            break
        for t in active:
            _guard(t, lambda t=t: _block(t, protocol))
            if t.error:
                continue
            enough = r + 1 >= protocol.min_rounds
            if enough and is_stable(t.e2e_history, protocol.tolerance, protocol.window) and \
                    is_stable(t.op_history, protocol.kernel_tolerance, protocol.window) and \
                    _agree(t.plain, protocol.agree_rounds, protocol.agree_tolerance):
                t.stopped = "stable"
            elif r + 1 == protocol.max_rounds:
                t.stopped = "cap"
    return [t.result() for t in tracks]


def _agree(rounds: list[np.ndarray], k: int, tolerance: float) -> bool:
    """Whether the `k` fastest rounds' fastest runs lie within `tolerance` of each other."""
    if k <= 1:
        return True
    mins = sorted(float(r.min()) for r in rounds if r.size)
    return len(mins) >= k and mins[k - 1] <= mins[0] * (1 + tolerance)


def _guard(track: _Track, step) -> None:
    """Run one step of one model; an error of the runtime fails that model only."""
    try:
        step()
    except LatpredError as err:
        track.error = str(err)
    except Exception as err:  # the runtime's own errors: that model fails, the batch goes on
        first = str(err).splitlines()[0] if str(err) else ""
        track.error = f"{type(err).__name__}: {first}"


def _warm_up(t: _Track, protocol: InterleavedProtocol) -> None:
    start, n, last = time.perf_counter(), 0, 0.0
    while n < protocol.warmup or time.perf_counter() - start < protocol.warmup_s:
        last = t.model.warm()
        n += 1
    t.pairs = protocol.pairs_for(last)


def _block(t: _Track, protocol: InterleavedProtocol) -> None:
    if not t.started:
        t.started = time.time()
    for _ in range(protocol.block_warmup):
        t.model.warm()
    plain, profiled, ops = [], [], []
    for _ in range(t.pairs):
        wall, keys, readings = t.model.profiled()
        if t.keys is None:
            if not keys:
                raise MeasurementError("LiteRT's profiler reported no operator events.")
            t.keys = tuple(keys)
        elif tuple(keys) != t.keys:
            raise MeasurementError("LiteRT's profiler reported different ops on two runs.")
        profiled.append(wall)
        ops.append(readings)
        plain.append(t.model.plain())
    t.plain.append(np.asarray(plain, dtype=np.float64))
    t.profiled.append(np.asarray(profiled, dtype=np.float64))
    t.ops.append(np.asarray(ops, dtype=np.float64).reshape(len(ops), len(t.keys)))
    t.finished = time.time()
    est = protocol.estimator
    t.e2e_history.append(estimate(np.concatenate(t.plain), est))
    every = np.concatenate(t.ops, axis=0)
    t.op_history.append(float(sum(estimate(every[:, j], est) for j in range(every.shape[1]))))


# -- LiteRT ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchRequest:
    """A batch for the worker: the models' bytes and how to run them (see `CpuRequest`)."""

    models: tuple[bytes, ...] = field(repr=False)
    protocol: InterleavedProtocol = InterleavedProtocol()
    threads: int = 1
    cpus: tuple[int, ...] | None = None
    realtime: bool = False
    seed: int = 0


class _LiteRtModel:
    """A `litert_profiler` session seen as a `TimedModel`."""

    def __init__(self, model: bytes, threads: int, seed: int) -> None:
        from latpred.profile.litert_capi import Session

        self.session = Session(model, threads, seed)

    def warm(self) -> float:
        wall_ns, _, _ = self.session.run()
        return wall_ns / 1e9

    def plain(self) -> float:
        wall_ns, _, _ = self.session.run()
        return wall_ns / 1e3

    def profiled(self) -> tuple[float, tuple[OpKey, ...], tuple[float, ...]]:
        from latpred.profile.litert_capi import op_events

        wall_ns, _, _, events = self.session.profiled_run()
        ops = op_events(events)
        return wall_ns / 1e3, tuple(k for k, _ in ops), tuple(float(us) for _, us in ops)

    def close(self) -> None:
        self.session.close()


def measure_batch(request: BatchRequest) -> list[ModelRounds]:
    """What a `Worker` process runs: load every model of the batch, pinned and (when asked and
    allowed) under SCHED_FIFO, and time them with `run_rounds`."""
    from latpred.profile.litert_capi import library
    from latpred.profile.litert_cpu import REALTIME_PRIORITY

    library()  # a missing LiteRT fails the batch, not each model as if it were broken
    if request.cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(request.cpus))
    previous = (os.sched_getscheduler(0), os.sched_getparam(0))
    loaded: list[Any] = []
    errors: list[str] = []
    try:
        if request.realtime:  # before the sessions, so that XNNPACK's threads inherit it
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            except OSError:
                pass
        for data in request.models:
            try:
                loaded.append(_LiteRtModel(data, request.threads, request.seed))
                errors.append("")
            except LatpredError as err:
                loaded.append(None)
                errors.append(str(err))
        return run_rounds(loaded, request.protocol, errors)
    finally:
        for m in loaded:
            if m is not None:
                m.close()
        os.sched_setscheduler(0, *previous)
