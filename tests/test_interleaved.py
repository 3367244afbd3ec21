"""The interleaved protocol (issue 12): estimators, the round-robin loop and its stopping rule,
the campaign (batches, drift reference, retests at start and end), drift correction, and the
label noise `latpred evaluate` prints. Fake timings everywhere but one small real LiteRT test."""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from latpred.builder import GraphBuilder
from latpred.cli import main
from latpred.dataset import Dataset
from latpred.errors import LatpredError, MeasurementError
from latpred.profile.drift import drift_correct, drift_factors, reference_model, summarize_drift
from latpred.profile.estimators import estimate, is_stable, retest_figures, round_stats
from latpred.profile.interleaved import InterleavedProtocol, run_rounds
from latpred.profile.interleaved_rows import rounds_estimate
from latpred.profile.runner import CpuMeasurer, RunOptions, profile_models
from latpred.target import parse_target
from latpred.tflite import write_tflite

TARGET = "host/cpu/fp32/t1"
QUICK = InterleavedProtocol(batch_size=3, warmup_s=0.0, min_pairs=3, max_pairs=3, min_rounds=3,
                            max_rounds=6)


# -- estimators ---------------------------------------------------------------------------------
def test_estimators_and_round_stats():
    v = np.arange(1.0, 101.0)
    assert estimate(v, "min") == 1.0
    assert estimate(v, "p10") == pytest.approx(np.percentile(v, 10))
    assert estimate(v, "p05") == pytest.approx(np.percentile(v, 5))
    assert estimate(v, "lowmean") == pytest.approx(np.mean(v[:20]))
    assert math.isnan(estimate([], "min"))
    with pytest.raises(MeasurementError, match="Unknown estimator"):
        estimate(v, "mode")
    with pytest.raises(LatpredError):
        InterleavedProtocol(estimator="mode")
    s = round_stats([1000.0, 2000.0, 3000.0], 1e-3)
    assert s == {"n": 3, "min": 1.0, "p10": 1.2, "p50": 2.0, "lowmean": 1.0}
    assert round_stats([]) == {"n": 0}


def test_agreement_of_the_fastest_rounds():
    from latpred.profile.interleaved import _agree

    rounds = [np.array([15.0, 20.0]), np.array([25.0, 26.0]), np.array([24.9])]
    assert not _agree(rounds, 2, 0.01)  # one round alone set the minimum
    assert _agree(rounds + [np.array([15.1])], 2, 0.01) and _agree(rounds, 1, 0.01)


def test_stability_needs_the_window_and_the_tolerance():
    assert not is_stable([1.0, 1.0], 0.005)  # two rounds: nothing to compare over a window of 2
    assert is_stable([1.2, 1.0, 1.0, 1.004], 0.005)
    assert not is_stable([1.0, 1.0, 0.99], 0.005)
    assert is_stable([1.0, 0.99, 0.99], 0.005, window=1)


def test_retest_figures():
    f = retest_figures([(1.0, 1.01), (2.0, 2.0), (4.0, 3.0), (1.0, float("nan")), (0.0, 1.0)])
    assert f["n"] == 3 and f["mdape"] == pytest.approx(1.0)
    assert f["p90"] == pytest.approx(np.percentile([1.0, 0.0, 25.0], 90), abs=1e-3)
    assert retest_figures([]) == {"mdape": None, "p90": None, "n": 0}


# -- the round-robin loop with fake models ------------------------------------------------------
class _Fake:
    """A model of `n_ops` operators: 60% of runs clean, the others slowed (interference only
    slows a run). `shrink` makes every run faster than the last (an estimator never settles)."""

    def __init__(self, name, log, n_ops=4, seed=0, shrink=1.0, fail_at=None, keys=None):
        self.name, self.log, self.shrink, self.fail_at = name, log, shrink, fail_at
        self.keys = keys or tuple((i, "ADD", "tflite") for i in range(n_ops))
        self.base = np.array([5.0 + 3 * i for i in range(len(self.keys))])
        self.rng = np.random.default_rng(seed)
        self.runs = 0

    def _times(self):
        self.runs += 1
        if self.fail_at is not None and self.runs >= self.fail_at:
            raise MeasurementError("the fake runtime gave up")
        slow = self.rng.exponential(3.0) if self.rng.random() < 0.4 else 0.0
        return self.base * (1 + slow) * self.shrink ** self.runs

    def warm(self):
        self.log.append(self.name)
        return 1e-4

    def plain(self):
        return float(self._times().sum() + 20.0)

    def profiled(self):
        t = self._times()
        return float(t.sum() + 40.0), self.keys, tuple(np.floor(t))


def test_rounds_interleave_models_and_stop_when_stable():
    log: list[str] = []
    models = [_Fake("a", log, seed=1), _Fake("b", log, seed=2), None,
              _Fake("c", log, seed=3, shrink=0.99)]
    out = run_rounds(models, QUICK, errors=["", "", "cannot load", ""])
    a, b, dead, c = out
    # round-robin: after the warm-ups, one block warm-up run per model and round
    blocks = log[3 * QUICK.warmup:]
    assert blocks[:3] == ["a", "b", "c"] and blocks[3:6] == ["a", "b", "c"]
    assert dead.error == "cannot load" and not dead.ok
    assert a.ok and a.stopped == "stable" and QUICK.min_rounds <= len(a.plain_us) < 6
    assert all(len(r) == 3 for r in a.plain_us) and a.op_us[0].shape == (3, 4)
    assert estimate(np.concatenate(a.plain_us)) == pytest.approx(5 + 8 + 11 + 14 + 20)
    assert c.stopped == "cap" and len(c.plain_us) == QUICK.max_rounds  # always getting faster
    assert 0 < a.started <= a.finished


class _Shifty(_Fake):
    """Reports another operator list on every run."""

    def profiled(self):
        self.runs += 1
        return 1.0, ((self.runs, "ADD", "tflite"),), (1.0,)


def test_a_model_that_fails_mid_batch_fails_alone():
    log: list[str] = []
    out = run_rounds([_Fake("a", log), _Fake("x", log, fail_at=10), _Shifty("k", log)], QUICK)
    assert out[0].ok and "gave up" in out[1].error and "different ops" in out[2].error


# -- a campaign through the worker, with a fake batch function ----------------------------------
class _FromGraph(_Fake):
    def __init__(self, data: bytes, seed: int):
        from latpred.tflite import read_tflite

        graph = read_tflite(data)
        super().__init__("m", [], seed=seed,
                         keys=tuple((i, op.type, "tflite") for i, op in enumerate(graph.ops)))


def _fake_batch(request):
    """What the worker runs instead of LiteRT: exact floors, random slow-downs; crashes (a real
    segfault) on a batch that holds the model whose hash LATPRED_TEST_POISON names."""
    poison = os.environ.get("LATPRED_TEST_POISON", "")
    if poison and any(hashlib.sha256(m).hexdigest() == poison for m in request.models):
        ctypes.string_at(0)
    models = [_FromGraph(m, seed=i) for i, m in enumerate(request.models)]
    return run_rounds(models, request.protocol)


def _model(i: int):
    b = GraphBuilder(name=f"m{i}")
    x = b.input((1, 16, 16, 8))
    y = b.conv2d(x, 8 + 4 * i, 3, activation="RELU")
    y = b.mean(y, keep_dims=False)
    b.output(b.fully_connected(y, 10))
    return b.build()


def _write(folder: Path, n: int) -> list[Path]:
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(n):
        (folder / f"m-{i:02d}.json").write_text(json.dumps({"space": "t", "seed": i}))
        write_tflite(_model(i), folder / f"m-{i:02d}.tflite", seed=i)
        paths.append(folder / f"m-{i:02d}.tflite")
    return paths


def _measurer() -> CpuMeasurer:
    return CpuMeasurer(threads=1, interleaved=QUICK, batch_fn=_fake_batch)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    paths = _write(root / "models", 7)
    report = profile_models(paths, parse_target(TARGET), root / "ds", _measurer(),
                            RunOptions(retest_fraction=0.3, drift_every=3), progress=False)
    return paths, report, Dataset.open(root / "ds")


def test_campaign_rows_come_from_the_same_runs(campaign):
    paths, report, ds = campaign
    models, kernels = ds.models(TARGET), ds.kernels(TARGET)
    assert len(models) == 7 and (models["status"] == "ok").all()
    assert report.models_measured == 7 and report.kernels_measured == len(kernels)
    for (mid, group), row in zip(kernels.groupby("model_id"), models.itertuples()):
        # the fake's floors are whole microseconds: kernels sum to the operators' sum exactly,
        # and the plain runs' minimum is that plus the fake's 20 us
        assert group["latency_ms"].sum() == pytest.approx(row.op_sum_ms)
        assert row.latency_ms == pytest.approx(row.op_sum_ms + 0.020)
        assert row.profiled_ms == pytest.approx(row.op_sum_ms + 0.040)
    assert (models["estimator"] == "min").all() and models["n_rounds"].between(3, 6).all()
    assert set(models["stopped"]) <= {"stable", "cap"} and models["measured_at"].gt(0).all()
    raw = json.loads(models["rounds_json"][0])
    assert set(raw) == {"plain", "profiled", "op_sum"} and raw["plain"][0]["n"] == 3
    assert rounds_estimate(models["rounds_json"][0]) == pytest.approx(models["latency_ms"][0])
    assert rounds_estimate(kernels["rounds_json"][0]) == pytest.approx(kernels["latency_ms"][0])


def test_campaign_manifest_has_protocol_drift_and_noise(campaign):
    _, report, ds = campaign
    entry = ds.manifest["targets"][TARGET]
    assert entry["timing_protocol"] == "interleaved" and entry["estimator"] == "min"
    assert entry["protocol"]["batch_size"] == 3
    drift = entry["drift"]
    phases = [p["phase"] for p in drift["series"]]
    # the reference: in the start retest, every third model of the main pass, the end retest
    assert phases == ["start", "main", "main", "main", "end"]
    assert drift["every_models"] == 3 and drift["range_pct"] is not None
    assert drift["flagged"] is (drift["range_pct"] > 3.0)
    noise = entry["noise"]
    assert noise["retest"] == "start_vs_end" and noise["n_retest"] == 2
    assert noise["e2e_retest_mdape"] == 0.0 and noise["e2e_retest_p90"] == 0.0  # exact floors
    assert noise["kernel_retest_mdape"] == 0.0 and "label_vs_end" in noise["pairs"]
    retest = ds.read_json("retest.json")[TARGET]
    assert set(retest) >= {"sample", "start", "end"} and len(retest["sample"]) == 2
    assert "Drift reference: 5 timings" in report.summary()


def test_a_resumed_campaign_skips_done_models(campaign, tmp_path):
    paths, _, ds = campaign
    report = profile_models(paths, parse_target(TARGET), ds.root, _measurer(),
                            RunOptions(retest_fraction=0.3, drift_every=3), progress=False)
    assert report.models_measured == 0 and report.models_skipped == 7
    with pytest.raises(LatpredError, match="--protocol interleaved"):
        profile_models(paths, parse_target(TARGET), ds.root, _measurer(),
                       RunOptions(protocol="sequential"), progress=False)


def test_a_crashing_model_fails_alone(tmp_path, monkeypatch):
    paths = _write(tmp_path / "models", 4)
    monkeypatch.setenv("LATPRED_TEST_POISON", hashlib.sha256(paths[1].read_bytes()).hexdigest())
    profile_models(paths, parse_target(TARGET), tmp_path / "ds", _measurer(),
                   RunOptions(retest_fraction=0, drift_every=0), progress=False)
    models = Dataset.open(tmp_path / "ds").models(TARGET).set_index("model_id")
    assert models.loc["m-01", "status"] == "failed" and "SIGSEGV" in models.loc["m-01", "error"]
    assert (models.drop("m-01")["status"] == "ok").all()


def test_split_half_figures_of_a_campaign(campaign):
    from latpred.profile.interleaved_rows import split_half_figures

    _, _, ds = campaign
    figures = split_half_figures(ds.models(TARGET)["rounds_json"].tolist())
    assert set(figures) == {"min", "p10", "p50", "lowmean"} and figures["min"]["n"] == 7
    assert figures["min"]["mdape"] == 0.0  # the fake's floor shows up in both halves
    r = CliRunner().invoke(main, ["dataset", "estimators", str(ds.root), "--target", TARGET])
    assert r.exit_code == 0 and "per kernel" in r.output and "min" in r.output, r.output


# -- drift --------------------------------------------------------------------------------------
def test_drift_summary_and_factors():
    series = [{"t": 0.0, "ms": 1.0}, {"t": 10.0, "ms": 1.1}, {"t": 20.0, "ms": 1.0}]
    s = summarize_drift(series, 3.0)
    assert s["range_pct"] == pytest.approx(10.0) and s["flagged"]
    assert summarize_drift(series[:1], 3.0) == {"range_pct": None, "flagged": False}
    f = drift_factors(series, np.array([0.0, 5.0, 10.0, 30.0, np.nan]))
    assert f == pytest.approx([1.0, 1.05, 1.1, 1.0, 1.0])
    f = drift_factors(series, np.array([0.0, 5.0, np.nan]), reference_ms=2.0)
    assert f == pytest.approx([0.5, 0.525, 1.0])
    with pytest.raises(LatpredError, match="fewer than two"):
        drift_factors(series[:1], np.array([1.0]))


def test_drift_correct_rescales_labels(campaign, tmp_path):
    _, _, ds = campaign
    models = ds.models(TARGET)
    t0, t1 = float(models["measured_at"].min()), float(models["measured_at"].max())
    ds.update_manifest(TARGET, drift={**ds.manifest["targets"][TARGET]["drift"],
                                      "series": [{"t": t0, "ms": 1.0}, {"t": t1, "ms": 1.2}]})
    r = CliRunner().invoke(main, ["dataset", "drift-correct", str(ds.root),
                                  "--out", str(tmp_path / "fixed")])
    assert r.exit_code == 0, r.output
    fixed = Dataset.open(tmp_path / "fixed")
    new = fixed.models(TARGET).set_index("model_id")
    old = models.set_index("model_id")
    factor = (1.0 + 0.2 * (old["measured_at"] - t0) / (t1 - t0)) / 1.1
    assert np.allclose(new["latency_ms"], old["latency_ms"] / factor)
    assert np.allclose(new["drift_factor"], factor)
    k_new, k_old = fixed.kernels(TARGET), ds.kernels(TARGET)
    assert np.allclose(k_new["latency_ms"] * k_new["drift_factor"], k_old["latency_ms"])
    assert "drift_corrected" in fixed.manifest["targets"][TARGET]
    r = CliRunner().invoke(main, ["dataset", "drift-correct", str(ds.root), "--out",
                                  str(tmp_path / "x"), "--target", "host/cpu/int8/t1"])
    assert r.exit_code == 2 and "no target" in r.output
    # To a fixed machine state shared by campaigns: the reference read 1.0-1.2 ms here, so
    # at --reference-ms 1.0 every label is divided by the reference's own ratio to 1.0 ms.
    r = CliRunner().invoke(main, ["dataset", "drift-correct", str(ds.root), "--out",
                                  str(tmp_path / "fixed1"), "--reference-ms", "1.0"])
    assert r.exit_code == 0, r.output
    fixed1 = Dataset.open(tmp_path / "fixed1").models(TARGET).set_index("model_id")
    assert np.allclose(fixed1["latency_ms"], old["latency_ms"] / (factor * 1.1))
    r = CliRunner().invoke(main, ["dataset", "drift-correct", str(ds.root), "--out",
                                  str(tmp_path / "y"), "--reference-ms", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_drift_correct_takes_a_farm_device_by_device(campaign, tmp_path):
    """A Ray farm's drift series holds each device's readings: each model is corrected through
    its own device's series, every device to one level (the median of all readings), so a
    device that runs slower is brought onto the others' scale; a device with one reading has
    a constant factor, and a model from a device without any is refused."""
    _, _, ds = campaign
    models = ds.models(TARGET).sort_values("measured_at").reset_index(drop=True)
    models["farm_device"] = ["latpred-cpu-0", "latpred-cpu-1"] * 3 + ["latpred-cpu-0"]
    t0, t1 = float(models["measured_at"].min()), float(models["measured_at"].max())
    series = [{"t": t0, "ms": 1.0, "device": "latpred-cpu-0"},
              {"t": t1, "ms": 1.2, "device": "latpred-cpu-0"},
              {"t": t0, "ms": 2.0, "device": "latpred-cpu-1"}]
    farm = Dataset.create(tmp_path / "farm", name="farm")
    farm.update_manifest(TARGET, **{**ds.manifest["targets"][TARGET],
                                    "drift": {"series": series}})
    farm.append_kernels(ds.kernels(TARGET))
    farm.append_models(models)
    drift_correct(farm.root, tmp_path / "fixed")
    fixed = Dataset.open(tmp_path / "fixed").models(TARGET).set_index("model_id")
    old = models.set_index("model_id")
    level = 1.2                                  # the median of 1.0, 1.2 and 2.0
    zero = old["farm_device"] == "latpred-cpu-0"
    expected = np.where(zero, (1.0 + 0.2 * (old["measured_at"] - t0) / (t1 - t0)) / level,
                        2.0 / level)
    assert np.allclose(fixed.loc[old.index, "drift_factor"], expected)
    assert np.allclose(fixed.loc[old.index, "latency_ms"], old["latency_ms"] / expected)
    farm.update_manifest(TARGET, drift={"series": series[:2]})
    with pytest.raises(LatpredError, match="3 models were measured on latpred-cpu-1, which "
                                           "has no drift reading"):
        drift_correct(farm.root, tmp_path / "refused")


# -- the real runtime, once -----------------------------------------------------------------------
def test_measure_batch_times_real_models_round_robin():
    pytest.importorskip("ai_edge_litert")
    from latpred.profile.interleaved import BatchRequest, measure_batch
    from latpred.profile.worker import Worker

    data = (write_tflite(_model(0), seed=0), reference_model(), b"not a model")
    protocol = InterleavedProtocol(batch_size=3, warmup_s=0.0, block_s=0.01, max_rounds=5)
    with Worker(measure_batch, timeout_s=120) as w:
        out = w.call(BatchRequest(models=data, protocol=protocol))
    assert out.ok, out.error
    small, ref, bad = out.value
    assert small.ok and ref.ok and not bad.ok and bad.error
    assert 4 <= len(small.plain_us) <= 5 and small.stopped in ("stable", "cap")
    assert small.op_us[0].shape[1] == len(small.op_keys) >= 3
    # the profiler's operators cover most of a plain run of the (4 ms) reference: per round the
    # fastest profiled run's op sum over the fastest plain run of the same round (adjacent in
    # time), the median over rounds, since a busy host slows whole blocks (the fastest runs
    # over all rounds read 1.24 once on a loaded VM: the profiled blocks all hit by the load)
    ratio = float(np.median([o.sum(axis=1).min() / p.min()
                             for o, p in zip(ref.op_us, ref.plain_us)]))
    assert 0.5 < ratio < 1.1


# -- evaluate prints every figure beside the label noise --------------------------------------------
def test_evaluate_prints_accuracy_beside_label_noise(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from simdata import simulate

    from latpred.evaluate import protocol_split, write_report
    from latpred.evaluate.console import print_summary
    from latpred.evaluate.noise import noise_cell, noise_line

    ds = simulate(tmp_path / "ds", TARGET, n_models=20, seed=3)
    ds.update_manifest(TARGET, noise={"e2e_retest_mdape": 1.234, "e2e_retest_p90": 3.45,
                                      "kernel_retest_mdape": 2.5, "kernel_retest_p90": 6.0,
                                      "n_retest": 5, "retest": "start_vs_end"})
    assert noise_cell(ds.manifest["targets"][TARGET]["noise"]) == "1.23% (p90 3.5%)"
    assert noise_cell({}) == "not measured" and "not measured" in noise_line({})
    assert "half of its 4 campaigns" in noise_line({"e2e_retest_mdape": 3.1, "campaigns": 4,
                                                   "retest": "split_half_campaigns"})
    ev = protocol_split(ds, TARGET, families=("lasso",), searches=("none",), baselines=False)
    text = write_report(ev, tmp_path / "rep").read_text()
    assert "| MAPE | label noise |" in text and "| 1.23% (p90 3.5%) |" in text
    assert "| 2.50% (p90 6.0%) |" in text  # the per-kernel table, beside kernel MAPE
    assert "90th percentile 3.5% end to end" in text
    from rich.console import Console

    recorded = Console(record=True, width=200)
    monkeypatch.setattr("rich.console.Console", lambda *a, **k: recorded)
    print_summary(ev)
    out = recorded.export_text()
    noise_rows = [line for line in out.splitlines() if "label noise (" in line]
    assert "1.23%" in noise_rows[0] and "2.50%" in noise_rows[0]  # MAPE and kernel MAPE columns
    assert "3.45%" in noise_rows[1] and "6.00%" in noise_rows[1]
    assert "start and end of its campaign" in out
