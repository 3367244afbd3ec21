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
from latpred.profile.entries import ModelEntry, load_entries
from latpred.profile.runner import RunReport, open_dataset

OUTPUTS_DIR = "benchmark_model"


def profile_adb(paths: Sequence[str | os.PathLike], target, out: str | os.PathLike,
                serial: str, binary: str = DEFAULT_BINARY, kernels: str = "xnnpack",
                runs: int = 50, warmup: int = 5, timeout_s: float = 300.0, adb: str = "adb",
                progress: bool = True) -> RunReport:
    """Measure `paths` on the phone `serial` for `target` into the dataset at `out`."""
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
    for entry in bar:
        try:
            _measure_one(entry, device, target, out, keep, binary, kernels, runs, warmup, cpus,
                         timeout_s, report)
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
