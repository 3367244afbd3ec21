"""Profiling farms on Ray: a two-node cluster on this machine, one actor per device, a node
killed mid-campaign. Skipped when Ray (the optional extra `latpred[ray]`) is not installed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from latpred.builder import GraphBuilder  # noqa: E402
from latpred.dataset import Dataset  # noqa: E402
from latpred.errors import LatpredError  # noqa: E402
from latpred.profile import farm  # noqa: E402
from latpred.profile.farm import (FarmOptions, cluster_devices, device_resources,  # noqa: E402
                                  profile_on_ray)
from latpred.profile.drift import drift_correct  # noqa: E402
from latpred.profile.farm_device import DeviceWorker  # noqa: E402
from latpred.profile.interleaved import InterleavedProtocol  # noqa: E402
from latpred.profile.runner import RunOptions  # noqa: E402
from latpred.target import parse_target  # noqa: E402
from latpred.tflite import write_tflite  # noqa: E402

TARGET = "host/cpu/fp32/t1"
# compact=False: the parts stay as appended, so a row written twice would show.
FAST = FarmOptions(run=RunOptions(retest_fraction=0.25, timeout_s=120, compact=False),
                   interleaved=InterleavedProtocol(min_rounds=2, max_rounds=2, min_pairs=2,
                                                   max_pairs=3, block_s=0.02),
                   realtime=False, batch_size=2)


def tiny(name: str, width: int):
    b = GraphBuilder(name=name)
    x = b.input((1, 16, 16, 3), name="input")
    c = b.conv2d(x, width, 3, activation="RELU6", name="conv1")
    d = b.depthwise_conv2d(c, 3, activation="RELU6", name="dw1")
    m = b.mean(b.add(c, d, name="add1"), keep_dims=True, name="pool")
    b.output(b.fully_connected(b.reshape(m, (1, width), name="flatten"), 10, name="logits"))
    return b.build()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("models")
    paths = []
    for i in range(8):
        p = folder / f"m{i}.tflite"
        write_tflite(tiny(f"m{i}", 8 + 4 * i), p, seed=i)
        p.with_suffix(".json").write_text(json.dumps({"space": "handmade", "seed": i}))
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine, each declaring one CPU core as a device."""
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"latpred-cpu-0": 1}, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
    c.add_node(num_cpus=1, resources={"latpred-cpu-1": 1})
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def raw_ids(out: Path, table: str = "models") -> list:
    path = out / f"{table}.parquet"
    parts = [path] if path.is_file() else sorted(path.glob("part-*.parquet"))
    cols = ["model_id"] if table == "models" else ["model_id", "kernel_index"]
    rows = []
    for p in parts:
        t = pq.read_table(p, columns=cols).to_pydict()
        rows += list(zip(*[t[c] for c in cols]))
    return [r[0] for r in rows] if table == "models" else rows


def test_devices_are_the_nodes_declared_resources(cluster):
    devices = cluster_devices(parse_target(TARGET), ray)
    assert [d.resource for d in devices] == ["latpred-cpu-0", "latpred-cpu-1"]
    assert [d.cpus for d in devices] == [(0,), (1,)]
    assert len({d.node_id for d in devices}) == 2
    with pytest.raises(LatpredError, match="declares no device for host/cpu/fp32/t2"):
        cluster_devices(parse_target("host/cpu/fp32/t2"), ray)
    assert device_resources([0, 1, 2, 3], threads=2) == {"latpred-cpu-0-1": 1,
                                                         "latpred-cpu-2-3": 1}


def test_a_node_killed_mid_campaign_loses_and_duplicates_nothing(cluster, models, tmp_path,
                                                                   monkeypatch):
    out = tmp_path / "farm"
    # Marker file written by the worker node's actor once it is measuring its second batch.
    measuring = tmp_path / "latpred-cpu-1-measuring.json"
    killed: list[str] = []

    def wait_for(ready, what: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}")
            time.sleep(0.05)

    class Gated(DeviceWorker):
        """Orders the devices' batches so that the worker node is provably mid-batch when it
        is killed, whatever the two devices' speeds (on a loaded machine latpred-cpu-0 could
        otherwise measure every other batch before latpred-cpu-1 returned its first, leaving
        it nothing in flight to be killed with). latpred-cpu-1's second batch announces its
        models in `measuring` and then never finishes: its node is killed under it.
        latpred-cpu-0's second batch waits for that marker, so a batch is still queued for
        latpred-cpu-1 when its first one comes back. Defined here so that Ray ships it to
        the actors by value."""

        calls = 0

        def measure(self, batch, reference=False):
            self.calls += 1
            if self.calls == 2 and self.device.resource == "latpred-cpu-1":
                part = measuring.with_suffix(".part")  # renamed: never read half-written
                part.write_text(json.dumps([m.stem for m in batch]))
                part.replace(measuring)
                wait_for(lambda: False, "this node to be killed")
            if self.calls == 2 and self.device.resource == "latpred-cpu-0":
                wait_for(measuring.exists, "latpred-cpu-1 to measure its second batch")
            return super().measure(batch, reference)

    monkeypatch.setattr(farm, "DeviceWorker", Gated)

    def kill_second_node(done: int, device: str, in_flight: dict) -> None:
        # Called once latpred-cpu-1's first batch is stored and its second handed out: kill
        # its node as soon as its actor is measuring that second batch.
        if not killed and device == "latpred-cpu-1" and in_flight.get("latpred-cpu-1"):
            wait_for(measuring.exists, "latpred-cpu-1 to measure its second batch")
            assert json.loads(measuring.read_text()) == in_flight["latpred-cpu-1"]
            killed.extend(in_flight["latpred-cpu-1"])
            node = [n for n in cluster.worker_nodes][0]
            cluster.remove_node(node, allow_graceful=False)

    report = profile_on_ray(models, parse_target(TARGET), out, options=FAST, progress=False,
                            on_result=kill_second_node)
    assert killed, "the second node never had a batch in flight"
    ds = Dataset.open(out)
    m = ds.models(TARGET)
    assert sorted(m["model_id"]) == [f"m{i}" for i in range(8)]
    assert (m["status"] == "ok").all() and (m["latency_ms"] > 0).all()
    # Nothing written twice, even before the dataset's last-row-wins read.
    assert sorted(raw_ids(out)) == sorted(m["model_id"])
    kernels = raw_ids(out, "kernels")
    assert len(kernels) == len(set(kernels)) == 8 * 6
    # The batch the dead node held was measured on the surviving device.
    on = m.set_index("model_id")["farm_device"]
    assert all(on[k] == "latpred-cpu-0" for k in killed)
    # The batch the node returned before it died is kept.
    assert (on == "latpred-cpu-1").sum() == 2
    assert report.requeued == killed and report.devices_lost == ["latpred-cpu-1"]
    assert report.models_measured == 8 and report.models_failed == 0
    assert "1 lost mid-campaign" in report.summary()
    entry = ds.manifest["targets"][TARGET]
    assert entry["farm"] == "ray" and entry["noise"]["retest"] == "farm"
    assert entry["noise"]["n_retest"] == 2 and entry["noise"]["e2e_retest_mdape"] is not None
    # Each device timed the drift reference with each batch it returned (the dead node's
    # first one included), and the labels are drift-corrected through their own device's.
    drift = entry["drift"]
    by_device = {d: v["readings"] for d, v in drift["devices"].items()}
    assert by_device == {"latpred-cpu-0": 3, "latpred-cpu-1": 1}
    assert {p["device"] for p in drift["series"]} == set(by_device)
    drift_correct(out, tmp_path / "corrected")
    fixed = Dataset.open(tmp_path / "corrected").models(TARGET).set_index("model_id")
    ms = {d: [p["ms"] for p in drift["series"] if p["device"] == d] for d in by_device}
    level = float(np.median(ms["latpred-cpu-0"] + ms["latpred-cpu-1"]))
    one = fixed[fixed["farm_device"] == "latpred-cpu-1"]["drift_factor"]
    assert np.allclose(one, ms["latpred-cpu-1"][0] / level)
    zero = fixed[fixed["farm_device"] == "latpred-cpu-0"]["drift_factor"]
    assert zero.between(min(ms["latpred-cpu-0"]) / level, max(ms["latpred-cpu-0"]) / level).all()
    # A second run finds everything done.
    again = profile_on_ray(models, parse_target(TARGET), out, options=FAST, progress=False)
    assert again.models_measured == 0 and again.models_skipped == 8


def test_an_error_inside_measure_stops_the_campaign_in_one_sentence(cluster, models,
                                                                   tmp_path, monkeypatch):
    from latpred.errors import MeasurementError

    class Broken(DeviceWorker):
        """A bug in measuring, not a lost device: it must not be passed from device to
        device until the farm reports every device gone."""

        def measure(self, batch, reference=False):
            raise KeyError("no such column")

    monkeypatch.setattr(farm, "DeviceWorker", Broken)
    with pytest.raises(MeasurementError, match=r"raised KeyError: 'no such column'.*resume"):
        profile_on_ray(models, parse_target(TARGET), tmp_path / "farm", options=FAST,
                       progress=False)


def test_the_command_line_runs_a_farm_campaign(cluster, models, tmp_path):
    from click.testing import CliRunner

    from latpred.cli import main

    out = tmp_path / "cli"
    result = CliRunner().invoke(main, [
        "profile", "--target", TARGET, "--ray", cluster.address, "--out", str(out),
        "--retest", "0", "--no-realtime", "--batch-size", "2", *map(str, models[:2])])
    assert result.exit_code == 0, result.output
    assert "2 models measured (0 failed)" in result.output and "Farm:" in result.output
    assert Dataset.open(out).manifest["targets"][TARGET]["farm"] == "ray"



def test_an_address_where_nothing_listens_is_one_sentence():
    import socket

    from latpred.ray_cluster import check_reachable

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LatpredError, match=f"Nothing answers at 127.0.0.1:{port}: start"):
        check_reachable(f"127.0.0.1:{port}")
