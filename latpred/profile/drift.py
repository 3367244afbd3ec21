"""Drift of the measuring machine over a campaign: a reference model, its series, a correction.

A shared VM's speed follows its neighbours: a quiet re-measure of the zoo read 5.9% faster than
the campaign that made the dataset. The interleaved campaign (`campaign.py`) therefore times a
fixed reference model (`reference_model`, built in code, so every campaign on every machine
times the same bytes) inside every `drift_every` models' batch, with the same protocol as the
models beside it, and records its series in the manifest (target entry `drift`):

    {"reference": "builtin:drift-ref-v1", "reference_hash": sha256, "every_models": int,
     "bound_pct": float, "estimator": str,
     "series": [{"t": Unix time, "ms": estimate, "models_done": int, "phase": str}, ...],
     "range_pct": (max - min) / median of the series in percent, "flagged": range > bound}

`drift_correct` (`latpred dataset drift-correct`) is an optional, documented step: it writes a
copy of a dataset whose labels are divided by the reference's interpolated relative speed at each
model's `measured_at` (reference(t) / median of the series), so the whole campaign reads as if
measured at the reference's median state (or, with `reference_ms`, at one fixed state shared by
several campaigns: their labels then compare across campaigns). It assumes that a slow-down
scales every model alike;
the raw labels stay in the source dataset and the copy's rows keep a `drift_factor` column.

A Ray farm's series (`farm_drift_entry`) holds each device's readings (`device`): each model is
corrected through its own device's series (`farm_device`), all devices to one level (the
median of every reading, or `reference_ms`), so the correction also takes out the devices'
differences in speed. A device with one reading has a constant factor.
"""

from __future__ import annotations

import hashlib
import math
import os
from functools import cache
from typing import Any

import numpy as np

from latpred.errors import DatasetError

REFERENCE_NAME = "builtin:drift-ref-v1"
DEFAULT_BOUND_PCT = 3.0


@cache
def reference_model() -> bytes:
    """The built-in reference: a small synthetic-CNN-like model, about 2-4 ms on the host."""
    from latpred.builder import GraphBuilder
    from latpred.tflite import write_tflite

    b = GraphBuilder(name="drift-ref-v1")
    x = b.input((1, 112, 112, 16))
    y = b.conv2d(x, 32, 3, activation="RELU6")
    y = b.depthwise_conv2d(y, 3, activation="RELU6")
    y = b.add(y, b.conv2d(y, 32, 1))
    y = b.conv2d(y, 64, 3, stride=2, activation="RELU")
    y = b.depthwise_conv2d(y, 5, activation="RELU")
    y = b.conv2d(y, 96, 3, stride=2, activation="RELU")
    y = b.mean(y, keep_dims=False)
    b.output(b.softmax(b.fully_connected(y, 100)))
    return write_tflite(b.build(), precision="fp32", seed=0)


def reference_hash() -> str:
    return hashlib.sha256(reference_model()).hexdigest()


def summarize_drift(series: list[dict[str, Any]], bound_pct: float) -> dict[str, Any]:
    """`range_pct` and `flagged` of a series (None / False with fewer than two points)."""
    values = [float(p["ms"]) for p in series if p.get("ms") and not math.isnan(p["ms"])]
    if len(values) < 2:
        return {"range_pct": None, "flagged": False}
    spread = (max(values) - min(values)) / float(np.median(values)) * 100.0
    return {"range_pct": round(spread, 3), "flagged": bool(spread > bound_pct)}


def drift_entry(series: list[dict[str, Any]], every: int, bound_pct: float,
                estimator: str | None) -> dict[str, Any]:
    """The manifest's `drift` entry of a campaign's series (`estimator`: what each reading is;
    None leaves the key out)."""
    entry = {"reference": REFERENCE_NAME, "reference_hash": reference_hash(),
             "every_models": every, "bound_pct": bound_pct, "estimator": estimator,
             "series": series, **summarize_drift(series, bound_pct)}
    if estimator is None:
        del entry["estimator"]
    return entry


def farm_drift_entry(readings: list[dict[str, Any]], every: int,
                     bound_pct: float) -> dict[str, Any]:
    """The `drift` entry of a Ray farm whose devices read the reference once a batch of `every`
    models: every reading (with its device), and per device its readings' median and range;
    `range_pct` and `flagged` are the largest device's (the spread between devices is
    `device_spread_pct`, which `drift_correct` also takes out)."""
    by_device: dict[str, list] = {}
    for point in readings:
        by_device.setdefault(point["device"], []).append(point)
    per_device = {dev: {"readings": len(points),
                        "median_ms": round(float(np.median([p["ms"] for p in points])), 6),
                        **summarize_drift(points, bound_pct)}
                  for dev, points in sorted(by_device.items())}
    ranges = [d["range_pct"] for d in per_device.values() if d["range_pct"] is not None]
    medians = [d["median_ms"] for d in per_device.values()]
    spread = ((max(medians) - min(medians)) / float(np.median(medians)) * 100.0
              if len(medians) > 1 else 0.0)
    return {**drift_entry(readings, every, bound_pct, None), "devices": per_device,
            "range_pct": max(ranges) if ranges else None,
            "flagged": any(d["flagged"] for d in per_device.values()),
            "device_spread_pct": round(spread, 3)}


def drift_factors(series: list[dict[str, Any]], times: np.ndarray,
                  reference_ms: float | None = None) -> np.ndarray:
    """The reference's relative speed at each of `times`: its series interpolated linearly in
    time (constant beyond the ends), over the series' median (or over `reference_ms`, a fixed
    machine state shared by several campaigns). 1.0 where a time is NaN."""
    points = sorted((float(p["t"]), float(p["ms"])) for p in series
                    if p.get("ms") and not math.isnan(p["ms"]))
    if len(points) < 2:
        raise DatasetError("The drift series has fewer than two reference measurements; there "
                           "is nothing to correct by.")
    t, v = np.array(points).T
    level = float(np.median(v)) if reference_ms is None else float(reference_ms)
    factors = np.interp(np.asarray(times, dtype=np.float64), t, v) / level
    return np.where(np.isnan(times), 1.0, factors)


def _device_factors(series: list[dict[str, Any]], times: np.ndarray, devices,
                    reference_ms: float | None, where: str) -> np.ndarray:
    """A farm's factors: each model's through its own device's readings (`drift_factors`, or
    the one reading's ratio), over one level for all devices (every reading's median, or
    `reference_ms`)."""
    readings = [p for p in series if p.get("ms") and not math.isnan(p["ms"])]
    level = (float(reference_ms) if reference_ms is not None
             else float(np.median([float(p["ms"]) for p in readings])))
    if devices is None:
        raise DatasetError(f"{where}: the drift series is a farm's, by device, but the models "
                           "do not say which device measured them (farm_device).")
    devices = np.asarray(devices, dtype=object)
    factors = np.ones(len(times))
    for dev in sorted(set(devices.tolist())):
        own = [p for p in readings if p.get("device") == dev]
        mine = devices == dev
        if not own:
            raise DatasetError(f"{where}: {int(mine.sum())} models were measured on {dev}, "
                               "which has no drift reading; measure them again (or leave out "
                               "the correction).")
        if len(own) == 1:
            factors[mine] = float(own[0]["ms"]) / level
        else:
            factors[mine] = drift_factors(own, times[mine], level)
    return factors


_SCALED = ("latency_ms", "latency_iqr_ms", "latency_min_ms")


def drift_correct(source: str | os.PathLike, out: str | os.PathLike,
                  targets: tuple[str, ...] = (),
                  reference_ms: float | None = None) -> dict[str, dict[str, float]]:
    """Write a drift-corrected copy of the dataset at `source` to `out` (a new directory).

    Every target with a drift series (or only `targets`) is corrected; other rows are copied as
    they are. By default a campaign is brought to its own median state; with `reference_ms`,
    to the state in which the reference model reads that many ms, so that campaigns measured
    at different times (same reference, same machine) are on one scale. Returns per corrected
    target the smallest and largest factor applied.
    """
    if reference_ms is not None and not reference_ms > 0:
        raise DatasetError(f"The reference latency must be positive, not {reference_ms}.")
    from latpred.dataset import Dataset

    src = Dataset.open(source)
    entries = src.manifest.get("targets", {})
    chosen = list(targets) or [t for t, e in entries.items() if e.get("drift", {}).get("series")]
    if not chosen:
        raise DatasetError(f"No target of {src.root} has a drift series; measure it with the "
                           "interleaved protocol and a drift reference.")
    for t in chosen:
        if entries.get(t, {}).get("combined_from"):
            raise DatasetError(f"Target {t} of {src.root} is a median of several campaigns; "
                               "drift-correct each campaign before combining them.")
        if t not in entries:
            raise DatasetError(f"{src.root} has no target {t!r}; it has {', '.join(entries)}.")
        if not entries[t].get("drift", {}).get("series"):
            raise DatasetError(f"Target {t} of {src.root} has no drift series.")
    models, kernels = src.models(), src.kernels()
    factor = np.ones(len(models))
    applied: dict[str, dict[str, float]] = {}
    for t in chosen:
        rows = (models["target"] == t).to_numpy()
        if "measured_at" not in models.columns:
            raise DatasetError(f"{src.root} has no measured_at column: its models were not "
                               "timed by the interleaved protocol.")
        series = entries[t]["drift"]["series"]
        times = models.loc[rows, "measured_at"].to_numpy(np.float64)
        if any("device" in p for p in series):
            f = _device_factors(series, times, models.loc[rows].get("farm_device"),
                                reference_ms, f"{src.root} ({t})")
        else:
            f = drift_factors(series, times, reference_ms)
        factor[rows] = f
        applied[t] = {"min_factor": round(float(f.min()), 5), "max_factor": round(float(f.max()), 5)}
    models = models.assign(drift_factor=factor)
    by_key = dict(zip(zip(models["model_id"], models["target"]), factor))
    kfactor = np.array([by_key.get(k, 1.0) for k in zip(kernels["model_id"], kernels["target"])])
    kernels = kernels.assign(drift_factor=kfactor)
    for col in _SCALED:
        models[col] = models[col] / models["drift_factor"]
        kernels[col] = kernels[col] / kernels["drift_factor"]
    dst = Dataset.create(out, name=f"{src.manifest.get('name', src.root.name)}-drift-corrected")
    for t, entry in entries.items():
        extra = ({"drift_corrected": {"source": str(src.root), "reference_ms": reference_ms,
                                      **applied[t]}}
                 if t in applied else {})
        dst.update_manifest(t, **entry, **extra)
    dst.append_kernels(kernels)
    dst.append_models(models)
    dst.compact()
    return applied
