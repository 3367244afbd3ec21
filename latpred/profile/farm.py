"""Profiling farms on Ray: one campaign spread over the devices of a cluster.

`profile_on_ray` (behind `latpred profile --ray ADDRESS`) finds the devices the cluster's nodes
declare (`farm_device`: custom resources `latpred-cpu-<cores>` and `latpred-adb-<serial>`),
starts one actor per device that fits the target, pinned to the node that declares it and
holding the device's resource, and hands out batches of models to whichever actor is free. The
driver is the dataset's only writer: a batch's rows are appended (kernels first, then models,
each part written atomically) when its actor returns them, so a batch whose node dies is simply
handed to another device, and nothing is stored twice. A model counts as done once its model
row is written, so a campaign whose driver or whole cluster went away resumes with the same
command.

Retest: a seeded sample (`RunOptions.retest_fraction`) of the models is measured again at the
end, each on a different device than the one that labelled it when there are several (the
manifest's `noise` then holds the label-vs-retest MdAPE across devices, `retest: "farm"`).

Drift: with `RunOptions.drift_every` > 0, each device times the drift reference once with
every batch it measures (a CPU core inside the batch's rounds, a phone by `benchmark_model`
before the batch's models); the manifest's `drift` series holds every reading with its device,
and `drift` per device its own range (`drift.farm_drift_entry`). `latpred dataset
drift-correct` then brings each model to one machine state through its own device's series, so
devices of one kind that run at other speeds, or slow down at other times, are put on one scale
(`drift.drift_correct`).

Joining the cluster is `ray_cluster.connect`'s, shared with training on the same cluster
(`predictors.cluster`), which refuses to run beside a campaign that holds its devices.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from latpred.errors import LatpredError, MeasurementError
from latpred.profile.adb import DEFAULT_BINARY
from latpred.profile.drift import farm_drift_entry
from latpred.profile.farm_device import DeviceWorker, FarmDevice, model_file, parse_device
from latpred.profile.interleaved import InterleavedProtocol
from latpred.profile.runner import RunOptions, RunReport
from latpred.ray_cluster import connect as join


@dataclass(frozen=True)
class FarmOptions:
    """How the devices measure (as `latpred profile` on one machine) and how work is split.

    `batch_size`: models per actor call (default: the interleaved protocol's batch size).
    """

    kernels: str = "xnnpack"
    run: RunOptions = field(default_factory=RunOptions)
    interleaved: InterleavedProtocol = field(default_factory=InterleavedProtocol)
    realtime: bool = True
    batch_size: int | None = None
    benchmark_binary: str = DEFAULT_BINARY


def connect(address: str):
    """Join the cluster at `address` ("local": start one here, one device per core); returns
    Ray and whether this call connected (an existing connection is used as it is)."""
    return join(address, device_resources(sorted(os.sched_getaffinity(0))))


def cluster_devices(target, ray) -> list[FarmDevice]:
    """The alive nodes' devices that can run `target` (cores = its threads, or phones)."""
    devices = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        for name in node.get("Resources", {}):
            d = parse_device(name, node["NodeID"], node.get("NodeManagerAddress", ""))
            if d is None:
                continue
            if target.runtime == "litert" and d.kind == "cpu" and len(d.cpus) == target.threads:
                devices.append(d)
            elif target.runtime != "litert" and d.kind == "adb":
                devices.append(d)
    if not devices:
        want = (f"latpred-cpu-<core>[-<core>...] with {target.threads} core(s)"
                if target.runtime == "litert" else "latpred-adb-<serial>")
        raise LatpredError(f"The Ray cluster declares no device for {target}: start each node "
                           f"with `ray start --resources '{{\"{_example(target)}\": 1}}'` "
                           f"(resources named {want}).")
    return sorted(devices, key=lambda d: (d.node_ip, d.resource))


def _refuse_busy_cpus(ray) -> None:
    """A timing campaign runs alone: not while anything holds the cluster's CPUs (a training
    there, `predictors.cluster`, or other work), whose runs would slow the devices' own."""
    for _ in range(5):   # a task that just ended frees its CPU a moment later
        total = ray.cluster_resources().get("CPU", 0.0)
        free = ray.available_resources().get("CPU", 0.0)
        if free >= total:
            return
        time.sleep(0.5)
    raise MeasurementError(f"{total - free:g} of the Ray cluster's {total:g} CPUs are in use "
                           "(a training or other work); a timing campaign must run alone: "
                           "start it when they are free.")


def _example(target) -> str:
    if target.runtime != "litert":
        return "latpred-adb-SERIAL"
    return "latpred-cpu-" + "-".join(str(c) for c in range(target.threads))


def profile_on_ray(paths: Sequence[str | os.PathLike], target, out: str | os.PathLike,
                   address: str = "local", options: FarmOptions = FarmOptions(),
                   progress: bool = True,
                   on_result: Callable[[int, str, dict[str, list[str]]], None] | None = None
                   ) -> "FarmReport":
    """Measure `paths` for `target` on the devices of the Ray cluster at `address` into `out`.

    `on_result(models_done, device, in_flight)` is called after each stored batch, once the
    device that returned it has its next batch (`in_flight`: device resource -> model ids it is
    measuring), e.g. for a progress display or a test.
    """
    from latpred.profile.entries import load_entries

    from latpred.target import parse_target

    started, target = time.perf_counter(), parse_target(target)
    if target.runtime == "litert" and target.processor != "cpu":
        # said here, before a dataset is opened, not by each worker's `profile_models`
        raise MeasurementError(f"A Ray farm measures LiteRT on its nodes' CPUs (or phones over "
                               f"adb); {target} is a GPU target.")
    entries = load_entries(paths)
    ray, connected = connect(address)
    try:
        return _campaign(ray, entries, target, out, options, progress, on_result, started)
    finally:
        if connected:
            ray.shutdown()


def _campaign(ray, entries, target, out, options, progress, on_result, started) -> "FarmReport":
    _refuse_busy_cpus(ray)
    devices = cluster_devices(target, ray)
    ds = _open(out, target, options, devices)
    done = ds.measured_ids(str(target))
    todo = [e for e in entries if e.model_id not in done]
    report = FarmReport(models_skipped=len(entries) - len(todo),
                       kernel_timing=ds.manifest["targets"][str(target)].get("kernel_timing",
                                                                             "in_context"))
    farm = _Farm(ray, devices, target, options)
    size = options.batch_size or options.interleaved.batch_size
    batches = [[model_file(e.path) for e in todo[i:i + size]] for i in range(0, len(todo), size)]

    readings: list[dict[str, Any]] = list(
        ds.manifest["targets"][str(target)].get("drift", {}).get("series", []))

    def store(models, kernels, series) -> None:
        if series:         # before the rows: a stored model's device has its reading
            done = report.models_measured + len(models)       # the campaign's, as one machine's
            readings.extend({**point, "models_done": done} for point in series)
            ds.update_manifest(str(target), drift=farm_drift_entry(
                readings, size, options.run.drift_bound_pct))
        if len(kernels):
            ds.append_kernels(kernels)
        ds.append_models(models)
        report.models_measured += len(models)
        report.models_failed += int((models["status"] != "ok").sum())
        report.kernels_measured += len(kernels)

    def stored(dev: str) -> None:
        if on_result is not None:
            on_result(report.models_measured, dev, farm.in_flight())

    try:
        farm.run(batches, store, progress, f"profile {target} on {len(devices)} devices",
                 after=stored, reference=options.run.drift_every > 0)
        report.devices, report.requeued = len(devices), list(farm.requeued)
        report.devices_lost = sorted(set(d.resource for d in devices) - set(farm.alive))
        ds.update_manifest(str(target), farm_devices=farm.infos(),
                           farm_devices_lost=report.devices_lost)
        report.noise = _retest(farm, ds, target, entries, options)
    finally:
        farm.close()
    if options.run.compact:
        ds.compact()
    report.wall_s = time.perf_counter() - started
    return report


def _open(out, target, options: FarmOptions, devices: list[FarmDevice]):
    from latpred.profile.runner import (CpuMeasurer, kernel_timing, open_dataset,
                                        timing_manifest)

    fields: dict[str, Any] = {"farm": "ray", "precision": target.precision}
    if target.runtime == "litert":
        measurer = CpuMeasurer(threads=target.threads, kernels=options.kernels,
                               interleaved=options.interleaved)
        mode, note = kernel_timing(options.run, measurer)
        protocol = options.run.protocol if mode == "in_context" else "sequential"
        fields.update({**measurer.manifest(), **timing_manifest(mode, note, measurer, protocol),
                       "pinned_cpus": None})
    else:
        from latpred.profile.benchmark_import import _manifest_fields

        fields.update(_manifest_fields(target, 50))
    return open_dataset(out, str(target), fields)


@dataclass
class FarmReport(RunReport):
    """A farm run: `RunReport` plus its devices, those lost and the models handed again."""

    devices: int = 0
    devices_lost: list = field(default_factory=list)
    requeued: list = field(default_factory=list)

    def summary(self) -> str:
        text = super().summary()
        text += f" Farm: {self.devices} devices"
        if self.devices_lost:
            text += (f", {len(self.devices_lost)} lost mid-campaign "
                     f"({', '.join(self.devices_lost)}); {len(self.requeued)} models they held "
                     "were measured on another device")
        return text + "."


class _Farm:
    """The actors, their in-flight batches, and the hand-out loop."""

    def __init__(self, ray, devices: list[FarmDevice], target, options: FarmOptions) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(max_restarts=0, num_cpus=0)(DeviceWorker)
        self.ray, self.alive, self.busy = ray, {}, {}
        for d in devices:
            self.alive[d.resource] = remote.options(
                resources={d.resource: 1}, name=None,
                scheduling_strategy=NodeAffinitySchedulingStrategy(d.node_id, soft=False),
            ).remote(d, str(target), options)
        self._infos: dict[str, dict[str, Any]] = {}
        self.requeued: list[str] = []

    def in_flight(self) -> dict[str, list[str]]:
        return {dev: [m.stem for m in batch] for _, (dev, batch) in self.busy.items()}

    def infos(self) -> list[dict[str, Any]]:
        return [self._infos[k] for k in sorted(self._infos)]

    def run(self, batches: list, store: Callable, progress: bool, desc: str,
            avoid: dict[str, str] | None = None, after: Callable | None = None,
            reference: bool = False) -> None:
        """Hand `batches` out until all are stored (`store(models, kernels, drift readings)`);
        a batch whose device dies goes back in the queue. `avoid`: model stem -> a device that
        should not measure it (if others can). `after(device)`: called once a device's returned
        batch is stored and its next batch handed out. `reference`: each batch also times the
        drift reference."""
        from tqdm import tqdm

        queue, returned = list(batches), []
        bar = tqdm(total=sum(len(b) for b in batches), desc=desc, unit="model",
                   disable=not progress, dynamic_ncols=True)
        while queue or self.busy:
            for dev, actor in list(self.alive.items()):
                if dev in {d for d, _ in self.busy.values()} or not queue:
                    continue
                batch = self._pick(queue, dev, avoid)
                if batch is not None:
                    self.busy[actor.measure.remote(batch, reference)] = (dev, batch)
            while returned and after is not None:
                after(returned.pop(0))
            if not self.busy:
                raise MeasurementError(
                    f"Every device of the Ray farm is gone with {sum(map(len, queue))} models "
                    "left; the dataset keeps what was measured: run the same command to resume.")
            ready, _ = self.ray.wait(list(self.busy), num_returns=1)
            dev, batch = self.busy.pop(ready[0])
            try:
                models, kernels, series = self.ray.get(ready[0])
            except self.ray.exceptions.RayTaskError as err:
                # `measure` itself raised (a model's own failure is a failed row, so this is
                # unexpected): the device is alive, and passing the batch on would only drop
                # device after device until the campaign ended as "every device is gone".
                cause = getattr(err, "cause", None) or err
                raise MeasurementError(
                    f"Measuring a batch on {dev} raised {type(cause).__name__}: "
                    f"{str(cause).splitlines()[0] if str(cause) else ''}; the dataset keeps "
                    "what was measured: fix the cause and run the same command to resume."
                ) from None
            except self.ray.exceptions.RayError:  # the actor or its node died
                self.alive.pop(dev, None)
                queue.insert(0, batch)
                self.requeued += [m.stem for m in batch]
                continue
            self._remember(dev)
            store(models, kernels, series)
            returned.append(dev)
            bar.update(len(batch))
        bar.close()

    def _pick(self, queue: list, dev: str, avoid: dict[str, str] | None):
        if not avoid or len(self.alive) < 2:
            return queue.pop(0)
        for i, batch in enumerate(queue):
            if all(avoid.get(m.stem) != dev for m in batch):
                return queue.pop(i)
        return None

    def _remember(self, dev: str) -> None:
        if dev not in self._infos and dev in self.alive:
            try:
                self._infos[dev] = self.ray.get(self.alive[dev].info.remote(), timeout=60)
            except self.ray.exceptions.RayError:
                pass

    def close(self) -> None:
        for actor in self.alive.values():
            self.ray.kill(actor)
        self.alive.clear()


def _retest(farm: _Farm, ds, target, entries, options: FarmOptions) -> dict[str, Any]:
    """Re-measure a seeded sample on other devices; label-vs-retest figures in the manifest."""
    from latpred.profile.estimators import retest_figures
    from latpred.profile.noise import retest_sample

    name = str(target)
    models = ds.models(name)
    ok = models[models["status"] == "ok"].set_index("model_id")
    by_id = {e.model_id: e for e in entries}
    sample = [m for m in retest_sample(sorted(by_id), options.run.retest_fraction,
                                       options.run.seed) if m in ok.index]
    if not sample or not farm.alive:
        return {}
    labelled_on = ok["farm_device"].to_dict() if "farm_device" in ok.columns else {}
    avoid = {by_id[m].path.stem: labelled_on.get(m, "") for m in sample}
    again: list = []
    farm.run([[model_file(by_id[m].path)] for m in sample],
             lambda mo, ke, _: again.append((mo, ke)), False, "retest", avoid)
    kernels = ds.kernels(name).set_index(["model_id", "kernel_index"])["latency_ms"]
    e2e, kern, cross = [], [], 0
    for mo, ke in again:
        for row in mo.itertuples():
            if row.status == "ok" and row.model_id in ok.index:
                e2e.append((float(ok.loc[row.model_id, "latency_ms"]), float(row.latency_ms)))
                cross += labelled_on.get(row.model_id) != row.farm_device
        for row in ke.itertuples():
            if row.status == "ok" and (row.model_id, row.kernel_index) in kernels.index:
                kern.append((float(kernels[(row.model_id, row.kernel_index)]),
                             float(row.latency_ms)))
    fe, fk = retest_figures(e2e), retest_figures(kern)
    noise = {"e2e_retest_mdape": fe["mdape"], "e2e_retest_p90": fe["p90"],
             "kernel_retest_mdape": fk["mdape"], "kernel_retest_p90": fk["p90"],
             "n_retest": fe["n"], "retest": "farm",
             "retest_description": "label vs a re-measurement at the end of the campaign, "
                                   "on another device of the farm where there is one",
             "n_retest_on_other_device": int(cross)}
    ds.update_manifest(name, noise=noise)
    return {k: noise[k] for k in ("e2e_retest_mdape", "e2e_retest_p90", "kernel_retest_mdape",
                                  "n_retest", "n_retest_on_other_device")}


def device_resources(cores: Sequence[int], threads: int = 1) -> dict[str, float]:
    """The `resources` a node declares for its `cores`, one device per `threads` cores, e.g.
    for `ray start --resources` or `ray.init(resources=...)`."""
    cores = list(cores)
    return {"latpred-cpu-" + "-".join(map(str, cores[i:i + threads])): 1
            for i in range(0, len(cores) - threads + 1, threads)}

