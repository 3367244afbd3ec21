"""The noise floor of the sequential protocol: re-measure a random sample at the end of a run.

(The interleaved protocol retests its sample at the start and at the end: `campaign.py`.)

The median absolute percentage difference between the first measurement and the re-measurement
(end to end, and per kernel of the sampled models) bounds what any accuracy figure on this
dataset can mean; it is written to the manifest's `noise` entry. With isolated kernel timing the
kernels are compared per configuration (sub-model), re-timed alone; in context each sampled model
is profiled again and its kernels are compared per (model_id, kernel_index).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from latpred.errors import LatpredError
from latpred.profile.kernels import kernel_plans
from latpred.profile.prepare import model_bytes
from latpred.profile.protocol import retest_mdape

if TYPE_CHECKING:
    from latpred.dataset import Dataset
    from latpred.profile.worker import Worker


def retest_sample(ids: list[str], fraction: float, seed: int) -> list[str]:
    """A seeded random `fraction` of `ids` (at least one when there are any)."""
    if not ids or fraction <= 0:
        return []
    k = min(len(ids), max(1, round(fraction * len(ids))))
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(sorted(ids), size=k, replace=False).tolist())


def measure_noise(entries, target, ds: "Dataset", worker: "Worker", measurer, options,
                  progress: bool = True, in_context: bool = False) -> dict:
    """Re-measure a sample of the given models that measured ok; record and return the noise.

    `worker` runs `measurer.profile_fn` when `in_context`, else `measurer.fn`.
    """
    target_name = str(target)
    models = ds.models(target_name)
    ok = models[models["status"] == "ok"].set_index("model_id")["latency_ms"].to_dict()
    by_id = {e.model_id: e for e in entries if e.model_id in ok}
    sample = retest_sample(list(by_id), options.retest_fraction, options.seed)
    if not sample:
        return {}
    if in_context:
        e2e, kern = _in_context_pairs(sample, by_id, ok, target, ds, worker, measurer, options,
                                      progress)
    else:
        e2e, kern = _isolated_pairs(sample, by_id, ok, target, ds, worker, measurer, options,
                                    progress)
    noise = {"e2e_retest_mdape": _round(retest_mdape(e2e)),
             "kernel_retest_mdape": _round(retest_mdape(kern)), "n_retest": len(e2e)}
    ds.update_manifest(target_name, noise=noise)
    return noise


def _isolated_pairs(sample, by_id, ok, target, ds, worker, measurer, options, progress):
    """(first, again) latencies: each model end to end, each kernel configuration alone."""
    from tqdm import tqdm

    cache = {h: s for h, s in ds.config_cache(str(target)).items() if s.status == "ok"}
    e2e, kern, seen = [], [], set()
    for model_id in tqdm(sample, desc="noise floor", unit="model", disable=not progress):
        data = model_bytes(by_id[model_id].path, options.input_shapes)
        again = worker.call(measurer.request(data))
        if again.ok:
            e2e.append((ok[model_id], again.value.median_ms))
        if not options.per_kernel:
            continue
        for plan in _plans(data, target):
            first = cache.get(plan.config_hash)
            if first is None or plan.config_hash in seen:
                continue
            seen.add(plan.config_hash)
            again = worker.call(measurer.request(plan.model_bytes))
            if again.ok:
                kern.append((first.latency_ms, again.value.median_ms))
    return e2e, kern


def _in_context_pairs(sample, by_id, ok, target, ds, worker, measurer, options, progress):
    """(first, again) latencies from one new profile of each model: its end to end and each of
    its kernels, paired by (model_id, kernel_index)."""
    from tqdm import tqdm

    from latpred.profile.op_attribution import kernel_stats, model_stats

    kernels = ds.kernels(str(target))
    kernels = kernels[kernels["status"] == "ok"]
    first = kernels.set_index(["model_id", "kernel_index"])["latency_ms"].to_dict()
    e2e, kern = [], []
    for model_id in tqdm(sample, desc="noise floor", unit="model", disable=not progress):
        data = model_bytes(by_id[model_id].path, options.input_shapes)
        again = worker.call(measurer.request(data))
        if not again.ok:
            continue
        e2e.append((ok[model_id], model_stats(again.value)["latency_ms"]))
        if not options.per_kernel:
            continue
        graph, found = _kernels(data, target)
        try:
            stats = kernel_stats(graph, found, again.value) if found else []
        except LatpredError:
            continue
        kern += [(first[(model_id, k)], s["latency_ms"]) for k, s in enumerate(stats)
                 if (model_id, k) in first]
    return e2e, kern


def _kernels(data: bytes, target):
    """The model's graph and the kernels `deduce` finds for `target` (none if it cannot)."""
    from latpred.deduce import deduce
    from latpred.tflite import read_tflite

    try:
        graph = read_tflite(data)
        return graph, deduce(graph, target)
    except LatpredError:
        return None, []


def _plans(data: bytes, target):
    from latpred.tflite import read_tflite

    try:
        return kernel_plans(read_tflite(data), target, with_features=False)
    except LatpredError:
        return []


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 3)
