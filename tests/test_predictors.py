"""Estimators, objective, searches, overhead, LatencyModel persistence and safety."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimators_unfitted

import sys
from pathlib import Path

from latpred.errors import ConfigError, LatpredError, PredictorError
from latpred.predictors import (FAMILIES, LatencyModel, PercentGBDT, PositiveLasso,
                                OverheadModel, SearchSpec, fit_overhead, fit_searched,
                                load_search)
from latpred.predictors.objective import mspe, mspe_objective, percentage_weights
from latpred.predictors.overhead import within_one_se
from latpred.predictors.training import feature_schema, fit_fallback

sys.path.insert(0, str(Path(__file__).parent))  # tests/simdata.py

FAST = {"lasso": {}, "rf": {"n_estimators": 10}, "gbdt": {"n_estimators": 100},
        "mlp": {"max_epochs": 150, "patience": 20, "hidden_layers": 2, "width": 32}}


def synthetic(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Latency = affine function of FLOPs and bytes, spanning two orders of magnitude, 1% noise."""
    rng = np.random.default_rng(seed)
    flops = rng.uniform(1e6, 1e8, n)
    nbytes = rng.uniform(1e4, 1e6, n)
    X = np.column_stack([flops, nbytes, rng.uniform(0, 1, n)])  # third column is noise
    y = (0.01 + flops * 2e-8 + nbytes * 1e-6) * rng.lognormal(0, 0.01, n)
    return X, y


# -- objective ---------------------------------------------------------------------------------
def test_percentage_weights_make_weighted_squares_equal_mspe():
    y = np.array([0.1, 1.0, 10.0])
    pred = np.array([0.11, 0.9, 12.0])
    w = percentage_weights(y)
    assert np.isclose(w.mean(), 1.0)
    assert np.isclose(np.mean(w * (pred - y) ** 2) * np.mean(1 / y**2), mspe(y, pred))


def test_non_positive_latency_is_refused():
    X, y = synthetic(20)
    y[3] = 0.0
    with pytest.raises(LatpredError, match="positive latencies"):
        PositiveLasso().fit(X, y)


def test_weighted_l2_gbdt_equals_explicit_eq1_objective():
    X, y = synthetic(300)
    params = {"n_estimators": 30, "min_child_samples": 5}
    a = PercentGBDT(**params).fit(X, y).predict(X)
    b = PercentGBDT(**params).fit(X, y, objective=mspe_objective).predict(X)
    assert np.allclose(a, b, rtol=1e-6)


# -- the four families -------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_learns_and_round_trips(family):
    X, y = synthetic()
    est = FAMILIES[family](**FAST[family]).fit(X[:500], y[:500])
    pred = est.predict(X[500:])
    mape = np.mean(np.abs(pred - y[500:]) / y[500:])
    assert mape < {"lasso": 0.03, "rf": 0.12, "gbdt": 0.08, "mlp": 0.08}[family]
    data, params = est.export()
    back = type(est).restore(data, json.loads(json.dumps(params)))
    assert np.allclose(back.predict(X[500:]), pred)
    assert clone(est).get_params() == est.get_params()  # sklearn contract: params in __init__


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_fits_a_kernel_type_seen_once(family):
    # a few models can hold a kernel type once: the fit is what one row says, not an error
    X, y = synthetic(40)
    est = FAMILIES[family](**FAST[family]).fit(X[:1], y[:1])
    pred = est.predict(X)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)
    assert abs(est.predict(X[:1])[0] / y[0] - 1) < 0.25


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_is_deterministic_and_checks_inputs(family):
    X, y = synthetic(120)
    a = FAMILIES[family](**FAST[family]).fit(X, y).predict(X)
    b = FAMILIES[family](**FAST[family]).fit(X, y).predict(X)
    assert np.array_equal(a, b)
    check_estimators_unfitted(family, FAMILIES[family]())
    with pytest.raises(ValueError):
        FAMILIES[family](**FAST[family]).fit(X, y).predict(X[:, :2])


def test_lasso_weights_are_non_negative_and_percentage_driven():
    rng = np.random.default_rng(1)
    X = rng.uniform(1, 100, (200, 2))
    y = 0.5 + 0.1 * X[:, 0] + rng.normal(0, 0.01, 200)
    est = PositiveLasso(alpha=1e-5).fit(np.column_stack([X[:, 0], -X[:, 0]]), y)
    assert (est.coef_ >= 0).all()
    assert est.coef_[1] == 0  # a negatively correlated feature cannot get weight


# -- searches ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("name", ["paper", "latpred"])
def test_shipped_search_configs_load(family, name):
    spec = load_search(family, name)
    assert spec.family == family and spec.params
    if family == "lasso":
        alphas = spec.params["alpha"]
        assert min(alphas) <= 1e-5 * (1 + 1e-9) and np.isclose(max(alphas), 1e2)
        # the paper's grid is the paper's model: the raw columns
        assert spec.estimator().design == ("raw" if name == "paper" else "physics")


def test_search_picks_by_cross_validation(tmp_path):
    cfg = tmp_path / "lasso.yaml"
    cfg.write_text("searches:\n  s:\n    cv: 3\n    params:\n      alpha: [1.0e-5, 100.0]\n")
    X, y = synthetic(200)
    result = fit_searched(load_search("lasso", "s", cfg), X, y)
    assert result.best_params == {"alpha": 1e-5}  # a huge alpha zeroes every weight
    assert result.n_candidates == 2 and result.cv_mape < 0.05


def test_search_folds_keep_each_model_whole(tmp_path):
    cfg = tmp_path / "lasso.yaml"
    cfg.write_text("searches:\n  s:\n    cv: 3\n    params:\n      alpha: [1.0e-5, 100.0]\n")
    X, y = synthetic(200)
    spec = load_search("lasso", "s", cfg)
    # 200 rows of two models: two folds of one model each
    two = fit_searched(spec, X, y, groups=np.repeat(["a", "b"], 100))
    assert two.n_candidates == 2 and two.cv_mape < 0.05
    # rows of one model cannot be split by model: no search, the defaults are fitted
    one = fit_searched(spec, X, y, groups=np.repeat("a", 200))
    assert one.cv_mape is None and one.best_params == {}


@pytest.mark.parametrize("text, match", [
    ("searches:\n  s:\n    params:\n      depth: [1]\n", "does not have"),
    ("searches:\n  s:\n    params:\n      alpha: []\n", "non-empty list"),
    ("searches:\n  s:\n    method: bayes\n", "method"),
    ("searches: {}\n", "no search named"),
    ("searches: [\n", "Cannot read"),
])
def test_bad_search_config_is_a_config_error(tmp_path, text, match):
    cfg = tmp_path / "lasso.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_search("lasso", "s", cfg)


def test_unknown_family_is_refused():
    with pytest.raises(ConfigError, match="Unknown predictor family"):
        load_search("svm", "paper")


# -- overhead ----------------------------------------------------------------------------------
def test_overhead_learns_per_kernel_cost_and_paper_constant():
    rng = np.random.default_rng(2)
    n = rng.integers(10, 200, 80)
    s = rng.uniform(1, 20, 80)
    e = s + 0.3 + 0.01 * n
    auto = fit_overhead(n, s, e, "auto")
    assert auto.kind == "linear"
    assert np.isclose(auto.intercept, 0.3, atol=1e-6) and np.isclose(auto.per_kernel, 0.01)
    const = fit_overhead(n, s, e, "constant")
    assert np.isclose(const.intercept, np.mean(e - s))
    # A truly constant overhead keeps the paper's model.
    assert fit_overhead(n, s, s + 0.5 + rng.normal(0, 0.05, 80), "auto").kind == "constant"


def typed_models(n_models: int, seed: int = 3):
    """Models whose overhead costs 0.002 ms per 'a' kernel and 0.02 per 'b' kernel."""
    rng = np.random.default_rng(seed)
    counts = pd.DataFrame({"a": rng.integers(5, 40, n_models),
                           "b": rng.integers(0, 6, n_models)}).astype(float)
    s = rng.uniform(0.2, 2, n_models)
    e = s + 0.05 + 0.002 * counts["a"] + 0.02 * counts["b"] + 0.1 * s
    return counts, s, e.to_numpy()


def test_typed_overhead_learns_a_cost_per_kernel_type():
    counts, s, e = typed_models(200)
    n = counts.sum(axis=1).to_numpy()
    auto = fit_overhead(n, s, e, "typed", type_counts=counts)
    assert auto.kind == "typed" and dict(auto.per_type) == pytest.approx({"a": .002, "b": .02})
    assert auto.per_kernel_ms == pytest.approx(0.1) and auto.intercept == pytest.approx(0.05)
    # per_kernel: the training kernels' mean cost, for a type the fit never saw.
    assert auto.per_kernel == pytest.approx((.002 * counts.a.sum() + .02 * counts.b.sum())
                                            / counts.to_numpy().sum())
    # Model 0: two 'a', one 'b' and one kernel of an unseen type; model 1: three unseen.
    got = auto.predict([4, 3], [1.0, 1.0], {"a": np.array([2, 0]), "b": np.array([1, 0])})
    want_unseen = 0.05 + 3 * auto.per_kernel + 0.1       # three kernels of an unseen type
    assert got == pytest.approx([0.05 + .004 + .02 + auto.per_kernel + 0.1, want_unseen])
    with pytest.raises(LatpredError, match="per type"):
        auto.predict(3, 1.0)
    assert OverheadModel.from_json(auto.to_json()) == auto
    # `auto` never picks `typed`, even where per-type costs are the truth: the training models'
    # folds cannot tell whether those costs carry to other models (overhead.py's table).
    assert fit_overhead(n, s, e, "auto", type_counts=counts).kind == "linear"
    assert fit_overhead(n, s, e, "auto").kind == "linear"
    with pytest.raises(LatpredError, match="kernel counts per type"):
        fit_overhead(n, s, e, "typed")


def test_auto_overhead_needs_a_gain_beyond_the_noise():
    # One cost for every kernel (0.005 ms) and 2% label noise: linear beats constant by far
    # more than one standard error of the paired per-model differences.
    rng = np.random.default_rng(0)
    counts = pd.DataFrame({"a": rng.integers(5, 40, 200), "b": rng.integers(0, 6, 200)}
                          ).astype(float)
    s = rng.uniform(0.2, 2, 200)
    n = counts.sum(axis=1).to_numpy()
    e = (s + 0.05 + 0.005 * n + 0.1 * s) * rng.lognormal(0, 0.02, 200)
    assert fit_overhead(n, s, e, "auto", type_counts=counts).kind == "linear"
    assert within_one_se(np.array([1.0, 1.2, 0.9]), np.array([1.0, 1.0, 1.0]))
    assert not within_one_se(np.array([1.1, 1.2, 1.1]), np.array([1.0, 1.0, 1.0]))


def test_typed_overhead_pools_types_of_few_models():
    counts, s, e = typed_models(200)
    # 'c' kernels in 5 models only (cost 0.01 each): no cost of their own, the pooled one.
    counts["c"] = 0.0
    counts.loc[:4, "c"] = 3.0
    e = e + 0.01 * counts["c"].to_numpy()
    fit = fit_overhead(counts.sum(axis=1), s, e, "typed", type_counts=counts)
    assert fit.types == ("a", "b") and fit.per_kernel == pytest.approx(0.01)
    assert dict(fit.per_type) == pytest.approx({"a": .002, "b": .02})


def test_overhead_needs_models():
    with pytest.raises(LatpredError, match="overhead cannot be learned"):
        fit_overhead([], [], [], "auto")


# -- LatencyModel on synthetic tables ----------------------------------------------------------
def tables(n_models: int = 40, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kernel and model rows as training.load_tables returns them, with known latencies."""
    rng = np.random.default_rng(seed)
    krows, mrows = [], []
    for m in range(n_models):
        total, count = 0.0, 0
        for _ in range(rng.integers(3, 8)):
            flops, nb = rng.uniform(1e6, 1e8), rng.uniform(1e4, 1e6)
            ms = 0.01 + flops * 2e-8 + nb * 1e-6
            krows.append({"model_id": f"m{m}", "kernel_type": "toy_conv", "latency_ms": ms,
                          "f_flops": flops, "f_bytes_read": nb, "f_kernel": 3.0,
                          "f_bytes_written": nb / 2})
            total, count = total + ms, count + 1
        nb = rng.uniform(1e4, 1e6)
        ms = 0.005 + nb * 2e-6
        krows.append({"model_id": f"m{m}", "kernel_type": "toy_add", "latency_ms": ms,
                      "f_flops": nb / 4, "f_bytes_read": nb, "f_kernel": np.nan,
                      "f_bytes_written": nb / 2})
        total, count = total + ms, count + 1
        mrows.append({"model_id": f"m{m}", "latency_ms": total + 0.2 + 0.01 * count,
                      "n_kernels": count, "kernel_sum_ms": total})
    return pd.DataFrame(krows), pd.DataFrame(mrows)


def test_feature_schema_is_the_columns_without_nan():
    k, _ = tables(3)
    assert feature_schema("toy_conv", k[k.kernel_type == "toy_conv"]) == (
        "flops", "bytes_read", "kernel", "bytes_written")
    assert feature_schema("toy_add", k[k.kernel_type == "toy_add"]) == (
        "flops", "bytes_read", "bytes_written")


def quick(family: str) -> SearchSpec:
    """No search, small fixed hyperparameters: for tests of everything but accuracy."""
    return SearchSpec(family, "quick", method="none", fixed=FAST[family])


def fitted(family: str = "lasso") -> LatencyModel:
    k, m = tables()
    return LatencyModel.fit_tables(k, m, "host/cpu/fp32/t1", family, search="paper")


def test_fit_tables_trains_each_type_and_overhead():
    model = fitted()
    assert set(model.types) == {"toy_conv", "toy_add"}
    assert model.types["toy_conv"].metrics["train_mape"] < 0.02
    assert model.types["toy_conv"].metrics["cv_mape"] < 0.02
    assert model.overhead.n_models == 40
    assert model.fallback is not None and "flops" in model.fallback.features


@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_load_round_trip(tmp_path, family):
    k, m = tables(15)
    model = LatencyModel.fit_tables(k, m, "host/cpu/fp32/t1", family, search=quick(family))
    model.save(tmp_path / "p")
    doc = json.loads((tmp_path / "p" / "predictor.json").read_text())
    assert doc["format_version"] == 1 and doc["target"] == "host/cpu/fp32/t1"
    assert doc["kernel_types"]["toy_add"]["features"] == ["flops", "bytes_read",
                                                             "bytes_written"]
    back = LatencyModel.load(tmp_path / "p", target="host/cpu/fp32/t1")
    X = k[k.kernel_type == "toy_conv"][["f_flops", "f_bytes_read", "f_kernel", "f_bytes_written"]]
    assert np.allclose(back.types["toy_conv"].regressor.predict(X.to_numpy()),
                       model.types["toy_conv"].regressor.predict(X.to_numpy()))
    assert back.overhead == model.overhead


def test_load_refuses_other_target_version_and_tampering(tmp_path):
    fitted().save(tmp_path)
    with pytest.raises(PredictorError, match="is for target host/cpu/fp32/t1, not pixel4"):
        LatencyModel.load(tmp_path, target="pixel4/gpu/fp16")
    art = tmp_path / "toy_conv.json"
    art.write_bytes(art.read_bytes().replace(b"[", b"[ ", 1))
    with pytest.raises(PredictorError, match="sha256"):
        LatencyModel.load(tmp_path)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    doc["format_version"] = 2
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="format version 2"):
        LatencyModel.load(tmp_path)


def test_load_refuses_path_escape(tmp_path):
    fitted().save(tmp_path)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    doc["kernel_types"]["toy_conv"]["artifact"] = "../toy_conv.json"
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="not a plain file name"):
        LatencyModel.load(tmp_path)


class _Payload:
    """Unpickling this runs code that leaves a marker file: the attack a loader must resist."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("family", ["lasso", "rf", "gbdt", "mlp"])
def test_malicious_pickle_artifact_is_refused_without_running(tmp_path, family):
    k, m = tables(15)
    LatencyModel.fit_tables(k, m, "host/cpu/fp32/t1", family, search=quick(family)).save(tmp_path)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(str(marker)))
    doc = json.loads((tmp_path / "predictor.json").read_text())
    entry = doc["kernel_types"]["toy_conv"]
    # The attacker controls the whole directory, so the recorded hash matches the payload.
    (tmp_path / entry["artifact"]).write_bytes(payload)
    entry["sha256"] = hashlib.sha256(payload).hexdigest()
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="refusing it"):
        LatencyModel.load(tmp_path)
    assert not marker.exists()


def test_skops_artifact_with_untrusted_type_is_refused(tmp_path):
    import skops.io as sio

    k, m = tables(15)
    LatencyModel.fit_tables(k, m, "host/cpu/fp32/t1", "rf", search="none").save(tmp_path)
    data = sio.dumps({"hook": hashlib.sha256})  # a callable skops does not trust
    doc = json.loads((tmp_path / "predictor.json").read_text())
    entry = doc["kernel_types"]["toy_conv"]
    (tmp_path / entry["artifact"]).write_bytes(data)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="not a valid rf model"):
        LatencyModel.load(tmp_path)


def test_missing_predictor_directory_is_a_clear_error(tmp_path):
    with pytest.raises(PredictorError, match="predictor.json is missing"):
        LatencyModel.load(tmp_path)


def test_fallback_is_trained_on_shared_cost_features():
    k, _ = tables()
    fb = fit_fallback(k)
    assert fb.features == ("flops", "bytes_read", "bytes_written")
    y = k["latency_ms"].to_numpy()
    pred = fb.regressor.predict(k[["f_flops", "f_bytes_read", "f_bytes_written"]].to_numpy())
    assert (pred > 0).all() and np.median(np.abs(pred - y) / y) < 0.5


@pytest.mark.parametrize("family", ["rf", "gbdt"])
def test_linear_base_ratio_fits_and_round_trips(family):
    X, y = synthetic()
    plain = FAMILIES[family](**FAST[family]).fit(X[:500], y[:500])
    ratio = FAMILIES[family](**FAST[family], base="lasso").fit(X[:500], y[:500])

    def err(est):
        return np.mean(np.abs(est.predict(X[500:]) - y[500:]) / y[500:])

    # The latency is linear in the features here, so the ratio to the baseline is nearly
    # constant and the trees extrapolate far better.
    assert err(ratio) < err(plain) / 2
    data, params = ratio.export()
    assert "linear_base" in params
    back = type(ratio).restore(data, json.loads(json.dumps(params)))
    assert np.allclose(back.predict(X[500:]), ratio.predict(X[500:]))


# -- the whole flow on a simulated dataset (real graphs, deduction and features) ---------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from simdata import simulate

    return simulate(tmp_path_factory.mktemp("sim") / "ds", n_models=40, seed=3)


def _graphs(ds, target="host/cpu/fp32/t1"):
    from latpred.sampler import build_graph

    models = ds.models(target)
    return models, [build_graph(json.loads(a)) for a in models["arch"]]


def test_fit_on_dataset_and_predict_matches_measurement(simulated):
    models, graphs = _graphs(simulated)
    train = list(models["model_id"][:30])
    spec = SearchSpec("gbdt", "t", method="none", fixed={"base": "lasso"})
    model = LatencyModel.fit(simulated, "host/cpu/fp32/t1", family="gbdt", search=spec,
                             model_ids=train)
    assert model.training["n_models"] == 30
    preds = model.predict_many(graphs[30:])
    y = models["latency_ms"].to_numpy()[30:]
    total = np.array([p.total_ms for p in preds])
    assert np.mean(np.abs(total - y) / y) < 0.15
    p = preds[0]
    assert np.isclose(p.total_ms, p.kernel_sum_ms + p.overhead_ms)
    assert len(p.kernels) == len(p.kernel_ms) and (p.kernel_ms > 0).all()
    rows = p.breakdown(graphs[30])
    assert rows[0]["ops"] == [graphs[30].ops[0].type] and not rows[0]["fallback"]
    # One model predicted alone gives the batched figure.
    assert np.isclose(model.predict(graphs[30]).total_ms, p.total_ms)


@pytest.fixture(scope="module")
def simulated_gpu(tmp_path_factory):
    from simdata import simulate

    return simulate(tmp_path_factory.mktemp("simgpu") / "ds", "h100/gpu/fp16", n_models=15,
                    seed=4)


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_predict_many_dedup_equals_per_kernel_featurization(simulated, simulated_gpu, which):
    from latpred.deduce import deduce
    from latpred.features import CONTEXT, context_bytes, kernel_features
    from latpred.target import parse_target

    ds, name = {"cpu": (simulated, "host/cpu/fp32/t1"),
                "gpu": (simulated_gpu, "h100/gpu/fp16")}[which]
    _, graphs = _graphs(ds, name)
    model = LatencyModel.fit(ds, name, family="lasso", search="none")
    assert CONTEXT in model.types["conv2d"].features
    target = parse_target(name)
    preds = model.predict_many(graphs)
    fused = sum(len(k.ops) > 1 for p in preds for k in p.kernels)
    assert (fused > 0) == (which == "gpu")  # the GPU case exercises multi-op kernel keys
    for g, p in zip(graphs[:10], preds[:10]):
        feats = [kernel_features(g, k, target) for k in deduce(g, target)]
        # The graph-level column: the bytes all the graph's kernels read and write.
        context = context_bytes(sum(f["bytes_read"] + f["bytes_written"] for f in feats))
        for k, f, ms in zip(deduce(g, target), feats, p.kernel_ms):
            fit = model.types[k.type]
            f = {**f, CONTEXT: context}
            x = np.array([[f[n] for n in fit.features]])
            assert np.isclose(fit.regressor.predict(x)[0], ms, rtol=1e-12)


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_predict_many_equals_predicting_each_graph_alone(simulated, simulated_gpu, which):
    """Batching, configuration dedup and kernels shared across graphs change no figure: over
    sampled NAS candidates and every zoo model, predict_many gives what predict gives alone."""
    from simdata import SPACE

    from latpred.sampler import build_graph, sample
    from latpred.zoo import ZOO, build

    ds, name = {"cpu": (simulated, "host/cpu/fp32/t1"),
                "gpu": (simulated_gpu, "h100/gpu/fp16")}[which]
    model = LatencyModel.fit(ds, name, family="gbdt", search="none")
    graphs = [build_graph(a) for a in sample(SPACE, 150, seed=11)] + [build(n) for n in ZOO]
    # without the models LiteRT's GPU accelerator would not run (ShuffleNetV2's 5-D ops left
    # to the CPU, grouped convolutions that crash it)
    graphs = [g for g in graphs if _runs(g, name)]
    many = model.predict_many(graphs, allow_fallback=True)
    assert any(p.fallback_types for p in many)  # zoo models hold types the space lacks
    for g, p in zip(graphs, many):
        alone = model.predict(g, allow_fallback=True)
        assert alone.kernels == p.kernels and alone.fallback_types == p.fallback_types
        assert np.allclose(alone.kernel_ms, p.kernel_ms, rtol=1e-12, atol=0)
        assert np.isclose(alone.total_ms, p.total_ms, rtol=1e-12, atol=0), g.name


def _runs(graph, target: str) -> bool:
    from latpred.deduce import deduce
    from latpred.errors import DelegateRefusedError

    try:
        deduce(graph, target)
    except DelegateRefusedError:
        return False
    return True


def test_a_refused_model_in_a_batch_is_named(simulated_gpu):
    from latpred.errors import DelegateRefusedError
    from latpred.zoo import build

    model = LatencyModel.fit(simulated_gpu, "h100/gpu/fp16", family="lasso", search="none")
    graphs = [build("mobilenet_v2_1.0"), build("shufflenet_v2_1.0")]
    with pytest.raises(DelegateRefusedError, match=r"^Model 1 of the batch \(.*left for the CPU"):
        model.predict_many(graphs, allow_fallback=True)
    with pytest.raises(DelegateRefusedError, match=r"^The LiteRT 2.3 ML Drift GPU accelerator"):
        model.predict(graphs[1], allow_fallback=True)


def test_missing_kernel_type_is_named_or_flagged_fallback(simulated):
    _, graphs = _graphs(simulated)
    model = LatencyModel.fit(simulated, "host/cpu/fp32/t1", family="lasso", search="none")
    types = {t: f for t, f in model.types.items() if t not in ("softmax", "fc")}
    crippled = LatencyModel(model.target, model.family, types, model.overhead, model.fallback)
    with pytest.raises(PredictorError, match="no regressor for kernel type.*fc, softmax"):
        crippled.predict(graphs[0])
    p = crippled.predict(graphs[0], allow_fallback=True)
    assert p.fallback_types == ("fc", "softmax")
    ks = [ms for k, ms in zip(p.kernels, p.kernel_ms) if k.type in ("fc", "softmax")]
    assert len(ks) == 2 and all(ms > 0 for ms in ks)
    no_fb = LatencyModel(model.target, model.family, types, model.overhead, None)
    with pytest.raises(PredictorError, match="no fallback was trained"):
        no_fb.predict(graphs[0], allow_fallback=True)


def test_predict_from_tflite_file_and_saved_predictor(simulated, tmp_path):
    from latpred.tflite import write_tflite

    _, graphs = _graphs(simulated)
    model = LatencyModel.fit(simulated, "host/cpu/fp32/t1", family="gbdt", search="none")
    model.save(tmp_path / "p")
    path = tmp_path / "m.tflite"
    write_tflite(graphs[0], path)
    loaded = LatencyModel.load(tmp_path / "p")
    assert np.isclose(loaded.predict(path).total_ms, model.predict(graphs[0]).total_ms)


def test_fit_on_unknown_target_is_a_dataset_error(simulated):
    with pytest.raises(LatpredError, match="no measurements for target pixel4/gpu/fp16"):
        LatencyModel.fit(simulated, "pixel4/gpu/fp16", family="lasso", search="none")


def test_forest_sees_the_slow_kernels_despite_percentage_weights():
    # Latencies over four orders of magnitude: weights 1/y^2 span eight. A forest whose
    # bootstrap draws rows by weight (scikit-learn 1.9) would hardly ever see the slowest rows.
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 4, (800, 1))
    y = 10 ** (x[:, 0] - 3) * rng.lognormal(0, 0.01, 800)
    est = FAMILIES["rf"](n_estimators=10).fit(x[:600], y[:600])
    slow = y[600:] > 1.0
    ratio = est.predict(x[600:][slow]) / y[600:][slow]
    assert abs(np.median(ratio) - 1) < 0.05


def test_a_constant_column_with_rounding_noise_standardises_to_zero():
    """A constant feature whose mean is off by an ulp must not explode unseen values."""
    from latpred.predictors.base import standardize_fit

    X = np.column_stack([np.full(1000, np.log1p(3.0)), np.arange(1000.0)])
    mean, scale = standardize_fit(X)
    assert scale[0] == 1.0
    unseen = (np.array([np.log1p(5.0), 3.0]) - mean) / scale
    assert abs(unseen[0]) < 1.0


def test_training_runs_with_one_blas_thread(monkeypatch):
    """Idle BLAS/OpenMP pool threads spin on a busy shared machine; the fits use one."""
    from threadpoolctl import threadpool_info

    from latpred.predictors import training
    from latpred.predictors.search import load_search

    seen = []

    def record(*args, **kwargs):
        seen.append({i["internal_api"]: i["num_threads"] for i in threadpool_info()})
        return None

    monkeypatch.setattr(training, "fit_type", record)
    rows = pd.DataFrame({"kernel_type": ["a", "a", "b"], "latency_ms": [1.0, 2.0, 3.0]})
    training.fit_all_types(rows, load_search("lasso", "none"))
    assert len(seen) == 2 and all(set(s.values()) <= {1} for s in seen)


@pytest.mark.parametrize("kernel_type, grouped", [("conv2d", True), ("dwconv2d", False)])
def test_lasso_alpha_search_equals_gridsearchcv(kernel_type, grouped):
    """`fit_searched` scores a Lasso's alphas itself (one design matrix a fold); it must pick
    the alpha, score and weights GridSearchCV would, on real kernel rows with named columns."""
    from sklearn.model_selection import GridSearchCV, GroupKFold, KFold

    from latpred.predictors.objective import neg_mape_scorer
    from latpred.predictors.training import FEATURE_PREFIX, load_tables

    root = Path(__file__).resolve().parents[1] / "datasets" / "host-cpu-small"
    kernels, _ = load_tables(root, "host/cpu/fp32/t1")
    rows = kernels[kernels["kernel_type"] == kernel_type]
    features = feature_schema(kernel_type, rows)
    X = pd.DataFrame(rows[[FEATURE_PREFIX + f for f in features]].to_numpy(np.float64),
                     columns=list(features))
    y = rows["latency_ms"].to_numpy(np.float64)
    groups = rows["model_id"].to_numpy() if grouped else None
    spec = load_search("lasso", "latpred")
    ours = fit_searched(spec, X, y, seed=3, groups=groups)
    cv = (list(GroupKFold(5, shuffle=True, random_state=3).split(X, y, groups)) if grouped
          else KFold(5, shuffle=True, random_state=3))
    grid = GridSearchCV(PositiveLasso(), {"alpha": list(spec.params["alpha"])},
                        scoring=neg_mape_scorer, cv=cv).fit(X, y)
    assert ours.best_params == grid.best_params_
    assert ours.cv_mape == -grid.best_score_
    assert ours.n_candidates == len(spec.params["alpha"])
    np.testing.assert_array_equal(ours.estimator.predict(X), grid.best_estimator_.predict(X))
