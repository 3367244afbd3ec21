"""Metrics, baselines, ablations, protocols, reports and the train/predict/evaluate commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from latpred.baselines import FlopsLinear, NnMeterBaseline, backend_of, nnmeter_units
from latpred.builder import GraphBuilder
from latpred.cli import main
from latpred.deduce import deduce
from latpred.evaluate import (e2e_metrics, evaluate_predictor, load_eval_set, per_type_mape,
                              protocol_sizes, protocol_split, protocol_transfer, split_ids,
                              write_report)
from latpred.evaluate.ablation import labels, no_fusion, no_selection
from latpred.predictors import LatencyModel

sys.path.insert(0, str(Path(__file__).parent))  # tests/simdata.py
from simdata import simulate  # noqa: E402

CPU, GPU = "host/cpu/fp32/t1", "h100/gpu/fp16"


# -- metrics -----------------------------------------------------------------------------------
def test_e2e_metrics_by_hand():
    y = np.array([1.0, 2.0, 4.0, 8.0])
    p = np.array([1.1, 1.5, 4.0, 8.4])  # errors 10%, 25%, 0%, 5%
    m = e2e_metrics(y, p)
    assert np.isclose(m["mape"], (0.10 + 0.25 + 0.0 + 0.05) / 4)
    assert m["acc10"] == 0.75  # 10% counts as within ±10%
    assert np.isclose(m["rmse_ms"], np.sqrt((0.01 + 0.25 + 0 + 0.16) / 4))
    assert m["kendall_tau"] == 1.0 and m["n"] == 4
    assert e2e_metrics(y, y[::-1])["kendall_tau"] == -1.0
    # Signed error: +10% -25% 0% +5%; size classes split at 3 and 10 ms.
    assert np.isclose(m["mpe"], (0.10 - 0.25 + 0.0 + 0.05) / 4)
    small, mid = m["size_classes"]["under 3 ms"], m["size_classes"]["3-10 ms"]
    assert small["n"] == 2 and np.isclose(small["mpe"], (0.10 - 0.25) / 2)
    assert np.isclose(small["mape"], 0.175)
    assert mid["n"] == 2 and np.isclose(mid["mpe"], 0.025)
    assert "over 10 ms" not in m["size_classes"]


def test_per_type_mape_and_share():
    k = pd.DataFrame({"kernel_type": ["a", "a", "b"], "measured_ms": [1.0, 3.0, 6.0],
                      "predicted_ms": [1.2, 3.0, 3.0]})
    out = per_type_mape(k)
    assert list(out) == ["b", "a"]  # the larger share of measured time first
    assert np.isclose(out["a"]["mape"], 0.1) and out["a"]["n"] == 2
    assert np.isclose(out["b"]["mape"], 0.5) and np.isclose(out["b"]["share"], 0.6)


def test_split_is_seeded_disjoint_and_random_ordered():
    ids = [f"m{i:03d}" for i in range(100)]
    train, test = split_ids(ids, 10, seed=1)
    assert len(test) == 10 and len(train) == 90 and not set(train) & set(test)
    assert split_ids(ids, 10, seed=1) == (train, test)
    assert split_ids(ids, 10, seed=2)[1] != test
    assert train[:30] != sorted(train)[:30]  # a prefix is a random sample, not the first ids


# -- baselines ---------------------------------------------------------------------------------
def _conv_graph(groups: int = 1):
    b = GraphBuilder("g")
    x = b.input((1, 56, 56, 64))
    x = b.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    x = b.conv2d(x, 128, 3, stride=2, padding="VALID", groups=groups, activation="RELU")
    x = b.conv2d(x, 128, 3)
    y = b.mean(x, axes=(1, 2), keep_dims=False)
    b.output(b.softmax(b.fully_connected(y, 10)))
    return b.build()


def test_nnmeter_features_follow_its_source():
    g = _conv_graph()
    units = nnmeter_units(g, deduce(g, CPU))
    names = [u.name for u in units]
    assert names == ["conv-bn-relu", "conv-bn-relu", "global-avgpool", "fc"]  # no pad/softmax
    params = 128 * (3 * 3 * 64 + 1)
    flops = 2 * 58 / 2 * 58 / 2 * params  # get_conv_flop_params: hw = input height (padded)
    assert units[0].features == (58, 64, 128, 3, 2, flops / 2e6, params / 1e6)
    fc = units[3].features
    assert fc == (128, 10, (2 * 128 + 1) * 10 / 2e6, (2 * 128 + 1) * 10 / 1e6)
    # nn-Meter ignores groups: a grouped convolution has the same features.
    g4 = _conv_graph(groups=4)
    assert nnmeter_units(g4, deduce(g4, CPU))[0].features == units[0].features


def test_nnmeter_unit_covers_every_kernel_of_its_op_on_gpu():
    g = _conv_graph()
    ks = deduce(g, GPU)
    winograd = [i for i, k in enumerate(ks) if k.type.startswith("winograd_")]
    assert len(winograd) == 3, "the 56x56x64->128 3x3 conv should be Winograd on the H100"
    conv = [u for u in nnmeter_units(g, ks) if u.name == "conv-bn-relu"]
    assert any(u.kernels == tuple(winograd) for u in conv)
    assert backend_of(GPU) == "tflite_gpu" and backend_of(CPU) == "tflite_cpu"


def test_flops_linear_recovers_a_line():
    flops = np.array([1e8, 2e8, 5e8, 1e9])
    lin = FlopsLinear.fit(flops, 0.5 + 2e-9 * flops)
    assert np.isclose(lin.intercept, 0.5) and np.isclose(lin.slope, 2e-9)
    assert np.allclose(lin.predict([3e8]), [1.1])


def test_nnmeter_baseline_sums_known_units_only():
    g = _conv_graph()
    ks = deduce(g, CPU)
    ms = np.arange(1, len(ks) + 1, dtype=float)
    nnm = NnMeterBaseline.fit([g] * 3, [ks] * 3, [ms] * 3, CPU)
    assert set(nnm.forests) == {"conv-bn-relu", "global-avgpool", "fc"}
    assert nnm.forests["fc"].n_estimators == 370 and nnm.forests["fc"].max_depth == 50
    units = nnmeter_units(g, ks)
    expected = sum(ms[list(u.kernels)].sum() for u in units)  # trained on itself
    assert np.isclose(nnm.predict([g], [ks])[0], expected, rtol=0.01)  # bootstrap: not exact
    assert expected < ms.sum()  # the pad and softmax kernels are not in nn-Meter's sum


# -- ablations ---------------------------------------------------------------------------------
def test_no_selection_merges_winograd_and_labels_sum():
    g = _conv_graph()
    ks = deduce(g, GPU)
    merged = no_selection(g, ks)
    assert len(merged) == len(ks) - 2
    conv = [k for k in merged if k.type == "conv2d"]
    assert len(conv) == 2 and not any(k.type.startswith("winograd") for k in merged)
    ms = np.arange(1.0, len(ks) + 1)
    y = labels(ks, ms, merged)
    wino = [i for i, k in enumerate(ks) if k.type.startswith("winograd_")]
    main = ks[wino[0]].main_op
    j = next(j for j, k in enumerate(merged) if k.main_op == main)
    assert y[j] == ms[wino].sum()


def test_no_fusion_splits_linked_ops_and_leaves_them_unlabelled():
    b = GraphBuilder()
    x = b.input((1, 32, 32, 16))
    y = b.conv2d(x, 16, 3)
    b.output(b.relu(b.add(y, x)))
    g = b.build()
    ks = deduce(g, GPU)
    assert len(ks) == 1 and len(ks[0].ops) >= 2, "conv + add (+ relu) fuse on the GPU"
    split = no_fusion(g, ks)
    assert [k.ops for k in split] == [(i,) for i in ks[0].ops]
    assert split[1].type in ("elementwise", "activation")
    y = labels(ks, np.array([2.0]), split)
    assert y[0] == 2.0 and np.isnan(y[1:]).all()
    assert no_fusion(g, deduce(g, CPU)) == deduce(g, CPU)  # nothing fuses on the CPU


# -- protocols and reports on simulated datasets -----------------------------------------------
@pytest.fixture(scope="module")
def cpu_data(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("cpu") / "ds", CPU, n_models=30, seed=5)


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("gpu") / "ds", GPU, n_models=30, seed=6)


def test_eval_set_aligns_measured_kernels(cpu_data):
    es = load_eval_set(cpu_data, CPU)
    assert len(es) == 30 and es.aligned.all() and es.complete().all()
    k = cpu_data.kernels(CPU)
    first = k[k.model_id == es.model_ids[0]].sort_values("kernel_index")
    assert np.allclose(es.kernel_ms[0], first["latency_ms"])


def test_protocol_split_on_cpu_reports_every_method(cpu_data, tmp_path):
    ev = protocol_split(cpu_data, CPU, families=("lasso", "gbdt"), searches=("none",))
    names = [m.name for m in ev.methods]
    assert names == ["latpred lasso (none grid)", "latpred gbdt (none grid)", "FLOPs-linear",
                     "nn-Meter RF"]  # no ablations on a CPU target
    assert ev.n_train == 27 and len(ev.test) == 3
    lasso = ev.methods[0]
    assert lasso.metrics["n"] == 3 and 0 < lasso.metrics["mape"] < 0.5
    assert "conv2d" in lasso.per_type and lasso.kernels is not None
    path = write_report(ev, tmp_path / "rep")
    text = path.read_text()
    assert "| latpred gbdt (none grid) |" in text and "nn-Meter RF" in text
    assert "noise floor: re-measuring gives" in text
    assert "## Bias by model size" in text
    for png in ("pred_vs_measured.png", "error_cdf.png", "kernel_types.png"):
        assert (tmp_path / "rep" / png).stat().st_size > 1000
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert results["n_test"] == 3 and results["methods"][0]["per_kernel_type"]


def test_protocol_split_on_gpu_adds_ablations(gpu_data):
    ev = protocol_split(gpu_data, GPU, families=("lasso",), searches=("none",))
    names = [m.name for m in ev.methods]
    assert "latpred lasso w/o kernel selection" in names and "latpred lasso w/o fusion" in names
    abl = next(m for m in ev.methods if m.kind == "ablation")
    assert abl.metrics["n"] == 3 and not abl.per_type


def test_protocol_sizes_table(cpu_data, tmp_path):
    ev = protocol_sizes(cpu_data, CPU, families=("lasso", "gbdt"), search="none",
                        sizes=(10, 20, 900), baselines=False)
    assert sorted(ev.sizes["n_train"].unique()) == [10, 20]  # 900 > available: skipped
    assert list(ev.sizes["method"]) == ["latpred lasso (none grid)",
                                        "latpred gbdt (none grid)"] * 2
    assert (ev.sizes["n"] == 3).all()
    write_report(ev, tmp_path)
    assert "## Training-set sizes" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "training_sizes.png").exists()


def test_protocol_transfer_trains_on_one_dataset_and_tests_on_another(cpu_data, tmp_path):
    other = simulate(tmp_path / "other", CPU, n_models=6, seed=11)
    ev = protocol_transfer(cpu_data, other, CPU, families=("lasso",), searches=("none",),
                           baselines=False)
    assert ev.n_train == 30 and len(ev.test) == 6
    assert not set(ev.test.model_ids) & set(load_eval_set(cpu_data, CPU).model_ids)
    assert ev.methods[0].metrics["n"] == 6


def test_evaluate_predictor_leaves_training_models_out(cpu_data):
    ids = list(cpu_data.models(CPU)["model_id"])
    model = LatencyModel.fit(cpu_data, CPU, family="lasso", search="none", model_ids=ids[:20])
    ev = evaluate_predictor(model, cpu_data.root)
    assert sorted(ev.test.model_ids) == sorted(ids[20:])
    assert any("20 models the predictor was trained on" in n for n in ev.notes)
    assert len(evaluate_predictor(model, cpu_data.root, include_training=True).test) == 30


# -- command line ------------------------------------------------------------------------------
def test_train_predict_evaluate_commands(cpu_data, tmp_path):
    from latpred.sampler import build_graph
    from latpred.tflite import write_tflite

    runner = CliRunner()
    pred = tmp_path / "pred"
    r = runner.invoke(main, ["train", "--data", str(cpu_data.root), "--target", CPU,
                             "--family", "lasso", "--search", "none", "--out", str(pred)])
    assert r.exit_code == 0, r.output
    assert (pred / "predictor.json").exists() and "conv2d" in r.output
    typed = tmp_path / "typed"   # the kind `auto` may pick, by name
    r = runner.invoke(main, ["train", "--data", str(cpu_data.root), "--target", CPU,
                             "--family", "lasso", "--search", "none", "--overhead", "typed",
                             "--out", str(typed)])
    assert r.exit_code == 0, r.output
    assert json.loads((typed / "predictor.json").read_text())["overhead"]["kind"] == "typed"
    arch = json.loads(cpu_data.models(CPU)["arch"][0])
    model_file = tmp_path / "m.tflite"
    write_tflite(build_graph(arch), model_file)
    r = runner.invoke(main, ["predict", "--predictor", str(pred), "--breakdown",
                             str(model_file)])
    assert r.exit_code == 0, r.output
    assert "CONV_2D" in r.output and "per kernel" in r.output
    r = runner.invoke(main, ["predict", "--predictor", str(pred), "--target", GPU,
                             str(model_file)])
    assert r.exit_code == 2 and "is for target host/cpu/fp32/t1" in r.output
    r = runner.invoke(main, ["evaluate", "--data", str(cpu_data.root), "--predictor", str(pred),
                             "--include-training", "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert "latpred lasso" in r.output and (tmp_path / "rep" / "report.md").exists()
    assert (tmp_path / "rep" / "error_cdf.png").exists()
    r = runner.invoke(main, ["evaluate", "--data", str(cpu_data.root), "--predictor", str(pred),
                             "--include-training", "--no-plots", "--out", str(tmp_path / "bare")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == ["report.md", "results.json"]
    assert "## Plots" not in (tmp_path / "bare" / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    ([], "either --predictor"),
    (["--protocol", "a"], "needs --target"),
    (["--protocol", "c", "--target", CPU], "--train-data"),
    (["--protocol", "b", "--target", CPU, "--sizes", "x"], "--sizes"),
])
def test_evaluate_option_errors(cpu_data, args, message):
    r = CliRunner().invoke(main, ["evaluate", "--data", str(cpu_data.root), *args])
    assert r.exit_code == 2 and message in r.output
