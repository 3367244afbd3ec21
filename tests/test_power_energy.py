"""Energy per inference: the kernel power regressor, the calibration, the saved model, the
shipped power datasets and `latpred predict` printing energy beside latency."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from latpred import sampler
from latpred.cli import main
from latpred.dataset import Dataset
from latpred.errors import PredictorError
from latpred.power.energy import EnergyModel, KernelPowerModel, calibrate, find

ROOT = Path(__file__).resolve().parent.parent
TARGET = "h100/cuda/fp16"
COUNTERS = ROOT / "datasets" / "h100-cuda-kernel-counters"


@pytest.fixture(scope="module")
def kernels():
    k = Dataset.open(COUNTERS).kernels(TARGET)
    return k[k.status == "ok"].reset_index(drop=True)


@pytest.fixture(scope="module")
def energy_model(kernels):
    power = KernelPowerModel().fit(kernels, kernels["power_aligned_dyn_w"],
                                   kernels["latency_ms"])
    return EnergyModel(TARGET, power, a=0.8, b=20.0)


def test_calibrate_recovers_a_known_law():
    rng = np.random.default_rng(0)
    s, lat = rng.uniform(5, 50, 40), rng.uniform(0.1, 1.0, 40)
    a, b = calibrate(s, lat, 0.8 * s + 20 * lat)
    assert a == pytest.approx(0.8, rel=1e-6) and b == pytest.approx(20, rel=1e-6)


def test_kernel_power_learns_the_measured_powers(kernels, energy_model):
    pred = energy_model.kernel_power(kernels, kernels["latency_ms"])
    y = kernels["power_aligned_dyn_w"].to_numpy()
    assert np.median(np.abs(pred / y - 1)) < 0.10          # a fit, not a constant
    assert np.corrcoef(pred, y)[0, 1] > 0.8


def test_save_load_round_trip_and_checksum(kernels, energy_model, tmp_path):
    energy_model.save(tmp_path / "e")
    back = EnergyModel.load(tmp_path / "e")
    assert (back.a, back.b) == (0.8, 20.0)
    assert np.allclose(back.kernel_power(kernels, kernels["latency_ms"]),
                       energy_model.kernel_power(kernels, kernels["latency_ms"]))
    booster = tmp_path / "e" / "kernel_power.txt"
    booster.write_text(booster.read_text().replace("tree", "tre", 1))
    with pytest.raises(PredictorError, match="checksum"):
        EnergyModel.load(tmp_path / "e")
    with pytest.raises(PredictorError, match="no readable energy model"):
        EnergyModel.load(tmp_path / "nothing")


def test_shipped_power_datasets():
    zoo = Dataset.open(ROOT / "datasets" / "h100-cuda-energy-zoo")
    m = zoo.models(TARGET)
    assert len(m) == 48 and (m.status == "ok").all()
    assert (m.energy_mj > 0).all() and (m.energy_total_mj > m.energy_mj).all()
    noise = zoo.manifest["targets"][TARGET]["noise"]
    assert noise["n_retest"] == 48 and noise["e2e_retest_mdape"] < 3
    syn = Dataset.open(ROOT / "datasets" / "h100-cuda-energy-synthetic").models(TARGET)
    assert len(syn) >= 60
    k = Dataset.open(COUNTERS)
    c = pd.read_parquet(COUNTERS / "counters.parquet")
    assert len(c) >= 100 and c.shape[1] > 1000
    assert set(c.model_id + "#" + c.kernel_index.astype(str)) <= set(
        k.kernels(TARGET).model_id + "#" + k.kernels(TARGET).kernel_index.astype(str))
    units = json.loads((COUNTERS / "counter_units.json").read_text())
    assert units.get("gpu__time_duration.sum") in ("ns", "us", "ms")


def test_predict_prints_energy_when_an_energy_model_is_present(energy_model, tmp_path):
    from latpred.predictors import LatencyModel
    from latpred.predictors.search import SearchSpec
    from latpred.predictors.training import load_tables
    from latpred.tflite import write_tflite

    ids = [sampler.model_id("synthetic_cnn", 13, i) for i in range(40)]
    k, m = load_tables(ROOT / "datasets" / "h100-cuda-synthetic", TARGET, ids)
    spec = SearchSpec("lasso", "t", method="none", fixed={})
    lm = LatencyModel.fit_tables(k, m, TARGET, family="lasso", search=spec)
    lm.save(tmp_path / "p")
    space = sampler.load_space(ROOT / "search_space" / "synthetic_cnn.yaml")
    path = tmp_path / "m.tflite"
    write_tflite(sampler.build_graph(sampler.sample_one(space, 13, 500)), path)
    args = ["predict", "--predictor", str(tmp_path / "p"), "--allow-fallback", str(path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "predicted energy" not in res.output and find(tmp_path / "p") is None
    energy_model.save(tmp_path / "p" / "energy")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "predicted energy per inference" in res.output and "energy mJ" in res.output


def test_energy_error_decomposition():
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from power_eval import decompose

    ids = [f"m{i}" for i in range(9)]
    lat = pd.Series(np.linspace(0.2, 1.0, 9), index=ids)          # undisturbed latency
    meas = pd.DataFrame({"latency_ms": 1.08 * lat, "power_dyn_w": np.linspace(60, 140, 9)},
                        index=ids)
    y = meas.power_dyn_w * meas.latency_ms
    pred = 1.10 * meas.power_dyn_w * 1.08 * lat               # power 10% high, latency exact
    d = decompose(pred, y, lat, meas, 1.08)
    assert d["latency_part_mape"] == pytest.approx(0, abs=1e-9)
    assert d["power_part_signed"] == pytest.approx(10, rel=1e-9)
    assert d["by_energy_tercile"]["large"]["models"] == 3
    assert d["by_energy_tercile"]["small"]["signed"] == pytest.approx(10, rel=1e-9)
