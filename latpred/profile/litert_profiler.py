"""Per-operation timings measured inside the whole model, from LiteRT's own profiler.

ai-edge-litert's Python API has no profiler, but its libLiteRt.so exports the C API's: a
CompiledModel made with the runtime option `enable_profiling = true` owns a profiler, and the
XNNPACK delegate then records one event per XNNPACK operator and run (ops left to TFLite's own
kernels: one per op); `litert_capi` binds that path for the CPU accelerator. XNNPACK reports
whole microseconds, truncated, and its operators tile the delegate's run (each runs from the
previous one's end to its own).

`profile_ops` times the operators and the same runs end to end;
`op_attribution.attribute_to_graph` maps the operators onto a Graph's ops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from scipy.stats import trim_mean

from latpred.errors import MeasurementError
from latpred.profile.litert_capi import INVOKE_EVENT, Session, op_events

# Profiled runs per model at least: per-op statistics need more runs than an end to end (an op
# of a few microseconds reads in whole microseconds).
MIN_PROFILED_RUNS = 50


@dataclass(frozen=True)
class OpTiming:
    """One operator as the profiler reports it, over the timed runs.

    `index`: XNNPACK operator index (source "xnnpack") or TFLite node index (source "tflite").
    `name`: as reported, e.g. "Convolution (NHWC, F32) IGEMM" or "CONV_2D".
    `median_us`/`iqr_us`: of the raw integer-microsecond readings. `mean_us`: the mean of the
    middle half of the readings, plus 0.5 us for XNNPACK's, undoing on average its truncation to
    whole microseconds (a 3.7 us op reads 3) so that small operators are not biased low; prefer
    it for sums. `min_us`: the smallest reading, with the same +0.5 us.
    """

    index: int
    name: str
    source: str
    median_us: float
    iqr_us: float
    mean_us: float
    n_runs: int
    min_us: float = float("nan")


@dataclass(frozen=True)
class OpProfile:
    """What `profile_ops` measured: per-operator timings and the same runs' end to end.

    `e2e_*_us`: wall clock around `LiteRtRunCompiledModel` (buffer sync included), as a
    benchmark would time a run. `invoke_median_us`: the interpreter's own Invoke event.
    `plain_e2e_median_us`: the same, of runs interleaved with the profiled ones but with the
    profiler stopped: recording the events costs about 0.1-0.25 ms a run on the host, so this
    is the end to end that the operators' times should add up to; `plain_e2e_iqr_us`,
    `plain_e2e_min_us` and `plain_n_runs` describe those runs (clean ones when there are enough,
    as for the profiled runs).
    `n_runs`: the runs the statistics come from: those not preempted when they are at least a
    quarter of the runs (and 3), else all of them.
    Per timed run: `run_e2e_us` its wall clock, `run_op_sum_us` the raw sum of its operator
    readings, `run_cpu_us` the calling thread's CPU time (with one thread XNNPACK runs on it, so
    this is the run's time without preemption), `run_preempted` whether another process took
    the CPU meanwhile. On a shared host, compare clean runs only.
    """

    ops: tuple[OpTiming, ...]
    e2e_median_us: float
    e2e_iqr_us: float
    invoke_median_us: float
    n_runs: int
    threads: int
    plain_e2e_median_us: float = float("nan")
    plain_e2e_iqr_us: float = float("nan")
    plain_e2e_min_us: float = float("nan")
    plain_n_runs: int = 0
    run_e2e_us: tuple[float, ...] = ()
    run_op_sum_us: tuple[float, ...] = ()
    run_cpu_us: tuple[float, ...] = ()
    run_preempted: tuple[bool, ...] = ()

    @property
    def op_sum_us(self) -> float:
        """Sum of the operators' `mean_us`."""
        return float(sum(op.mean_us for op in self.ops))


def profile_ops(model: bytes, threads: int = 1, runs: int = 50, warmup: int = 5,
                seed: int = 0) -> OpProfile:
    """Profile every operator of a .tflite model inside the whole model on the host CPU.

    Each of the `runs` timed runs (after `warmup` untimed ones) is profiled on its own: the
    profiler is reset, started, the model run, the events read; then one run with the profiler
    stopped is timed. Runs whose operator list differs
    from the first's (it never should) raise `MeasurementError`.
    """
    if runs < 1 or warmup < 0 or threads < 1:
        raise MeasurementError("profile_ops needs runs >= 1, warmup >= 0 and threads >= 1.")
    session = Session(model, threads, seed)
    try:
        for _ in range(warmup):
            session.run()
        return _timed_runs(session, runs, threads)
    finally:
        session.close()


def profile_request(request) -> OpProfile:
    """What a `Worker` process runs: `profile_ops` on a `litert_cpu.CpuRequest`, pinned to its
    CPUs and, when asked and allowed, under SCHED_FIFO, as `measure_litert_cpu` does (a crash in
    the native library then takes the worker down, not the caller)."""
    from latpred.profile.litert_cpu import REALTIME_PRIORITY

    if request.kernels != "xnnpack":
        raise MeasurementError("In-context op profiling runs LiteRT's CPU accelerator (XNNPACK).")
    if request.cpus is not None:
        os.sched_setaffinity(0, set(request.cpus))
    previous = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        if request.realtime:  # set before the session so XNNPACK's threads inherit it
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            except OSError:
                pass  # not allowed here: measure at normal priority, as measure_litert_cpu does
        return profile_ops(request.model, threads=request.threads, seed=request.seed,
                           runs=profiled_runs(request.protocol),
                           warmup=request.protocol.warmup)
    finally:
        os.sched_setscheduler(0, *previous)


def profiled_runs(protocol) -> int:
    """How many profiled runs `profile_request` makes under a timing `protocol`."""
    return max(MIN_PROFILED_RUNS, protocol.min_runs)


def _timed_runs(session: Session, runs: int, threads: int) -> OpProfile:
    per_run, invoke, plain = [], [], []
    for _ in range(runs):
        wall_ns, cpu_ns, switched, events = session.profiled_run()
        ops = op_events(events)
        per_run.append((wall_ns / 1e3, cpu_ns / 1e3, switched, ops))
        invoke += [us for kind, _, us, _ in events if kind == INVOKE_EVENT]
        plain_ns, _, plain_switched = session.run()  # profiler stopped: no recording cost
        plain.append((plain_ns / 1e3, plain_switched))
    keys = [key for key, _ in per_run[0][3]]
    if not keys:
        raise MeasurementError("LiteRT's profiler reported no operator events.")
    if any([key for key, _ in ops] != keys for *_, ops in per_run):
        raise MeasurementError("LiteRT's profiler reported different ops on two runs.")
    # On a shared host another process often takes the CPU mid-run and the stall lands in
    # whichever op was running: summarise the clean runs when there are enough of them.
    clean = [run for run in per_run if not run[2]]
    used = clean if len(clean) >= max(3, runs // 4) else per_run
    timings = tuple(_timing(key, [ops[k][1] for *_, ops in used]) for k, key in enumerate(keys))
    q1, med, q3 = np.percentile([wall for wall, *_ in used], [25, 50, 75])
    clean_plain = [wall for wall, switched in plain if not switched]
    plain_used = clean_plain if len(clean_plain) >= max(3, runs // 4) else [w for w, _ in plain]
    return OpProfile(
        ops=timings, e2e_median_us=float(med), e2e_iqr_us=float(q3 - q1),
        plain_e2e_median_us=float(np.median(plain_used)),
        plain_e2e_iqr_us=float(np.subtract(*np.percentile(plain_used, [75, 25]))),
        plain_e2e_min_us=float(np.min(plain_used)), plain_n_runs=len(plain_used),
        invoke_median_us=float(np.median(invoke)) if invoke else float("nan"),
        n_runs=len(used), threads=threads, run_e2e_us=tuple(wall for wall, *_ in per_run),
        run_op_sum_us=tuple(float(sum(us for _, us in ops)) for *_, ops in per_run),
        run_cpu_us=tuple(cpu for _, cpu, _, _ in per_run),
        run_preempted=tuple(switched for _, _, switched, _ in per_run))


def _timing(key: tuple[int, str, str], values: list[int]) -> OpTiming:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    # The middle half's mean: robust to preemption spikes (one 8 ms stall in 50 runs would add
    # 160 us to a plain mean), yet finer than the median of whole microseconds.
    # XNNPACK truncates each reading to whole microseconds; TFLite's own events are differences
    # of two truncated timestamps, unbiased on average.
    bias = 0.5 if key[2] == "xnnpack" else 0.0
    return OpTiming(index=key[0], name=key[1], source=key[2], median_us=float(med),
                    iqr_us=float(q3 - q1), mean_us=float(trim_mean(values, 0.25)) + bias,
                    n_runs=len(values), min_us=float(min(values)) + bias)
