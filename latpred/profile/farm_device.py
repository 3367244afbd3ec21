"""One device of a Ray profiling farm: what it is, and what its actor does with a batch.

A node of the cluster declares each of its devices as a Ray custom resource of quantity 1:

- `latpred-cpu-<c>[-<c>...]`: host CPU cores (`latpred-cpu-0`, or `latpred-cpu-2-3` for a
  two-thread target), measured with LiteRT like `latpred profile` does on one machine;
- `latpred-adb-<serial>`: a phone attached to that node, measured over adb (`adb_campaign`).

`DeviceWorker` is the plain class a Ray actor wraps (one actor per device, placed on the node
that declares it and holding its resource, so no two actors share a device). Each call measures
a batch of models into a scratch dataset on its node and returns the rows, with the drift
reference's reading when asked (one per batch: the driver keeps each device's series, so a farm's
labels can be drift-corrected device by device, `drift.drift_correct`); only the driver writes
the campaign's dataset.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

_CPU = re.compile(r"^latpred-cpu-(\d+(?:-\d+)*)$")
_ADB = re.compile(r"^latpred-adb-(.+)$")


@dataclass(frozen=True)
class FarmDevice:
    """A device a node declares: its resource name, node, and CPU cores or adb serial."""

    resource: str
    node_id: str
    node_ip: str = ""
    cpus: tuple[int, ...] = ()
    serial: str = ""

    @property
    def kind(self) -> str:
        return "adb" if self.serial else "cpu"


def parse_device(resource: str, node_id: str, node_ip: str = "") -> FarmDevice | None:
    """The device a resource name declares, or None for other resources."""
    if m := _CPU.match(resource):
        return FarmDevice(resource, node_id, node_ip, cpus=tuple(int(c) for c in
                                                                  m.group(1).split("-")))
    if m := _ADB.match(resource):
        return FarmDevice(resource, node_id, node_ip, serial=m.group(1))
    return None


@dataclass(frozen=True)
class ModelFile:
    """A model as sent to a device: its file stem, bytes and architecture JSON (if any)."""

    stem: str
    data: bytes
    arch_json: str | None = None


class DeviceWorker:
    """Measures batches on one device (see the module docstring); `options` is a FarmOptions."""

    def __init__(self, device: FarmDevice, target_name: str, options) -> None:
        self.device, self.target_name, self.options = device, target_name, options
        if device.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(device.cpus))  # the actor itself stays on its cores

    def info(self) -> dict[str, Any]:
        from latpred.profile.machine import cpu_id, cpu_model

        return {"device": self.device.resource, "node_ip": self.device.node_ip,
                "cpu_model": cpu_model(), "cpu_id": cpu_id(), "pid": os.getpid()}

    def measure(self, models: list[ModelFile], reference: bool = False
                ) -> tuple[Any, Any, list[dict[str, Any]]]:
        """(model rows, kernel rows, drift readings) of `models` measured on this device; with
        `reference`, the drift reference is timed once with the batch (readings: series points,
        each with this device's resource): on a CPU device inside the batch's interleaved
        rounds, on a phone by `benchmark_model` before the batch's models, as they are."""
        from latpred.dataset import Dataset
        from latpred.target import parse_target

        target = parse_target(self.target_name)
        with tempfile.TemporaryDirectory(prefix="latpred-farm-") as tmp:
            paths = []
            for m in models:
                path = Path(tmp) / f"{m.stem}.tflite"
                path.write_bytes(m.data)
                if m.arch_json is not None:
                    path.with_suffix(".json").write_text(m.arch_json)
                paths.append(path)
            out = Path(tmp) / "dataset"
            if self.device.kind == "adb":
                self._measure_adb(paths, target, out, reference)
            else:
                self._measure_cpu(paths, target, out, reference)
            ds = Dataset.open(out)
            series = ds.manifest["targets"][self.target_name].get("drift", {}).get("series", [])
            models_df = ds.models(self.target_name).assign(farm_device=self.device.resource)
            readings = [{**point, "device": self.device.resource} for point in series]
            return models_df, ds.kernels(self.target_name), readings

    def _measure_adb(self, paths, target, out, reference: bool) -> None:
        from latpred.profile.adb_campaign import profile_adb

        o = self.options
        profile_adb(paths, target, out, self.device.serial, binary=o.benchmark_binary,
                    kernels=o.kernels, timeout_s=o.run.timeout_s, progress=False,
                    drift_every=len(paths) if reference else 0, drift_at_end=False)

    def _measure_cpu(self, paths, target, out, reference: bool) -> None:
        from latpred.profile.runner import CpuMeasurer, profile_models
        from latpred.profile.litert_cpu import realtime_allowed

        o = self.options
        measurer = CpuMeasurer(threads=target.threads, kernels=o.kernels, cpus=self.device.cpus,
                               realtime=o.realtime and realtime_allowed(),
                               interleaved=o.interleaved)
        # Retests are the driver's business (across devices); the drift reference is timed once,
        # with the batch's first models, where the driver asks for it
        run = replace(o.run, retest_fraction=0.0, compact=False,
                      drift_every=len(paths) if reference else 0)
        profile_models(paths, target, out, measurer, run, progress=False)


def model_file(path: Path) -> ModelFile:
    """What a device needs of a model file: its stem, bytes and architecture JSON."""
    meta = path.with_suffix(".json")
    return ModelFile(path.stem, path.read_bytes(),
                     meta.read_text() if meta.is_file() else None)

