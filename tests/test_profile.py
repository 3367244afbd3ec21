"""The host-CPU profiler: protocol, crash-safe worker, sub-models, the profile loop, resume."""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from latpred.builder import GraphBuilder
from latpred.dataset import Dataset
from latpred.deduce.kernel import Kernel
from latpred.errors import LatpredError, MeasurementError, ShapeError
from latpred.graph import Graph, Op, Tensor
from latpred.profile.litert_cpu import CpuRequest, measure_litert_cpu, time_invokes
from latpred.profile.noise import retest_sample
from latpred.profile.protocol import Protocol, abs_pct_diff, retest_mdape, summarize
from latpred.profile.runner import CpuMeasurer, RunOptions, model_paths, profile_models
from latpred.profile.submodel import config_hash, kernel_subgraph, op_subgraph
from latpred.profile.worker import Worker
from latpred.target import parse_target
from latpred.tflite import read_tflite, write_tflite


# -- functions the worker process runs (top level, so the spawned process can import them) ----
def _double(x):
    return 2 * x


def _crash(x):
    ctypes.string_at(0)  # reads address 0: a real segmentation fault


def _hang(x):
    time.sleep(3600)


def _raise(x):
    raise ValueError("bad model\nsecond line")


def _pid(x):
    import os

    return os.getpid()


# -- protocol -----------------------------------------------------------------------------------
def test_summarize_takes_median_of_pass_medians_and_pools_iqr_and_min():
    passes = [[1_000_000, 2_000_000, 3_000_000], [10_000_000, 10_000_000, 11_000_000],
              [2_000_000, 2_000_000, 2_000_000]]
    s = summarize(passes)
    assert s.median_ms == pytest.approx(2.0)  # pass medians 2, 10, 2: the spoiled pass is out
    assert s.min_ms == pytest.approx(1.0)
    assert s.n_runs == 9
    every = np.array([t for p in passes for t in p]) / 1e6
    assert s.iqr_ms == pytest.approx(np.percentile(every, 75) - np.percentile(every, 25))


def test_summarize_without_runs_is_an_error():
    with pytest.raises(MeasurementError):
        summarize([[], []])


def test_runs_per_pass_meets_minimum_and_fits_budget():
    p = Protocol(passes=5, min_runs_per_pass=4, max_runs_per_pass=100, pass_s=0.05, min_runs=20)
    assert p.runs_per_pass(1.0) == 4              # slow model: the floor (5 x 4 = 20 runs)
    assert p.runs_per_pass(0.001) == 50           # 50 runs of 1 ms fit in a 50 ms pass
    assert p.runs_per_pass(1e-7) == 100           # capped
    assert Protocol(passes=2, min_runs=20).runs_per_pass(1.0) == 10


def test_protocol_rejects_nonsense():
    with pytest.raises(MeasurementError):
        Protocol(passes=0)
    with pytest.raises(MeasurementError):
        Protocol(min_runs_per_pass=10, max_runs_per_pass=5)


def test_time_invokes_runs_warmup_then_passes():
    calls = []
    stats = time_invokes(lambda: calls.append(time.sleep(0.0005)),
                         Protocol(warmup=3, warmup_s=0.0, passes=5, pass_s=0.0, min_runs=20))
    assert stats.n_runs == 20 and len(calls) == 23
    assert 0.4 < stats.median_ms < 20 and stats.min_ms <= stats.median_ms


def test_retest_mdape():
    assert abs_pct_diff(2.0, 2.5) == pytest.approx(25.0)
    assert retest_mdape([(1.0, 1.1), (2.0, 2.0), (4.0, 3.0)]) == pytest.approx(10.0)
    assert retest_mdape([]) is None
    assert math.isnan(abs_pct_diff(0.0, 1.0))


def test_retest_sample_is_seeded_and_at_least_one():
    ids = [f"m{i}" for i in range(100)]
    a = retest_sample(ids, 0.05, seed=3)
    assert len(a) == 5 and a == retest_sample(list(reversed(ids)), 0.05, seed=3)
    assert len(retest_sample(ids[:3], 0.05, seed=0)) == 1
    assert retest_sample([], 0.05, 0) == [] and retest_sample(ids, 0.0, 0) == []


# -- worker -------------------------------------------------------------------------------------
def test_worker_is_reused_across_calls():
    with Worker(_pid, timeout_s=60) as w:
        first, second = w.call(None), w.call(None)
        assert first.ok and first.value == second.value and w.starts == 1


def test_worker_survives_a_segfault_and_goes_on():
    with Worker(_crash, timeout_s=60) as w:
        out = w.call(1)
        assert out.status == "failed" and "SIGSEGV" in out.error
        w.fn = _double  # the next call starts a fresh process running the new function
        assert w.call(4).value == 8 and w.starts == 2


def test_worker_kills_a_hang_after_the_timeout():
    with Worker(_hang, timeout_s=1.0) as w:
        t0 = time.perf_counter()
        out = w.call(1)
        assert out.status == "timeout" and time.perf_counter() - t0 < 15
        w.fn = _double
        assert w.call(2).value == 4 and w.starts == 2


def test_worker_reports_an_exception_and_keeps_the_process():
    with Worker(_raise, timeout_s=60) as w:
        out = w.call(1)
        assert out.status == "failed" and out.error == "ValueError: bad model"
        assert w.call(1).status == "failed" and w.starts == 1


def test_a_worker_that_cannot_start_stops_the_run():
    import types

    ghost = types.ModuleType("latpred_ghost_module")  # importable here, not in the new process
    exec("def measure(x):\n    return x", ghost.__dict__)
    sys.modules[ghost.__name__] = ghost
    try:
        with Worker(ghost.measure, timeout_s=60, quiet=True) as w:
            with pytest.raises(MeasurementError, match="could not start"):
                w.call(1)
    finally:
        del sys.modules[ghost.__name__]


# -- sub-models ---------------------------------------------------------------------------------
def _branchy_graph(prefix: str = "") -> Graph:
    """input -> conv -> (relu, dwconv) -> add -> output: the add reads two kernels."""
    t = [Tensor(prefix + "in", (1, 8, 8, 3)),
         Tensor(prefix + "w", (4, 3, 3, 3), is_constant=True),
         Tensor(prefix + "b", (4,), is_constant=True),
         Tensor(prefix + "conv", (1, 8, 8, 4)),
         Tensor(prefix + "relu", (1, 8, 8, 4)),
         Tensor(prefix + "dw_w", (1, 3, 3, 4), is_constant=True),
         Tensor(prefix + "dw_b", (4,), is_constant=True),
         Tensor(prefix + "dw", (1, 8, 8, 4)),
         Tensor(prefix + "add", (1, 8, 8, 4))]
    ops = (Op.make("CONV_2D", (0, 1, 2), (3,), stride=(1, 1), padding="SAME", dilation=(1, 1),
                   activation="NONE", groups=1),
           Op.make("RELU", (3,), (4,)),
           Op.make("DEPTHWISE_CONV_2D", (3, 5, 6), (7,), stride=(1, 1), padding="SAME",
                   dilation=(1, 1), activation="NONE", depth_multiplier=1),
           Op.make("ADD", (4, 7), (8,), activation="NONE"))
    return Graph(tensors=tuple(t), ops=ops, inputs=(0,), outputs=(8,), name=prefix + "g")


def test_op_subgraph_cuts_external_inputs_and_outputs():
    g = _branchy_graph()
    add = op_subgraph(g, [3])
    assert [op.type for op in add.ops] == ["ADD"]
    assert [add.tensors[i].shape for i in add.inputs] == [(1, 8, 8, 4)] * 2
    assert len(add.outputs) == 1
    conv = kernel_subgraph(g, Kernel("conv2d", (0,)))
    assert len(conv.inputs) == 1 and conv.tensors[conv.inputs[0]].shape == (1, 8, 8, 3)
    assert sum(t.is_constant for t in conv.tensors) == 2  # weights and bias come along
    fused = op_subgraph(g, [0, 1])  # conv + relu: conv's output is read by the dwconv too
    assert len(fused.outputs) == 2 and fused.topological_order() == (0, 1)


def test_equal_configurations_give_equal_subgraphs_whatever_the_names():
    a, b = _branchy_graph("a/"), _branchy_graph("other_model/")
    assert op_subgraph(a, [2]) == op_subgraph(b, [2])
    assert op_subgraph(a, [2]) != op_subgraph(a, [0])


def test_op_subgraph_rejects_bad_indices():
    with pytest.raises(ShapeError):
        op_subgraph(_branchy_graph(), [])
    with pytest.raises(ShapeError):
        op_subgraph(_branchy_graph(), [7])


def test_config_hash_is_sha256_hex():
    assert config_hash(b"abc") == ("ba7816bf8f01cfea414140de5dae2223"
                                   "b00361a396177a9cb410ff61f20015ad")


# -- the profile loop on real LiteRT --------------------------------------------------------------
FAST = Protocol(warmup=1, warmup_s=0.0, passes=5, min_runs_per_pass=4, pass_s=0.002)
TARGET = "host/cpu/fp32/t1"


def _tiny(channels: int, second: str) -> Graph:
    b = GraphBuilder(name=f"tiny{channels}{second}")
    x = b.input((1, 12, 12, 4))
    y = b.conv2d(x, 8, 3, activation="RELU")        # the same in every tiny model
    z = b.depthwise_conv2d(y, 3) if second == "dw" else b.conv2d(y, channels, 1)
    b.output(b.mean(z, keep_dims=False))
    return b.build()


def _write_models(folder: Path, specs) -> list[Path]:
    paths = []
    for i, (channels, second) in enumerate(specs):
        mid = f"tiny-{i:02d}"
        (folder / f"{mid}.json").write_text(json.dumps({"space": "tiny", "seed": i,
                                                        "channels": channels}))
        write_tflite(_tiny(channels, second), folder / f"{mid}.tflite", seed=i)
        paths.append(folder / f"{mid}.tflite")
    return paths


def _measurer(fn=measure_litert_cpu) -> CpuMeasurer:
    return CpuMeasurer(threads=1, protocol=FAST, fn=fn)


def _whole_model(request) -> bool:
    return len(read_tflite(request.model).ops) > 1


def _crash_whole_models(request):
    if _whole_model(request):
        ctypes.string_at(0)
    return measure_litert_cpu(request)


def _hang_whole_models(request):
    if _whole_model(request):
        time.sleep(3600)
    return measure_litert_cpu(request)


def test_measure_litert_cpu_times_a_real_model_with_both_kernel_sets():
    data = write_tflite(_tiny(16, "conv"))
    for kernels in ("xnnpack", "builtin"):
        s = measure_litert_cpu(CpuRequest(model=data, kernels=kernels, protocol=FAST))
        assert s.n_runs >= 20 and 0 < s.min_ms <= s.median_ms < 100 and s.iqr_ms >= 0


def test_measure_litert_cpu_rejects_garbage():
    with pytest.raises(MeasurementError):
        measure_litert_cpu(CpuRequest(model=b"not a model" * 10, protocol=FAST))


def test_profile_models_measures_models_and_distinct_kernels_once(tmp_path):
    paths = _write_models(tmp_path, [(16, "conv"), (16, "conv"), (24, "dw")])
    out = tmp_path / "ds"
    report = profile_models(paths, parse_target(TARGET), out, _measurer(),
                            RunOptions(retest_fraction=0.34, kernel_timing="isolated"),
                            progress=False)
    ds = Dataset.open(out)
    models, kernels = ds.models(TARGET), ds.kernels(TARGET)
    assert sorted(models["model_id"]) == ["tiny-00", "tiny-01", "tiny-02"]
    assert (models["status"] == "ok").all() and (models["n_runs"] >= 20).all()
    assert models.set_index("model_id").loc["tiny-02", "space"] == "tiny"
    assert len(kernels) == 9 and kernels.groupby("model_id").size().tolist() == [3, 3, 3]
    # conv+relu is one config in all three and models 0 and 1 are equal: 3 + 2 configs.
    assert kernels["config_hash"].nunique() == 5
    assert report.kernels_measured == 5 and report.kernels_reused == 4
    same = kernels.groupby("config_hash")["latency_ms"].nunique()
    assert (same == 1).all()  # a shared configuration shares its figures
    assert kernels["f_flops"].gt(0).any() and (kernels["status"] == "ok").all()
    entry = ds.manifest["targets"][TARGET]
    assert entry["threads"] == 1 and entry["runtime"] == "litert"
    assert entry["kernel_timing"] == "isolated" and "sub-model" in entry["kernel_timing_description"]
    assert entry["noise"]["n_retest"] == 1 and entry["noise"]["e2e_retest_mdape"] >= 0
    again = profile_models(paths, parse_target(TARGET), out, _measurer(),
                           RunOptions(retest_fraction=0.0, kernel_timing="isolated"),
                           progress=False)
    assert again.models_measured == 0 and again.models_skipped == 3
    assert len(Dataset.open(out).kernels(TARGET)) == 9


def test_a_crashing_runtime_is_recorded_and_the_run_goes_on(tmp_path):
    paths = _write_models(tmp_path, [(16, "conv")])
    report = profile_models(paths, parse_target(TARGET), tmp_path / "ds",
                            _measurer(_crash_whole_models),
                            RunOptions(retest_fraction=0, kernel_timing="isolated"),
                            progress=False)
    ds = Dataset.open(tmp_path / "ds")
    models = ds.models(TARGET)
    assert (models["status"] == "failed").all() and report.models_failed == 1
    assert models["error"].str.contains("SIGSEGV").all()
    assert models["latency_ms"].isna().all()
    assert (ds.kernels(TARGET)["status"] == "ok").all()  # the kernels alone measured fine


def test_a_hanging_runtime_times_out_and_the_run_goes_on(tmp_path):
    paths = _write_models(tmp_path, [(16, "conv")])
    profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(_hang_whole_models),
                   RunOptions(retest_fraction=0, timeout_s=1.5, kernel_timing="isolated"),
                   progress=False)
    ds = Dataset.open(tmp_path / "ds")
    models = ds.models(TARGET)
    assert (models["status"] == "timeout").all() and len(models) == 1
    assert len(ds.kernels(TARGET)) == 3 and (ds.kernels(TARGET)["status"] == "ok").all()


def test_unreadable_and_wrong_precision_models_are_failed_rows(tmp_path):
    paths = _write_models(tmp_path, [(16, "conv")])
    bad = tmp_path / "broken.tflite"
    bad.write_bytes(b"\x00" * 64)
    profile_models([*paths, bad], parse_target("host/cpu/int8/t1"), tmp_path / "ds",
                   _measurer(), RunOptions(retest_fraction=0), progress=False)
    models = Dataset.open(tmp_path / "ds").models().set_index("model_id")
    assert (models["status"] == "failed").all()
    assert "fp32" in models.loc["tiny-00", "error"] and models.loc["broken", "error"]


def test_model_paths_expands_folders(tmp_path):
    paths = _write_models(tmp_path, [(8, "conv"), (8, "dw")])
    assert model_paths([tmp_path]) == sorted(paths)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LatpredError, match="No .tflite models"):
        model_paths([tmp_path / "empty"])


def _profile_cmd(out: Path, folder: Path) -> list[str]:
    code = "import sys; from latpred.cli import main; sys.exit(main())"
    # batches of two models: the interleaved protocol appends rows once per batch
    return [sys.executable, "-c", code, "profile", "--target", TARGET, "--out", str(out),
            "--retest", "0", "--batch-size", "2", str(folder)]


def test_profile_resumes_after_kill_9_without_losing_or_duplicating_rows(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    _write_models(folder, [(8 + 4 * i, "conv" if i % 2 else "dw") for i in range(10)])
    out = tmp_path / "ds"
    proc = subprocess.Popen(_profile_cmd(out, folder), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    parts = out / "models.parquet"
    deadline = time.time() + 120
    while time.time() < deadline and not (parts.is_dir() and len(list(parts.glob("part-*"))) >= 2):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # kill -9: mid-run, without any chance to clean up
    proc.wait()
    before = Dataset.open(out)
    done = before.models(TARGET).set_index("model_id")["latency_ms"]
    assert 2 <= len(done) < 10, "the run was not interrupted mid-way"
    subprocess.run(_profile_cmd(out, folder), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300)
    after = Dataset.open(out)
    models, kernels = after.models(TARGET), after.kernels(TARGET)
    assert sorted(models["model_id"]) == [f"tiny-{i:02d}" for i in range(10)]
    assert (models["status"] == "ok").all()
    assert after.manifest["targets"][TARGET]["kernel_timing"] == "in_context"  # the default
    assert len(kernels) == 30 and not kernels.duplicated(["model_id", "kernel_index"]).any()
    kept = models.set_index("model_id")["latency_ms"].loc[done.index]
    assert (kept == done).all()  # rows written before the kill were kept, not re-measured
    # The raw parts hold no second row for a model that was done before the kill.
    raw = pd.read_parquet(out / "models.parquet")
    assert not raw.duplicated(["model_id", "target"]).any()


def test_a_model_without_deducible_kernels_is_still_measured_end_to_end(tmp_path, monkeypatch):
    import latpred.profile.prepare as prepare
    from latpred.errors import UnsupportedOpError

    def no_rule(graph, target, *args, **kwargs):
        raise UnsupportedOpError("No kernel rule for operation FOO on host.")

    monkeypatch.setattr(prepare, "kernel_plans", no_rule)
    paths = _write_models(tmp_path, [(16, "conv")])
    profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(),
                   RunOptions(retest_fraction=0), progress=False)
    ds = Dataset.open(tmp_path / "ds")
    row = ds.models(TARGET).iloc[0]
    assert row["status"] == "ok" and row["latency_ms"] > 0
    assert row["error"] == "kernels not measured: No kernel rule for operation FOO on host."
    assert ds.kernels(TARGET).empty


def test_stages_of_one_lowering_get_distinct_config_hashes():
    from latpred.profile.kernels import kernel_plans

    g = _tiny(16, "conv")
    stages = [Kernel(f"winograd_{p}", (0,), part=p)
              for p in ("input_transform", "matmul", "output_transform")]
    plans = kernel_plans(g, parse_target(TARGET), [*stages, Kernel("conv2d", (0,))])
    assert len({p.model_bytes for p in plans}) == 1
    assert len({p.config_hash for p in plans}) == 4
    assert plans[3].config_hash == config_hash(plans[3].model_bytes)


def test_profile_refuses_targets_it_cannot_measure_here(tmp_path):
    paths = _write_models(tmp_path, [(8, "conv")])
    for target in ("pixel4/cpu/fp32/1L", "h100/gpu/fp16"):
        with pytest.raises(MeasurementError, match="benchmark_model|GPU target"):
            profile_models(paths, parse_target(target), tmp_path / "ds", _measurer(),
                           progress=False)


def test_two_files_with_one_model_id_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = [*_write_models(tmp_path / "a", [(8, "conv")]),
             *_write_models(tmp_path / "b", [(8, "dw")])]
    with pytest.raises(LatpredError, match="tiny-00"):
        profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(), progress=False)


def test_a_litert_gpu_target_is_refused_before_anything_is_measured(tmp_path):
    # this machine's profiler and a Ray farm measure LiteRT on CPUs: a GPU target is one
    # sentence up front (the farm says it before Ray starts or a dataset is opened)
    from click.testing import CliRunner

    from latpred.cli import main
    from latpred.profile.farm import profile_on_ray

    from latpred.tflite import write_tflite

    b = GraphBuilder("tiny")
    b.output(b.conv2d(b.input((1, 8, 8, 4)), 8, 3))
    write_tflite(b.build(), tmp_path / "tiny.tflite")
    out = tmp_path / "gpu"
    with pytest.raises(MeasurementError, match="is a GPU target"):
        profile_models([], parse_target("h100/gpu/fp16"), out)
    with pytest.raises(MeasurementError, match="h100/gpu/fp16 is a GPU target"):
        profile_on_ray([], "h100/gpu/fp16", out, address="127.0.0.1:1")
    for extra in ([], ["--ray", "127.0.0.1:1"]):
        result = CliRunner().invoke(main, ["profile", "--target", "h100/gpu/fp16", "--out",
                                           str(out), *extra, str(tmp_path / "tiny.tflite")])
        assert result.exit_code == 2 and "is a GPU target" in result.output, result.output
    assert not out.exists()
