"""`latpred profile --adb SERIAL`: measure models on a phone, resumably and crash-safely.

For each model not yet in the dataset for the target: push it, run `benchmark_model` with op
profiling (`adb.benchmark_args`: delegate, precision, threads; `taskset` with the target's
cores), pull the CSV, keep the printed log and the CSV under `<out>/benchmark_model/`, and store
them through `import-benchmark`'s path (`benchmark_import.import_benchmark`: kernel rows first,
the model row last, each an atomic append). A model whose run fails (the tool crashed, its
output does not fit the model) becomes a failed row, as with the host profiler. A device that
disconnects stops the campaign with one sentence; what was stored stays, and the same command
resumes with the next model (a model interrupted mid-way is measured again, and the dataset's
last-row-wins keys keep it from being duplicated).

Drift: a phone warms up and throttles over a campaign. Every `drift_every` models (and before
the first, and after the last) the built-in drift reference (`drift.reference_model`) is timed
the same way; its series goes in the manifest's `drift`, as the host profiler's, so `latpred
dataset drift-correct` can bring the campaign to one state (each row's `measured_at` is the
middle of its run).
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from latpred.errors import LatpredError
from latpred.profile.adb import (DEFAULT_BINARY, REMOTE_DIR, AdbDevice, DeviceDisconnected,
                                 benchmark_args, benchmark_command, core_mask)
from latpred.profile.benchmark_import import _manifest_fields, import_benchmark
from latpred.profile.drift import DEFAULT_BOUND_PCT, drift_entry, reference_model
from latpred.profile.entries import ModelEntry, load_entries
from latpred.profile.runner import RunReport, open_dataset

OUTPUTS_DIR = "benchmark_model"


def profile_adb(paths: Sequence[str | os.PathLike], target, out: str | os.PathLike,
                serial: str, binary: str = DEFAULT_BINARY, kernels: str = "xnnpack",
                runs: int = 50, warmup: int = 5, timeout_s: float = 300.0, adb: str = "adb",
                progress: bool = True, drift_every: int = 12,
                drift_bound_pct: float = DEFAULT_BOUND_PCT, drift_at_end: bool = True
                ) -> RunReport:
    """Measure `paths` on the phone `serial` for `target` into the dataset at `out`; the drift
    reference before every `drift_every` models (0: never) and, with `drift_at_end`, after the
    last."""
    from tqdm import tqdm

    from latpred.target import parse_target

    started, target = time.perf_counter(), parse_target(target)
    if target.processor not in ("cpu", "gpu"):
        raise LatpredError(f"{target} is not a phone target: adb runs TFLite's CPU or GPU "
                           "delegate.")
    device = AdbDevice(serial, adb)
    device.check_attached()
    device.check_binary(binary)
    cpus = core_mask(target, device.cpu_groups(), serial) if target.processor == "cpu" else None
    entries = load_entries(paths)
    target_name = str(target)
    example = benchmark_command(binary, benchmark_args(target, "MODEL", "CSV", kernels, runs,
                                                       warmup), cpus)
    ds = open_dataset(out, target_name, {
        **_manifest_fields(target, runs), "adb_serial": serial, "benchmark_binary": binary,
        "benchmark_command": example, "pinned_cpus": list(cpus) if cpus else None,
        "cpu_kernels": kernels if target.processor == "cpu" else None})
    done = ds.measured_ids(target_name)
    todo = [e for e in entries if e.model_id not in done]
    report = RunReport(models_skipped=len(entries) - len(todo), kernel_timing="in_context")
    keep = Path(out) / OUTPUTS_DIR
    keep.mkdir(exist_ok=True)
    device.shell(f"mkdir -p {REMOTE_DIR}")
    bar = tqdm(todo, desc=f"profile {target_name} on {serial}", unit="model",
               disable=not progress, dynamic_ncols=True)
    # the reference's outputs stay with its scratch dataset, not among the models'
    drift = _Drift(ds, target_name, drift_every, drift_bound_pct,
                   lambda entry, at: _measure_one(entry, device, target, at, at.parent, binary,
                                                  kernels, runs, warmup, cpus, timeout_s,
                                                  RunReport()))
    for k, entry in enumerate(bar):
        try:
            if drift_every and k % drift_every == 0:
                drift.read("start" if k == 0 else "main", len(done) + k)
            _measure_one(entry, device, target, out, keep, binary, kernels, runs, warmup, cpus,
                         timeout_s, report)
            if drift_every and drift_at_end and k == len(todo) - 1:
                drift.read("end", len(done) + k + 1)
        except DeviceDisconnected:
            bar.close()
            left = len(todo) - report.models_measured
            raise DeviceDisconnected(
                f"Device {serial} disconnected with {left} of {len(todo)} models left; the "
                f"dataset keeps the {report.models_measured} measured: reconnect it and run the "
                "same command to resume.") from None
        bar.set_postfix(kernels=report.kernels_measured, failed=report.models_failed)
    bar.close()
    ds.compact()
    report.wall_s = time.perf_counter() - started
    return report


def _measure_one(entry: ModelEntry, device: AdbDevice, target, out, keep: Path, binary: str,
                 kernels: str, runs: int, warmup: int, cpus, timeout_s: float,
                 report: RunReport) -> None:
    remote = f"{REMOTE_DIR}/{entry.model_id}"
    log, csv = keep / f"{entry.model_id}.txt", keep / f"{entry.model_id}.csv"

    def fail(status: str, error: str) -> None:
        if not device.attached():
            raise DeviceDisconnected(device.serial)
        _failed_row(entry, target, out, status, error)
        report.models_measured += 1
        report.models_failed += 1

    pushed = device.call("push", str(entry.path), f"{remote}.tflite", timeout_s=timeout_s)
    if not pushed.ok:
        return fail("failed", f"adb push failed: {pushed.error_line()}")
    line = benchmark_command(binary, benchmark_args(target, f"{remote}.tflite", f"{remote}.csv",
                                                    kernels, runs, warmup), cpus)
    started = time.time()
    run = device.shell(line, timeout_s=timeout_s)
    measured_at = (started + time.time()) / 2
    if run.returncode == 124 and not run.stdout:
        return fail("timeout", f"benchmark_model gave no result within {timeout_s:g} s")
    if not run.ok:
        return fail("failed", f"benchmark_model failed: {run.error_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        pulled = device.call("pull", f"{remote}.csv", str(Path(tmp) / "op.csv"),
                             timeout_s=timeout_s)
        if not pulled.ok:
            return fail("failed", f"adb pull failed: {pulled.error_line()}")
        _write_atomic(log, run.stdout)
        _write_atomic(csv, (Path(tmp) / "op.csv").read_text(errors="replace"))
    device.shell(f"rm -f {remote}.tflite {remote}.csv")
    try:
        imported = import_benchmark([log, csv], entry.path, target, out, measured_at)
    except LatpredError as err:  # the output does not fit the model: a failed row, not the end
        return fail("failed", str(err))
    report.models_measured += 1
    report.kernels_measured += imported.kernels


class _Drift:
    """The campaign's drift series: the reference timed on the phone as a model is
    (`measure(entry, dataset)`), each reading appended to the manifest's `drift`."""

    def __init__(self, ds, target_name: str, every: int, bound_pct: float, measure) -> None:
        self.ds, self.target_name, self.every, self.bound_pct = ds, target_name, every, bound_pct
        self.measure = measure
        self.series = list(ds.manifest["targets"][target_name].get("drift", {}).get("series", []))

    def read(self, phase: str, models_done: int) -> None:
        from latpred.dataset import Dataset

        with tempfile.TemporaryDirectory(prefix="latpred-drift-") as tmp:
            path = Path(tmp) / "drift-ref-v1.tflite"
            path.write_bytes(reference_model())
            self.measure(load_entries([path])[0], Path(tmp) / "dataset")
            row = Dataset.open(Path(tmp) / "dataset").models(self.target_name).iloc[0]
        if row["status"] != "ok":     # a failed reference run: no reading, the models go on
            return
        self.series.append({"t": round(float(row["measured_at"]), 2),
                            "ms": round(float(row["latency_ms"]), 6),
                            "models_done": models_done, "phase": phase})
        self.ds.update_manifest(self.target_name, drift=drift_entry(
            self.series, self.every, self.bound_pct, "benchmark_model's average"))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _failed_row(entry: ModelEntry, target, out, status: str, error: str) -> None:
    from latpred.dataset import Dataset

    data = entry.path.read_bytes()
    Dataset.open(out).append_models(pd.DataFrame([{
        "model_id": entry.model_id, "space": entry.space, "seed": entry.seed, "arch": entry.arch,
        "file_hash": hashlib.sha256(data).hexdigest(), "target": str(target), "status": status,
        "latency_ms": math.nan, "latency_iqr_ms": math.nan, "latency_min_ms": math.nan,
        "n_runs": 0, "error": error}]))
