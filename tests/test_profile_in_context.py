"""The profile loop with in-context kernel timing (LiteRT's profiler inside the whole model)."""

from __future__ import annotations

import ctypes
import json
import math
import time
from pathlib import Path

import pytest

from latpred.builder import GraphBuilder
from latpred.dataset import Dataset
from latpred.deduce import deduce
from latpred.errors import LatpredError, MeasurementError
from latpred.graph import Graph
from latpred.profile.kernels import kernel_plans
from latpred.profile.litert_profiler import profile_request
from latpred.profile.protocol import Protocol
from latpred.profile.runner import CpuMeasurer, RunOptions, profile_models
from latpred.target import parse_target
from latpred.tflite import read_tflite, write_tflite

pytest.importorskip("ai_edge_litert")

TARGET = "host/cpu/fp32/t1"
FAST = Protocol(warmup=2, warmup_s=0.0, passes=5, min_runs_per_pass=4, pass_s=0.002)


# -- worker functions (top level: the spawned worker imports them) ----------------------------
def _crash(request):
    ctypes.string_at(0)


def _hang(request):
    time.sleep(3600)


def _model(width: int, second: str) -> Graph:
    """About 0.2 ms on the host: big enough that the run's fixed overhead stays small."""
    b = GraphBuilder(name=f"m{width}{second}")
    x = b.input((1, 40, 40, 16))
    y = b.conv2d(x, 32, 3, activation="RELU")  # the same configuration in every model
    y = b.depthwise_conv2d(y, 3, activation="RELU6") if second == "dw" else b.conv2d(y, width, 1)
    y = b.add(y, b.conv2d(x, b.shape(y)[-1], 1))
    y = b.mean(y, keep_dims=False)
    b.output(b.softmax(b.fully_connected(y, 10)))
    return b.build()


def _write(folder: Path, specs) -> list[Path]:
    folder.mkdir(exist_ok=True)
    paths = []
    for i, (width, second) in enumerate(specs):
        mid = f"m-{i:02d}"
        (folder / f"{mid}.json").write_text(json.dumps({"space": "t", "seed": i}))
        write_tflite(_model(width, second), folder / f"{mid}.tflite", seed=i)
        paths.append(folder / f"{mid}.tflite")
    return paths


def _measurer(**kw) -> CpuMeasurer:
    return CpuMeasurer(threads=1, protocol=FAST, **kw)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ic")
    paths = _write(root / "models", [(32, "conv"), (48, "conv"), (0, "dw")])
    report = profile_models(paths, parse_target(TARGET), root / "ds", _measurer(),
                            RunOptions(retest_fraction=0.34), progress=False)
    return paths, report, Dataset.open(root / "ds")


def test_every_kernel_gets_a_row_from_one_profile(run):
    paths, report, ds = run
    models, kernels = ds.models(TARGET), ds.kernels(TARGET)
    assert (models["status"] == "ok").all() and (models["error"] == "").all()
    assert (models["n_runs"] >= 12).all() and (models["latency_min_ms"] <= models["latency_ms"]).all()
    target = parse_target(TARGET)
    for path, (mid, group) in zip(paths, kernels.groupby("model_id")):
        graph = read_tflite(path.read_bytes())
        found = deduce(graph, target)
        assert group["kernel_index"].tolist() == list(range(len(found)))
        assert group["kernel_type"].tolist() == [k.type for k in found]
        # Hashes are the isolated mode's sub-model hashes: equal configurations group together.
        assert group["config_hash"].tolist() == [p.config_hash for p in kernel_plans(graph, target)]
    assert (kernels["status"] == "ok").all() and (kernels["latency_ms"] > 0).all()
    assert (kernels["n_runs"] >= 12).all() and kernels["f_flops"].gt(0).all()
    assert (kernels["latency_min_ms"] <= kernels["latency_ms"] + 1e-9).all()
    assert report.kernels_measured == len(kernels) and report.kernels_reused == 0
    assert "timed in context" in report.summary()
    first_conv = kernels[kernels["kernel_index"] == 0]["config_hash"]
    assert first_conv.nunique() == 1  # the shared first conv: one configuration, three rows


def test_kernel_times_add_up_to_the_end_to_end(run):
    _, _, ds = run
    e2e = ds.models(TARGET).set_index("model_id")["latency_ms"]
    sums = ds.kernels(TARGET).groupby("model_id")["latency_ms"].sum()
    ratio = sums / e2e.loc[sums.index]
    assert ratio.between(0.8, 1.05).all(), ratio.to_dict()


def test_manifest_says_in_context_and_has_the_noise_floor(run):
    _, _, ds = run
    entry = ds.manifest["targets"][TARGET]
    assert entry["kernel_timing"] == "in_context"
    assert "profiler" in entry["kernel_timing_description"] and "kernel_timing_note" not in entry
    # the default protocol is the interleaved one: at least min_rounds x min_pairs plain runs
    assert entry["timing_protocol"] == "interleaved" and entry["repeats"] == 12
    noise = entry["noise"]
    assert noise["n_retest"] == 1 and noise["retest"] == "start_vs_end"
    assert noise["e2e_retest_mdape"] >= 0 and noise["kernel_retest_mdape"] >= 0
    assert noise["e2e_retest_p90"] >= 0 and noise["kernel_retest_p90"] >= 0


def test_the_sequential_protocol_is_still_there(tmp_path):
    paths = _write(tmp_path / "models", [(8, "conv"), (16, "dw")])
    profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(),
                   RunOptions(retest_fraction=0.5, protocol="sequential"), progress=False)
    entry = Dataset.open(tmp_path / "ds").manifest["targets"][TARGET]
    assert entry["timing_protocol"] == "sequential" and entry["repeats"] == 50
    assert entry["noise"]["n_retest"] == 1 and "retest" not in entry["noise"]


def test_resuming_with_the_other_timing_is_refused(run, tmp_path):
    paths, _, ds = run
    with pytest.raises(LatpredError, match="--kernel-timing in-context"):
        profile_models(paths, parse_target(TARGET), ds.root, _measurer(),
                       RunOptions(retest_fraction=0, kernel_timing="isolated"), progress=False)
    with pytest.raises(LatpredError, match="Unknown kernel timing"):
        RunOptions(kernel_timing="sideways")


def test_builtin_kernels_fall_back_to_isolated(tmp_path):
    paths = _write(tmp_path / "models", [(8, "dw")])
    report = profile_models(paths, parse_target(TARGET), tmp_path / "ds",
                            _measurer(kernels="builtin"), RunOptions(retest_fraction=0),
                            progress=False)
    ds = Dataset.open(tmp_path / "ds")
    entry = ds.manifest["targets"][TARGET]
    assert entry["kernel_timing"] == "isolated" and "XNNPACK" in entry["kernel_timing_note"]
    assert report.kernel_timing == "isolated" and report.kernels_measured > 0
    assert (ds.kernels(TARGET)["status"] == "ok").all()


def test_a_crash_or_hang_in_the_profiler_is_a_row(tmp_path):
    paths = _write(tmp_path / "models", [(8, "conv")])
    report = profile_models(paths, parse_target(TARGET), tmp_path / "a", _measurer(
        profile_fn=_crash), RunOptions(retest_fraction=0, protocol="sequential"), progress=False)
    ds = Dataset.open(tmp_path / "a")
    row = ds.models(TARGET).iloc[0]
    assert row["status"] == "failed" and "SIGSEGV" in row["error"] and report.models_failed == 1
    assert math.isnan(row["latency_ms"]) and ds.kernels(TARGET).empty
    profile_models(paths, parse_target(TARGET), tmp_path / "b", _measurer(profile_fn=_hang),
                   RunOptions(retest_fraction=0, timeout_s=1.5, protocol="sequential"),
                   progress=False)
    assert Dataset.open(tmp_path / "b").models(TARGET)["status"].tolist() == ["timeout"]


@pytest.mark.parametrize("protocol", ["interleaved", "sequential"])
def test_attribution_failure_keeps_the_model_and_drops_its_kernels(tmp_path, monkeypatch,
                                                                   protocol):
    import latpred.profile.campaign as campaign
    import latpred.profile.runner as runner

    def unmappable(graph, kernels, profile, *args):
        raise MeasurementError("The profile does not map onto the model's ops (test).")

    monkeypatch.setattr(runner, "kernel_stats", unmappable)
    monkeypatch.setattr(campaign, "kernel_stats", unmappable)
    paths = _write(tmp_path / "models", [(8, "conv")])
    profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(),
                   RunOptions(retest_fraction=0, protocol=protocol), progress=False)
    ds = Dataset.open(tmp_path / "ds")
    row = ds.models(TARGET).iloc[0]
    assert row["status"] == "ok" and row["latency_ms"] > 0
    assert row["error"].startswith("kernels not measured: The profile does not map")
    assert ds.kernels(TARGET).empty


def test_profile_request_is_the_default_in_context_function():
    assert CpuMeasurer().profile_fn is profile_request
