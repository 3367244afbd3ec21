"""The analytical-features option of LatencyModel (predictors/analytical.py): which columns it
adds, that prediction computes the same ones, persistence, and refusing inconsistent data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from latpred.cli import main
from latpred.errors import DatasetError, PredictorError
from latpred.features import FEATURES
from latpred.predictors import LatencyModel
from latpred.predictors.analytical import CONV_LIKE, add_columns, dataset_columns, schemas
from latpred.predictors.training import load_tables
from latpred.target import parse_target

GPU, CPU = "h100/gpu/fp16", "host/cpu/fp32/t1"


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    from simdata import simulate

    return simulate(tmp_path_factory.mktemp("an_gpu") / "ds", GPU, n_models=12, seed=5)


@pytest.fixture(scope="module")
def cpu_data(tmp_path_factory):
    from simdata import simulate

    return simulate(tmp_path_factory.mktemp("an_cpu") / "ds", CPU, n_models=12, seed=6)


def _graphs(ds, target):
    from latpred.sampler import build_graph

    return [build_graph(json.loads(a)) for a in ds.models(target)["arch"]]


def test_option_adds_columns_to_conv_like_types_only(gpu_data):
    plain = LatencyModel.fit(gpu_data, GPU, family="lasso", search="none")
    extra = LatencyModel.fit(gpu_data, GPU, family="lasso", search="none",
                             analytical_features=True)
    assert not plain.analytical_features and extra.analytical_features
    assert set(plain.types) == set(extra.types)
    conv = set(extra.types) & CONV_LIKE
    assert {"conv2d", "dwconv2d", "fc"} <= conv
    for t, fit in extra.types.items():
        assert plain.types[t].features == FEATURES[t]
        if t in conv:
            added = fit.features[len(FEATURES[t]):]
            assert fit.features[:len(FEATURES[t])] == FEATURES[t]
            # the H100 profile has tile shapes and the TMModel figures: all of them are there
            assert {"gemm_m", "gemm_k", "grid_64x64", "waves_128x128", "wave_util_32x32",
                    "tm_occupancy_groups", "tm_thrash_exp"} <= set(added)
        else:
            assert fit.features == FEATURES[t]


def test_cpu_target_gets_the_gemm_columns_but_no_tile_ones(cpu_data):
    model = LatencyModel.fit(cpu_data, CPU, family="lasso", search="none",
                             analytical_features=True)
    added = model.types["conv2d"].features[len(FEATURES["conv2d"]):]
    assert "gemm_m" in added and "m_out" in added
    assert not any(n.startswith(("grid_", "waves_", "tm_occupancy")) for n in added)


def test_prediction_computes_the_trained_columns(gpu_data):
    """Batched, deduplicated prediction equals featurizing each kernel with its columns."""
    from latpred.deduce import deduce
    from latpred.features import CONTEXT, context_bytes, kernel_features
    from latpred.features.tile import analytical_features

    model = LatencyModel.fit(gpu_data, GPU, family="gbdt", search="none",
                             analytical_features=True)
    target = parse_target(GPU)
    graphs = _graphs(gpu_data, GPU)
    preds = model.predict_many(graphs)
    checked = 0
    for g, p in zip(graphs[:4], preds[:4]):
        kernels = deduce(g, target)
        own = [kernel_features(g, k, target) for k in kernels]
        # the graph-level column: the bytes all the graph's kernels move (features.kernel)
        context = float(context_bytes(sum(f["bytes_read"] + f["bytes_written"] for f in own)))
        for k, kf, ms in zip(kernels, own, p.kernel_ms):
            fit = model.types[k.type]
            f = {**kf, **analytical_features(g, k, target), CONTEXT: context}
            x = np.array([[f[n] for n in fit.features]])
            assert np.isclose(fit.regressor.predict(x)[0], ms, rtol=1e-12)
            checked += k.type in CONV_LIKE
    assert checked > 0


def test_save_load_round_trip_keeps_the_option(gpu_data, tmp_path):
    model = LatencyModel.fit(gpu_data, GPU, family="rf", search="none",
                             analytical_features=True)
    model.save(tmp_path / "p")
    doc = json.loads((tmp_path / "p" / "predictor.json").read_text())
    assert doc["analytical_features"] is True
    assert "grid_64x64" in doc["kernel_types"]["conv2d"]["features"]
    back = LatencyModel.load(tmp_path / "p", target=GPU)
    assert back.analytical_features
    graphs = _graphs(gpu_data, GPU)
    a = [p.total_ms for p in model.predict_many(graphs)]
    b = [p.total_ms for p in back.predict_many(graphs)]
    assert np.allclose(a, b, rtol=1e-12)


def test_manifest_saying_off_for_a_model_trained_on_is_refused_at_predict(gpu_data, tmp_path):
    LatencyModel.fit(gpu_data, GPU, family="lasso", search="none",
                     analytical_features=True).save(tmp_path / "p")
    path = tmp_path / "p" / "predictor.json"
    doc = json.loads(path.read_text())
    doc["analytical_features"] = False
    path.write_text(json.dumps(doc))
    wrong = LatencyModel.load(tmp_path / "p")
    with pytest.raises(PredictorError, match="expects feature 'gemm_m'.*retrain"):
        wrong.predict(_graphs(gpu_data, GPU)[0])
    doc["analytical_features"] = "yes"
    path.write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="non-boolean 'analytical_features'"):
        LatencyModel.load(tmp_path / "p")


def test_old_manifest_without_the_key_loads_as_off(cpu_data, tmp_path):
    LatencyModel.fit(cpu_data, CPU, family="lasso", search="none").save(tmp_path / "p")
    path = tmp_path / "p" / "predictor.json"
    doc = json.loads(path.read_text())
    assert doc.pop("analytical_features") is False
    path.write_text(json.dumps(doc))
    assert not LatencyModel.load(tmp_path / "p").analytical_features


def test_tables_without_the_columns_are_refused(gpu_data):
    kernels, models = load_tables(gpu_data, GPU)
    with pytest.raises(DatasetError, match="no analytical feature columns"):
        LatencyModel.fit_tables(kernels, models, GPU, "lasso", "none",
                                analytical_features=True)


def test_kernels_not_matching_the_rebuilt_deduction_are_left_out(gpu_data):
    kernels = gpu_data.kernels(GPU)
    cols = dataset_columns(gpu_data, GPU)
    assert set(cols["kernel_type"]) <= CONV_LIKE and cols["f_gemm_m"].notna().all()
    # one conv2d row whose stored kernel type disagrees with the rebuilt deduction
    i = kernels.index[kernels["kernel_type"] == "conv2d"][0]
    kernels.loc[i, "kernel_type"] = "dwconv2d"
    joined = add_columns(kernels, cols)
    assert np.isnan(joined.loc[i, "f_gemm_m"])
    schema, kept = schemas(joined, parse_target(GPU))
    assert len(kept) == len(joined) - 1
    assert "gemm_m" in schema["dwconv2d"]  # the bad row did not strip the type's columns


def test_cli_train_flag_and_evaluate_refusal(cpu_data, tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["train", "--data", str(cpu_data.root), "--target", CPU,
                             "--family", "lasso", "--search", "none", "--analytical-features",
                             "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p" / "predictor.json").read_text())["analytical_features"]
    r = runner.invoke(main, ["evaluate", "--data", str(cpu_data.root), "--predictor",
                             str(tmp_path / "p"), "--analytical-features"])
    assert r.exit_code == 2 and "already says whether it uses them" in r.output


def test_evaluate_trains_each_family_both_ways(cpu_data):
    from latpred.evaluate import protocol_split
    from latpred.evaluate.report import kernel_accuracy

    ev = protocol_split(cpu_data.root, CPU, families=("lasso",), searches=("none",),
                        baselines=False, ablations=False, analytical=True)
    assert [m.name for m in ev.methods] == ["latpred lasso (none grid)",
                                             "latpred lasso (none grid) + analytical"]
    acc = kernel_accuracy(ev.methods[1])
    assert acc["all"]["n"] > acc["conv_like"]["n"] > 0
