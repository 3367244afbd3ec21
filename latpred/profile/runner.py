"""The profile loop: measure models end to end and per kernel into a Dataset, resumably.

Two timing protocols (`RunOptions.protocol`, recorded in the manifest as `timing_protocol`):
"interleaved" (the default with XNNPACK: batches of models timed round-robin, a low-quantile
estimator, sequential stopping, a drift reference and retests at the start and the end; see
`campaign.py` and `interleaved.py`) and "sequential" (below: one model to completion after the
other, the median of pass medians; kept for builtin kernels, isolated kernel timing and for
resuming datasets measured with it).

For each model (a .tflite with its architecture .json beside it), per kernel `deduce` finds for
the target, in one of two ways (`RunOptions.kernel_timing`, recorded in the manifest):

- "in_context" (the default; XNNPACK only): one session of LiteRT's profiler over the whole
  model (`litert_profiler.profile_request`); a kernel's time is the sum of its ops' in-context
  times (`op_attribution`), the model's the same session's runs with the profiler stopped.
  Kernel times then add up to ~98% (94-99%) of the end to end, as the paper's benchmark_model
  op profiles do; timed alone as sub-models they added up to only ~83% (61-113%).
- "isolated": time the whole model, then each kernel as its own sub-model, measuring each
  distinct configuration (sub-model bytes hash) once per target. Builtin kernels always run
  this way (the profiler's per-op events come from the XNNPACK delegate).

Either way a kernel row's `config_hash` is its sub-model's hash (in context, only a grouping
key). Every measurement goes through a `Worker`, so a crash or a hang is a `failed`/`timeout`
row and the run goes on.

Resuming: a model's kernel rows are appended before its model row, and a model with a model row
is skipped on the next run; rows are keyed, so a model re-measured after a kill between the two
appends replaces its kernel rows instead of duplicating them (see `latpred.dataset`). At the end
a random 5% of the models are measured again and the median test-retest difference goes to the
manifest as the noise floor.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from latpred.dataset import Dataset
from latpred.errors import LatpredError, MeasurementError
from latpred.profile.entries import ModelEntry, load_entries, load_entry, model_paths  # noqa: F401 (API)
from latpred.profile.interleaved import InterleavedProtocol, measure_batch
from latpred.profile.kernels import kernel_row
from latpred.profile.litert_cpu import (REALTIME_PRIORITY, CpuRequest, measure_litert_cpu,
                                        pinned_cpus, realtime_allowed)
from latpred.profile.litert_profiler import profile_request, profiled_runs
from latpred.profile.machine import machine_fields
from latpred.profile.noise import measure_noise
from latpred.profile.op_attribution import kernel_stats, model_stats
from latpred.profile.prepare import _Prepared, _prepare
from latpred.profile.protocol import Protocol, TimingStats
from latpred.profile.worker import Outcome, Worker


@dataclass(frozen=True)
class CpuMeasurer:
    """How the host CPU measures a model: LiteRT with `kernels`, `threads`, pinned `cpus`.

    `fn` is the function the worker runs on a `CpuRequest` in "isolated" kernel timing (returns
    `TimingStats`), `profile_fn` the one for "in_context" (returns an `OpProfile`); tests swap
    in ones that crash or hang. They must be top-level functions (the worker imports them).
    """

    threads: int = 1
    kernels: str = "xnnpack"
    protocol: Protocol = Protocol()
    cpus: tuple[int, ...] | None = None
    realtime: bool = False
    fn: Callable[[Any], TimingStats] = measure_litert_cpu
    profile_fn: Callable[[Any], Any] = profile_request
    interleaved: InterleavedProtocol = InterleavedProtocol()
    batch_fn: Callable[[Any], Any] = measure_batch

    def request(self, model: bytes) -> CpuRequest:
        return CpuRequest(model=model, threads=self.threads, kernels=self.kernels,
                          protocol=self.protocol, cpus=self.cpus, realtime=self.realtime)

    def manifest(self) -> dict[str, Any]:
        from latpred.profile.litert_cpu import runtime_version

        return {"runtime": "litert", "runtime_version": runtime_version(),
                "cpu_kernels": self.kernels, "threads": self.threads,
                "pinned_cpus": list(self.cpus) if self.cpus else None,
                "scheduling": f"SCHED_FIFO {REALTIME_PRIORITY}" if self.realtime else "normal",
                "warmup": self.protocol.warmup, "repeats": self.protocol.min_runs,
                "protocol": self.protocol.as_dict()}


def cpu_measurer(target, kernels: str = "xnnpack", protocol: Protocol = Protocol(),
                 pin: bool = True, realtime: bool = True,
                 interleaved: InterleavedProtocol = InterleavedProtocol()) -> CpuMeasurer:
    """The measurer for a host CPU target: its thread count, pinned to the last cores, under
    SCHED_FIFO where this process is allowed to (the manifest says which)."""
    threads = int(getattr(target, "threads", 1) or 1)
    return CpuMeasurer(threads=threads, kernels=kernels, protocol=protocol,
                       cpus=pinned_cpus(threads) if pin else None,
                       realtime=realtime and realtime_allowed(), interleaved=interleaved)


KERNEL_TIMINGS = {
    "in_context": "each kernel's latency is the sum of its ops' times from LiteRT's profiler "
                  "during whole-model runs (XNNPACK operator events; IQR: sum of the ops' IQRs, "
                  "an upper bound; min: sum of their minimums, a lower bound); the model's "
                  "latency comes from the same session's runs with the profiler stopped",
    "isolated": "each kernel is timed alone as a sub-model, each distinct configuration once "
                "per target; the model is timed on its own",
}


@dataclass(frozen=True)
class RunOptions:
    """Knobs of a profile run that are not the measurement itself.

    `kernel_timing`: "in_context" or "isolated" (see the module docstring). `protocol`:
    "interleaved" or "sequential"; with interleaved, the drift reference is timed once in every
    `drift_every` models (0: never) and a reference that moves by more than `drift_bound_pct`
    percent flags the campaign; `retest_fraction` of the models is retested at start and end.
    """

    per_kernel: bool = True
    retest_fraction: float = 0.05
    seed: int = 0
    timeout_s: float = 300.0
    compact: bool = True
    kernel_timing: str = "in_context"
    protocol: str = "interleaved"
    drift_every: int = 12
    drift_bound_pct: float = 3.0
    input_shapes: Any = None    # `--input-shape`: every model is measured at these shapes

    def __post_init__(self) -> None:
        if self.protocol not in ("interleaved", "sequential"):
            raise LatpredError(f"Unknown timing protocol {self.protocol!r}; use interleaved or "
                               "sequential.")
        if self.kernel_timing not in KERNEL_TIMINGS:
            raise LatpredError(f"Unknown kernel timing {self.kernel_timing!r}; use one of "
                               f"{', '.join(KERNEL_TIMINGS)}.")


def kernel_timing(options: RunOptions, measurer: CpuMeasurer) -> tuple[str, str]:
    """The kernel timing a run uses, and a note when it is not the one asked for."""
    if options.kernel_timing == "in_context" and measurer.kernels != "xnnpack":
        return "isolated", (f"in-context timing needs XNNPACK: {measurer.kernels} kernels are "
                            "timed in isolation")
    return options.kernel_timing, ""


def timing_manifest(mode: str, note: str, measurer: CpuMeasurer,
                    protocol: str = "sequential") -> dict[str, Any]:
    """The manifest fields that say how kernels (and models) were timed."""
    fields: dict[str, Any] = {"kernel_timing": mode, "timing_protocol": protocol,
                              "kernel_timing_description": KERNEL_TIMINGS[mode]}
    if note:
        fields["kernel_timing_note"] = note
    if protocol == "interleaved":
        p = measurer.interleaved
        fields.update(protocol=p.as_dict(), warmup=p.warmup, estimator=p.estimator,
                      repeats=p.min_rounds * p.min_pairs)  # the fewest plain runs of a model
    elif mode == "in_context":
        fields["repeats"] = profiled_runs(measurer.protocol)
    return fields


@dataclass
class RunReport:
    """What a run did (counts, wall time, noise figures): printed by the CLI."""

    models_measured: int = 0
    models_skipped: int = 0
    models_failed: int = 0
    kernels_measured: int = 0
    kernels_reused: int = 0
    wall_s: float = 0.0
    kernel_timing: str = "isolated"
    noise: dict = field(default_factory=dict)
    drift: dict = field(default_factory=dict)

    def summary(self) -> str:
        """One paragraph for the command line."""
        rate = self.models_measured / self.wall_s * 60 if self.wall_s > 0 else 0.0
        noise = ", ".join(f"{k}={v}" for k, v in self.noise.items()) or "not measured"
        kernels = (f"{self.kernels_measured} kernels timed in context"
                   if self.kernel_timing == "in_context" else
                   f"{self.kernels_measured} kernel configurations measured, "
                   f"{self.kernels_reused} reused")
        text = (f"{self.models_measured} models measured ({self.models_failed} failed), "
                f"{self.models_skipped} already in the dataset; {kernels}; {self.wall_s:.1f} s "
                f"({rate:.1f} models/min). Noise floor: {noise}.")
        spread = self.drift.get("range_pct")
        if spread is not None:
            text += (f" Drift reference: {len(self.drift.get('series', []))} timings, range "
                     f"{spread:.2f}%" + (f" > {self.drift['bound_pct']:g}%: DRIFT FLAGGED in the "
                                         "manifest (see `latpred dataset drift-correct`)."
                                         if self.drift.get("flagged") else "."))
        return text


def stats_fields(outcome: Outcome) -> dict[str, Any]:
    """status / latency columns of a row from one measurement's outcome."""
    if outcome.ok:
        s: TimingStats = outcome.value
        return {"status": "ok", "latency_ms": s.median_ms, "latency_iqr_ms": s.iqr_ms,
                "latency_min_ms": s.min_ms, "n_runs": s.n_runs}
    return {"status": outcome.status, "latency_ms": math.nan, "latency_iqr_ms": math.nan,
            "latency_min_ms": math.nan, "n_runs": 0}


def open_dataset(out: str | os.PathLike, target_name: str, measurer_fields: dict) -> Dataset:
    """Open (or create) the dataset and record this target's measuring setup in the manifest."""
    root = Path(out)
    ds = Dataset.open(root) if (root / "manifest.json").exists() else \
        Dataset.create(root, name=root.name)
    entry = ds.manifest.get("targets", {}).get(target_name, {})
    _check_same_timing(ds, target_name, entry, measurer_fields.get("kernel_timing"))
    _check_same_protocol(ds, target_name, entry, measurer_fields.get("timing_protocol"))
    fields = {**machine_fields(), **measurer_fields}
    if "date" not in entry:
        fields["date"] = time.strftime("%Y-%m-%d")
    if "noise" not in entry:
        fields["noise"] = {"e2e_retest_mdape": None, "kernel_retest_mdape": None, "n_retest": 0}
    ds.update_manifest(target_name, **fields)
    return ds


def _check_same_timing(ds: Dataset, target_name: str, entry: dict, mode: str | None) -> None:
    """One dataset target, one kernel timing: in-context and isolated kernel times differ by
    design (~98% vs ~83% of the end to end), so a resumed run may not mix them."""
    # Targets measured before in-context timing existed were timed in isolation.
    had = entry.get("kernel_timing") or ("isolated" if ds.measured_ids(target_name) else None)
    if mode and had and had != mode:
        flag = had.replace("_", "-")
        raise LatpredError(f"{target_name} in {ds.root} was profiled with {flag} kernel timing; "
                           f"resume it with --kernel-timing {flag} or use a new dataset.")


def _check_same_protocol(ds: Dataset, target_name: str, entry: dict, protocol: str | None) -> None:
    """One dataset target, one timing protocol (their estimators differ by ~9%)."""
    had = entry.get("timing_protocol") or ("sequential" if ds.measured_ids(target_name) else None)
    if protocol and had and had != protocol:
        raise LatpredError(f"{target_name} in {ds.root} was profiled with the {had} protocol; "
                           f"resume it with --protocol {had} or use a new dataset.")


def profile_models(paths: Sequence[str | os.PathLike], target, out: str | os.PathLike,
                   measurer: CpuMeasurer | None = None, options: RunOptions = RunOptions(),
                   progress: bool = True) -> RunReport:
    """Measure `paths` on `target` into the dataset at `out`; resumes an interrupted run."""
    from tqdm import tqdm

    started = time.perf_counter()
    if getattr(target, "processor", "cpu") != "cpu":
        raise MeasurementError(f"latpred profile measures on this machine's CPU; {target} is a "
                               "GPU target.")
    if getattr(target, "runtime", "litert") != "litert":
        raise MeasurementError(f"{target} runs {target.runtime}, not LiteRT on this machine: "
                               "measure it there with benchmark_model and `latpred "
                               "import-benchmark`.")
    measurer = measurer or cpu_measurer(target)
    target_name = str(target)
    entries = load_entries(paths)
    mode, note = kernel_timing(options, measurer)
    in_context = mode == "in_context"
    protocol = options.protocol if in_context else "sequential"
    ds = open_dataset(out, target_name, {**measurer.manifest(),
                                         **timing_manifest(mode, note, measurer, protocol),
                                         "precision": getattr(target, "precision", "fp32")})
    done = ds.measured_ids(target_name)
    cache = {} if in_context else \
        {h: _stats_dict(s) for h, s in ds.config_cache(target_name).items()}
    report = RunReport(models_skipped=sum(e.model_id in done for e in entries),
                       kernel_timing=mode)
    todo = [e for e in entries if e.model_id not in done]
    if protocol == "interleaved":
        from latpred.profile.campaign import run_interleaved

        with Worker(measurer.batch_fn, timeout_s=options.timeout_s) as worker:
            run_interleaved(entries, target, ds, worker, measurer, options, report, progress)
        return _finish(ds, options, report, started)
    fn = measurer.profile_fn if in_context else measurer.fn
    with Worker(fn, timeout_s=options.timeout_s) as worker:
        bar = tqdm(todo, desc=f"profile {target_name}", unit="model", disable=not progress,
                   dynamic_ncols=True)
        for entry in bar:
            if in_context:
                _profile_in_context(entry, target, ds, worker, measurer, options, report)
            else:
                _profile_one(entry, target, ds, worker, measurer, cache, options, report)
            bar.set_postfix(kernels=report.kernels_measured, reused=report.kernels_reused,
                            failed=report.models_failed)
        bar.close()
        report.noise = measure_noise(entries, target, ds, worker, measurer, options, progress,
                                     in_context=in_context)
    return _finish(ds, options, report, started)


def _finish(ds: Dataset, options: RunOptions, report: RunReport, started: float) -> RunReport:
    if options.compact:
        ds.compact()
    report.wall_s = time.perf_counter() - started
    return report


def _stats_dict(stats) -> dict[str, Any]:
    return {"status": stats.status, "latency_ms": stats.latency_ms,
            "latency_iqr_ms": stats.latency_iqr_ms, "latency_min_ms": stats.latency_min_ms,
            "n_runs": stats.n_runs}


def _profile_one(entry: ModelEntry, target, ds: Dataset, worker: Worker, measurer, cache: dict,
                 options: RunOptions, report: RunReport) -> None:
    """Isolated kernel timing: the model, then each new kernel configuration as a sub-model."""
    prep = _prepare(entry, target, options)
    outcome = (Outcome("failed", error=prep.error) if prep.error
               else worker.call(measurer.request(prep.data)))
    krows = []
    for plan in prep.plans:
        if plan.config_hash not in cache:
            cache[plan.config_hash] = stats_fields(worker.call(measurer.request(plan.model_bytes)))
            report.kernels_measured += 1
        else:
            report.kernels_reused += 1
        krows.append(kernel_row(entry.model_id, str(target), plan, cache[plan.config_hash]))
    _write(ds, report, prep, krows, stats_fields(outcome), outcome.error, prep.note)


def _profile_in_context(entry: ModelEntry, target, ds: Dataset, worker: Worker, measurer,
                        options: RunOptions, report: RunReport) -> None:
    """In-context kernel timing: one profiled session gives the model and all its kernels."""
    prep = _prepare(entry, target, options)
    outcome = (Outcome("failed", error=prep.error) if prep.error
               else worker.call(measurer.request(prep.data)))
    if not outcome.ok:
        _write(ds, report, prep, [], stats_fields(outcome), outcome.error, prep.note)
        return
    krows, note = [], prep.note
    if prep.plans:
        try:
            stats = kernel_stats(prep.graph, [plan.kernel for plan in prep.plans], outcome.value)
        except LatpredError as err:  # the model's time stands; its kernels cannot be split out
            note = f"kernels not measured: {err}"
        else:
            krows = [kernel_row(entry.model_id, str(target), plan, s)
                     for plan, s in zip(prep.plans, stats)]
            report.kernels_measured += len(krows)
    _write(ds, report, prep, krows, model_stats(outcome.value), "", note)


def _write(ds: Dataset, report: RunReport, prep: _Prepared, krows: list[dict], stats: dict,
           *errors: str) -> None:
    if krows:  # kernels first: a model with a model row counts as done
        ds.append_kernels(pd.DataFrame(krows))
    row = {**prep.row, **stats, "error": "; ".join(e for e in errors if e)}
    ds.append_models(pd.DataFrame([row]))
    report.models_measured += 1
    report.models_failed += stats["status"] != "ok"
