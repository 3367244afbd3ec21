"""`latpred profile --adb`: phones over adb, tested through the stand-in `adb` of tests/adb_standin.

No phone is reachable here: the stand-in answers adb's calls from a folder per fake device and
runs `benchmark_model` with LiteRT on this host, printing the tool's exact output format.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from latpred.builder import GraphBuilder
from latpred.cli import main
from latpred.dataset import Dataset
from latpred.deduce import deduce
from latpred.errors import LatpredError
from latpred.profile.adb import AdbError, benchmark_args, benchmark_command, core_mask
from latpred.profile.adb_campaign import profile_adb
from latpred.profile.drift import drift_correct
from latpred.target import parse_target
from latpred.tflite import write_tflite

STANDIN = Path(__file__).parent / "adb_standin"
PIXEL4_CLOCKS = [1785600] * 4 + [2419200] * 3 + [2841600]  # cpu0-3 S, cpu4-6 M, cpu7 L
CPU = "pixel4/cpu/fp32/1L"


def make_device(root: Path, serial: str, binary: bool = True) -> Path:
    dev = root / serial
    for cpu, khz in enumerate(PIXEL4_CLOCKS):
        f = dev / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq"
        f.parent.mkdir(parents=True)
        f.write_text(f"{khz}\n")
    if binary:
        (dev / "data/local/tmp").mkdir(parents=True)
        (dev / "data/local/tmp/benchmark_model").write_bytes(b"\x7fELF stand-in")
    return dev


@pytest.fixture
def phones(tmp_path, monkeypatch) -> Path:
    """The stand-in adb first on PATH, then this Python (for its `env python3`)."""
    root = tmp_path / "phones"
    root.mkdir()
    monkeypatch.setenv("PATH", os.pathsep.join([str(STANDIN), str(Path(sys.executable).parent),
                                                os.environ["PATH"]]))
    monkeypatch.setenv("LATPRED_ADB_STANDIN_ROOT", str(root))
    return root


def tiny(name: str, width: int, res: int = 16):
    b = GraphBuilder(name=name)
    x = b.input((1, res, res, 3), name="input")
    c = b.conv2d(x, width, 3, activation="RELU6", name="conv1")
    d = b.depthwise_conv2d(c, 3, activation="RELU6", name="dw1")
    m = b.mean(b.add(c, d, name="add1"), keep_dims=True, name="pool")
    logits = b.fully_connected(b.reshape(m, (1, width), name="flatten"), 10, name="logits")
    b.output(b.softmax(logits, name="probs"))
    return b.build()


@pytest.fixture
def models(tmp_path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    for i, width in enumerate((8, 16, 24, 32)):
        write_tflite(tiny(f"m{i}", width), folder / f"m{i}.tflite", seed=i)
        (folder / f"m{i}.json").write_text(json.dumps({"space": "handmade", "seed": i}))
    return folder


def invocations(dev: Path) -> list[dict]:
    path = dev / ".invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def raw_model_ids(out: Path) -> list[str]:
    """Every model row ever written, duplicates included (not the deduplicated read)."""
    parts = [out / "models.parquet"] if (out / "models.parquet").is_file() else \
        sorted((out / "models.parquet").glob("part-*.parquet"))
    return [m for p in parts for m in pq.read_table(p)["model_id"].to_pylist()]


# -- a full campaign ------------------------------------------------------------------------------
def test_a_campaign_through_the_standin_stores_every_model_and_kernel(phones, models, tmp_path):
    dev = make_device(phones, "PIXEL4A")
    out = tmp_path / "ds"
    args = ["profile", "--target", CPU, "--adb", "PIXEL4A", "--kernels", "builtin",
            "--out", str(out), str(models)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "4 models measured (0 failed)" in result.output
    ds = Dataset.open(out)
    m, k = ds.models(CPU), ds.kernels(CPU)
    assert sorted(m["model_id"]) == ["m0", "m1", "m2", "m3"]
    assert (m["status"] == "ok").all() and (m["latency_ms"] > 0).all()
    assert len(k) == 4 * 7 and (k["latency_ms"] >= 0).all()
    assert set(k["kernel_type"]) >= {"conv2d", "dwconv2d", "fc"}
    # The flags the target asks for: one thread on the one large core (cpu7), built-in kernels;
    # the drift reference timed the same way before the first model and after the last.
    calls = invocations(dev)
    graphs = [c["flags"]["graph"].rsplit("/", 1)[1] for c in calls]
    assert graphs == ["drift-ref-v1.tflite", "m0.tflite", "m1.tflite", "m2.tflite",
                      "m3.tflite", "drift-ref-v1.tflite"]
    assert {c["mask"] for c in calls} == {"80"}
    flags = calls[0]["flags"]
    assert flags["num_threads"] == "1" and flags["use_xnnpack"] == "false"
    assert flags["enable_op_profiling"] == "true" and "use_gpu" not in flags
    # The raw outputs are kept beside the dataset; the phone is left clean.
    assert sorted(p.name for p in (out / "benchmark_model").iterdir()) == sorted(
        f"m{i}.{ext}" for i in range(4) for ext in ("csv", "txt"))
    assert not list((dev / "data/local/tmp/latpred").iterdir())
    manifest = ds.manifest["targets"][CPU]
    assert manifest["adb_serial"] == "PIXEL4A" and manifest["pinned_cpus"] == [7]
    # Each row says when its run took place, in order, and the reference's two readings
    # bracket them: the campaign can be drift-corrected.
    at = m.set_index("model_id").loc[["m0", "m1", "m2", "m3"], "measured_at"]
    assert at.is_monotonic_increasing and abs(at.iloc[-1] - time.time()) < 600
    drift = manifest["drift"]
    assert [p["phase"] for p in drift["series"]] == ["start", "end"]
    assert [p["models_done"] for p in drift["series"]] == [0, 4]
    assert drift["series"][0]["t"] < at.iloc[0] and drift["series"][1]["t"] > at.iloc[-1]
    assert all(p["ms"] > 0 for p in drift["series"]) and drift["every_models"] == 12
    drift_correct(out, tmp_path / "corrected")
    # Running it again measures nothing.
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "4 already in the dataset" in again.output
    assert len(invocations(dev)) == 6


def test_xnnpack_rows_and_several_cores(phones, models, tmp_path):
    dev = make_device(phones, "P4")
    target = parse_target("pixel4/cpu/fp32/1L+3M")
    report = profile_adb([models / "m1.tflite"], target, tmp_path / "ds", "P4", progress=False)
    assert report.models_measured == 1 and report.models_failed == 0
    call = invocations(dev)[0]
    assert call["mask"] == "f0" and call["flags"]["num_threads"] == "4"
    assert call["flags"]["use_xnnpack"] == "true"
    log = (tmp_path / "ds" / "benchmark_model" / "m1.txt").read_text()
    assert "TfLiteXNNPackDelegate" in log and "Delegate/Convolution (NHWC, F32)" in log
    kernels = Dataset.open(tmp_path / "ds").kernels(str(target)).sort_values("kernel_index")
    assert len(kernels) == 7
    # Every XNNPACK operator's time lands in some kernel (an extra "Static Reshape" included).
    from latpred.profile.benchmark_import import read_outputs

    report = read_outputs([tmp_path / "ds" / "benchmark_model" / "m1.csv"])
    xnn = [r.avg_ms for r in report.run_order if r.name.startswith("Delegate/")]
    assert kernels["latency_ms"].sum() == pytest.approx(sum(xnn))
    assert kernels["latency_ms"].iloc[0] == pytest.approx(xnn[0])  # the conv's IGEMM


def test_gpu_target_uses_the_gpu_delegate_without_affinity(phones, models, tmp_path):
    dev = make_device(phones, "P4")
    target = parse_target("pixel4/gpu/fp16")
    profile_adb([models / "m0.tflite"], target, tmp_path / "ds", "P4", progress=False)
    call = invocations(dev)[0]
    assert call["mask"] is None and call["flags"]["use_gpu"] == "true"
    assert call["flags"]["gpu_precision_loss_allowed"] == "true"
    from latpred.tflite import read_tflite

    kernels = deduce(read_tflite(models / "m0.tflite"), target)
    assert len(Dataset.open(tmp_path / "ds").kernels(str(target))) == len(kernels) == 5


# -- what goes wrong --------------------------------------------------------------------------------
def test_a_missing_binary_says_how_to_get_it(phones, models, tmp_path):
    make_device(phones, "BARE", binary=False)
    result = CliRunner().invoke(main, ["profile", "--target", CPU, "--adb", "BARE", "--out",
                                       str(tmp_path / "ds"), str(models)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "benchmark_model is not at /data/local/tmp/benchmark_model on BARE" in line
    assert "adb push" in line and "chmod +x" in line


def test_a_bad_serial_is_one_sentence_and_exit_2(phones, models, tmp_path):
    make_device(phones, "REAL1")
    result = CliRunner().invoke(main, ["profile", "--target", CPU, "--adb", "NOPE", "--out",
                                       str(tmp_path / "ds"), str(models)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "'NOPE'" in line and "REAL1" in line
    assert not (tmp_path / "ds").exists()


def test_no_adb_on_path_is_one_sentence(models, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(AdbError, match="platform-tools"):
        profile_adb([models / "m0.tflite"], parse_target(CPU), tmp_path / "ds", "X",
                    progress=False)


def test_a_device_that_disconnects_mid_campaign_resumes_without_loss_or_duplicates(
        phones, models, tmp_path):
    dev = make_device(phones, "FLAKY")
    (dev / ".disconnect_after").write_text("2")
    out = tmp_path / "ds"
    args = ["profile", "--target", CPU, "--adb", "FLAKY", "--kernels", "builtin", "--out",
            str(out), "--drift-every", "0", str(models)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 2, first.output
    assert "disconnected" in first.output and "resume" in first.output
    assert "Traceback" not in first.output
    assert sorted(Dataset.open(out).models(CPU)["model_id"]) == ["m0", "m1"]
    # Plugged back in: the same command measures the two models left, and only those.
    (dev / ".disconnect_after").unlink()
    (dev / ".disconnected").unlink()
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert "2 models measured (0 failed), 2 already in the dataset" in second.output
    ds = Dataset.open(out)
    assert sorted(ds.models(CPU)["model_id"]) == ["m0", "m1", "m2", "m3"]
    assert sorted(raw_model_ids(out)) == ["m0", "m1", "m2", "m3"]  # no row written twice
    assert (ds.models(CPU)["status"] == "ok").all()
    kernels = ds.kernels(CPU)
    assert len(kernels) == 28 and not kernels.duplicated(["model_id", "kernel_index"]).any()
    graphs = [c["flags"]["graph"] for c in invocations(dev)]
    assert [g.rsplit("/", 1)[1] for g in graphs] == ["m0.tflite", "m1.tflite", "m2.tflite",
                                                     "m2.tflite", "m3.tflite"]


def test_a_crashing_run_is_a_failed_row_and_the_campaign_goes_on(phones, models, tmp_path):
    dev = make_device(phones, "P4")
    (models / "broken.tflite").write_bytes(b"not a flatbuffer at all")
    report = profile_adb([models / "broken.tflite", models / "m0.tflite"], parse_target(CPU),
                         tmp_path / "ds", "P4", kernels="builtin", progress=False,
                         drift_every=0)
    assert report.models_measured == 2 and report.models_failed == 1
    m = Dataset.open(tmp_path / "ds").models(CPU).set_index("model_id")
    assert m.loc["broken", "status"] == "failed" and m.loc["broken", "error"]
    assert m.loc["m0", "status"] == "ok"
    assert len(invocations(dev)) == 2


# -- command line pieces ----------------------------------------------------------------------------
def test_a_farm_phone_times_the_drift_reference_with_its_batch(phones, models):
    """A Ray farm's phone (`DeviceWorker`, here without Ray) times the drift reference once
    before the batch's models through benchmark_model, as them: one reading, with its device,
    that drift correction puts beside the models' times."""
    from latpred.profile.farm import FarmOptions
    from latpred.profile.farm_device import DeviceWorker, FarmDevice, model_file

    dev = make_device(phones, "PIXEL4A")
    worker = DeviceWorker(FarmDevice("latpred-adb-PIXEL4A", "node", serial="PIXEL4A"), CPU,
                          FarmOptions(kernels="builtin"))
    batch = [model_file(p) for p in sorted(models.glob("*.tflite"))[:2]]
    rows, kernels, readings = worker.measure(batch, reference=True)
    assert sorted(rows["model_id"]) == ["m0", "m1"] and len(kernels) == 2 * 7
    assert (rows["farm_device"] == "latpred-adb-PIXEL4A").all()
    [reading] = readings
    assert reading["device"] == "latpred-adb-PIXEL4A" and reading["ms"] > 0
    assert reading["t"] < rows["measured_at"].min() and reading["phase"] == "start"
    assert len(invocations(dev)) == 3            # the reference, then the two models
    assert worker.measure(batch[:1])[2] == []    # not asked: no reading, no run
    assert len(invocations(dev)) == 4


def test_core_mask_follows_the_clocks_not_the_cpu_numbers():
    groups = [[7], [4, 5, 6], [0, 1, 2, 3]]
    assert core_mask(parse_target("pixel4/cpu/fp32/1L"), groups) == (7,)
    assert core_mask(parse_target("pixel4/cpu/fp32/1L+3M"), groups) == (4, 5, 6, 7)
    assert core_mask(parse_target("pixel4/cpu/fp32/2S"), groups) == (0, 1)
    with pytest.raises(LatpredError, match="do not match the clusters of pixel4"):
        core_mask(parse_target(CPU), [[0, 1, 2, 3, 4, 5]])


def test_benchmark_command_line():
    args = benchmark_args(parse_target("pixel4/cpu/int8/2M"), "/d/m.tflite", "/d/m.csv",
                          "builtin", runs=30, warmup=2)
    line = benchmark_command("/data/local/tmp/benchmark_model", args, (4, 5))
    assert line.startswith("taskset 30 /data/local/tmp/benchmark_model --graph=/d/m.tflite")
    assert "--num_threads=2" in line and "--use_xnnpack=false" in line
    assert "--num_runs=30" in line and "--profiling_output_csv_file=/d/m.csv" in line
    gpu = benchmark_args(parse_target("pixel4/gpu/fp32"), "m", "c")
    assert "--gpu_precision_loss_allowed=false" in gpu and not any("threads" in a for a in gpu)
    assert pd.notna(line)
