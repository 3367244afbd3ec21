"""Few-shot adaptation (issue 17 part 3) on simulated device pairs: a source device and a new
one whose kernel types run at known, different speeds."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from latpred.cli import main
from latpred.errors import PredictorError
from latpred.predictors import LatencyModel
from latpred.predictors.adapt import SIMPLEST_FIRST, adapt, adapt_dataset
from latpred.predictors.adapt.wrappers import AdaptedRegressor, StackedRegressor
from latpred.predictors.training import load_tables

sys.path.insert(0, str(Path(__file__).parent))  # tests/simdata.py
from simdata import simulate  # noqa: E402

SRC, NEW = "host/cpu/fp32/t1", "host/cpu/fp32/t2"
# The new device: convolutions much faster, depthwise slower, everything else 20% faster.
SPEED = {"conv2d": 0.55, "dwconv2d": 1.4, "fc": 0.7}
OTHER = 0.8


def _new_device_scale() -> dict[str, float]:
    types = ["conv2d", "grouped_conv2d", "dwconv2d", "fc", "pool", "elementwise", "activation",
             "mean", "softmax", "reshape", "concat", "pad", "other"]
    return {t: SPEED.get(t, OTHER) for t in types}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fewshot")
    src_ds = simulate(root / "src", SRC, n_models=60, seed=0)
    new_ds = simulate(root / "new", NEW, n_models=50, seed=1, type_scale=_new_device_scale())
    source = LatencyModel.fit(src_ds, SRC, family="lasso", search="latpred")
    return source, new_ds, root


def _split(ds, n):
    kernels, models = load_tables(ds, NEW)
    ids = sorted(models["model_id"])
    few, rest = ids[:n], ids[n:]
    return (kernels[kernels["model_id"].isin(few)], models[models["model_id"].isin(few)],
            kernels[kernels["model_id"].isin(rest)], models[models["model_id"].isin(rest)])


def _e2e_mape(model, ds, ids):
    from latpred.evaluate.data import load_eval_set

    test = load_eval_set(ds, NEW, ids)
    pred = np.array([p.total_ms for p in model.predict_kernels(test.graphs, test.kernels,
                                                                 allow_fallback=True)])
    return float(np.mean(np.abs(pred - test.measured_ms) / test.measured_ms))


def test_scale_recovers_each_kernel_types_speed_from_ten_models(pair):
    source, new_ds, _ = pair
    k, m, _, m_rest = _split(new_ds, 10)
    model = adapt(source, k, m, NEW, "scale")
    assert model.target == NEW and model.training["adapted_from"] == SRC
    for ktype, want in SPEED.items():
        if ktype in model.types and model.types[ktype].metrics["n_rows"] >= 20:
            m_ = model.types[ktype].metrics
            assert m_["type_factor"] == pytest.approx(want, rel=0.1), ktype
            lo, hi = sorted((m_["type_factor"], m_["common_factor"]))
            assert lo <= m_["scale"] <= hi  # shrunk towards the common factor
    adapted = _e2e_mape(model, new_ds, m_rest["model_id"])
    as_is = _e2e_mape(source, new_ds, m_rest["model_id"])
    assert adapted < 0.06 and adapted < as_is / 3  # the source: 2.6% on its own device


def test_adapted_predictor_saves_loads_and_refuses_a_tampered_source(pair, tmp_path):
    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 12)
    model = adapt(source, k, m, NEW, "residual")
    assert any(isinstance(f.regressor, AdaptedRegressor) and f.regressor.residual is not None
               for f in model.types.values())
    model.save(tmp_path / "p")
    back = LatencyModel.load(tmp_path / "p", target=NEW)
    from latpred.sampler import build_graph, sample
    from simdata import SPACE

    graphs = [build_graph(a) for a in sample(SPACE, 5, 99)]
    want = [p.total_ms for p in model.predict_many(graphs, allow_fallback=True)]
    got = [p.total_ms for p in back.predict_many(graphs, allow_fallback=True)]
    assert got == pytest.approx(want, rel=1e-12)
    # an embedded source artifact edited after adaptation is refused like any artifact
    manifest = json.loads((tmp_path / "p" / "predictor.json").read_text())
    name = manifest["kernel_types"]["conv2d"]["artifact"]
    doc = json.loads((tmp_path / "p" / name).read_text())
    doc["scale"] = 2.0
    (tmp_path / "p" / name).write_text(json.dumps(doc))
    with pytest.raises(PredictorError, match="sha256"):
        LatencyModel.load(tmp_path / "p")


def test_residual_trees_are_kept_only_where_held_out_models_say_they_help():
    """`residual`'s trees on measured / scaled prediction, checked by folds grouped by model:
    a ratio that follows a feature keeps them; a ratio that is noise around the factor drops
    them (on t2 such trees priced the zoo's small models 10-14% too slow)."""
    from latpred.predictors.adapt.types import _residual_if_better

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(12), 20)
    X = pd.DataFrame({"f": rng.uniform(0, 10, 240), "g": rng.uniform(0, 10, 240)})
    p = rng.uniform(0.1, 2.0, 240)
    follows = p * np.where(X["f"] > 5, 1.5, 0.8) * rng.lognormal(0, 0.03, 240)
    trees, cv = _residual_if_better(groups, X, p, follows, 0)
    factor_error = np.sum(np.abs(p - follows)) / np.sum(follows)
    assert trees is not None and cv < factor_error / 3
    assert np.mean(np.abs(p * trees.predict(X) - follows) / follows) < 0.05
    noise = p * rng.lognormal(0, 0.1, 240)
    trees, cv = _residual_if_better(groups, X, p, noise, 0)
    assert trees is None and cv >= np.sum(np.abs(p - noise)) / np.sum(noise)
    assert _residual_if_better(groups[:40] % 2, X[:40], p[:40], follows[:40], 0) == (None, None)


def test_stacked_refits_on_the_source_prediction_and_round_trips(pair, tmp_path):
    """`stacked`: per type with rows enough, the linear family on the type's features plus the
    scaled source prediction; as good as the factor here (the new device is a factor per type)
    and saved / loaded to the same predictions."""
    source, new_ds, _ = pair
    k, m, _, m_rest = _split(new_ds, 20)
    model = adapt(source, k, m, NEW, "stacked")
    stacked = [t for t, f in model.types.items() if isinstance(f.regressor, StackedRegressor)]
    assert stacked
    for f in model.types.values():  # the factor kept only where the refit's CV did not beat it
        cv = f.metrics.get("stacked_cv_mape")
        if cv is not None and not f.metrics["stacked"]:
            assert f.metrics["train_mape"] <= cv
        trees_cv = f.metrics.get("stacked_trees_cv_mape")  # trees only where their CV won
        if f.metrics.get("stacked_trees"):
            assert trees_cv is not None and f.metrics["n_rows"] >= 40
    assert all(model.types[t].metrics["n_rows"] >= 20 for t in stacked)
    assert _e2e_mape(model, new_ds, m_rest["model_id"]) < 0.06
    model.save(tmp_path / "p")
    back = LatencyModel.load(tmp_path / "p", target=NEW)
    # a stacked type with residual trees round-trips too
    with_trees = [t for t in stacked if model.types[t].regressor.residual is not None]
    stacked = with_trees + [t for t in stacked if t not in with_trees]
    kt = k[k["kernel_type"] == stacked[0]]
    X = kt[["f_" + f for f in model.types[stacked[0]].features]].to_numpy(float)
    assert back.types[stacked[0]].regressor.predict(X) == pytest.approx(
        model.types[stacked[0]].regressor.predict(X), rel=1e-12)
    # residual trees on a stacked fit: applied as a ratio and kept through export / restore
    from latpred.predictors.adapt.types import STACKED_TREES, ratio_trees

    reg = model.types[stacked[0]].regressor
    names = list(model.types[stacked[0]].features)
    ratio = 1.0 + 0.3 * (X[:, 0] > np.median(X[:, 0]))
    treed = StackedRegressor(reg.base, reg.head, ratio_trees(pd.DataFrame(X, columns=names),
                                                              np.ones(len(X)), ratio, 0,
                                                              **STACKED_TREES))
    plain = StackedRegressor(reg.base, reg.head).predict(X)
    assert np.median(treed.predict(X)[ratio > 1] / plain[ratio > 1]) == pytest.approx(1.3, rel=0.05)
    data, params = treed.export()
    assert StackedRegressor.restore(data, params).predict(X) == pytest.approx(treed.predict(X),
                                                                              rel=1e-12)


def test_ratio_trees_leave_out_rows_predicted_at_zero():
    """A stacked linear head clipped at 0 gave one row no ratio (measured / 0): the trees are
    fitted on the other rows instead of failing on an infinite target."""
    from latpred.predictors.adapt.types import STACKED_TREES, ratio_trees

    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.uniform(1, 10, 60), "b": rng.uniform(1, 10, 60)})
    p = rng.uniform(0.5, 2.0, 60)
    y = p * np.where(X["a"] > 5, 1.2, 0.9)
    p[7] = 0.0
    trees = ratio_trees(X, p, y, 0, **STACKED_TREES)
    ratio = trees.predict(X)
    assert np.isfinite(ratio).all()
    assert np.median(ratio[X["a"] > 5]) > np.median(ratio[X["a"] <= 5])


def test_a_kernel_type_the_source_never_saw_is_learned_from_the_new_device(pair):
    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 15)
    busiest = k["kernel_type"].value_counts().index[0]
    blind = dataclasses.replace(source, types={t: f for t, f in source.types.items()
                                               if t != busiest})
    model = adapt(blind, k, m, NEW, "scale")
    assert not isinstance(model.types[busiest].regressor, AdaptedRegressor)
    assert model.types[busiest].metrics["n_rows"] == int((k["kernel_type"] == busiest).sum())


def test_auto_picks_by_cross_validation_and_records_it(pair):
    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 20)
    model = adapt(source, k, m, NEW, "auto")
    cv = model.training["method_cv_mape"]
    assert set(cv) == {"global", "scale", "residual", "stacked"} == set(SIMPLEST_FIRST)
    best = min(cv.values())
    chosen = model.training["method"]
    assert cv[chosen] <= 1.05 * best
    # nothing simpler was within 5% of the best
    simpler = SIMPLEST_FIRST[:SIMPLEST_FIRST.index(chosen)]
    assert all(cv[m] > 1.05 * best for m in simpler)
    # on this pair the types' speeds differ (0.55-1.4), so one global factor is not enough
    assert cv["global"] > cv["scale"]
    # a blend with the scratch Lasso only where its out-of-fold end-to-end MAPE is lower
    blended = any(w < 1 for w in model.training["blend_weights"].values())
    assert blended == (model.training["blend_cv_mape"] < cv[chosen])


def test_protocol_fewshot_reports_every_method_over_draws(pair, tmp_path):
    from latpred.evaluate import write_report
    from latpred.evaluate.fewshot import protocol_fewshot

    source, new_ds, _ = pair
    ev = protocol_fewshot(source, new_ds, NEW, shots=(10, 20), draws=2, n_test=20,
                          families=("lasso",))
    assert ev.protocol == "fewshot" and len(ev.test) == 20
    methods = set(ev.sizes["method"])
    assert {"adapt global", "adapt scale", "adapt residual", "adapt auto", "scratch lasso",
            "source as is",
            "source x global factor"} <= methods
    assert (ev.sizes["draws"] == 2).all() and set(ev.sizes["n_train"]) == {10, 20}
    best = ev.sizes[ev.sizes["n_train"] == 10].set_index("method")["mape"]
    assert best["adapt scale"] < best["source as is"]
    text = write_report(ev, tmp_path / "r").read_text()
    assert "few-shot adaptation" in text and "±" in text


def test_adapt_command_and_its_errors(pair, tmp_path):
    source, new_ds, root = pair
    source.save(tmp_path / "src")
    runner = CliRunner()
    res = runner.invoke(main, ["adapt", "--from", str(tmp_path / "src"), "--data",
                               str(new_ds.root), "--method", "scale", "--out",
                               str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "Adapted from host/cpu/fp32/t1 with scale on 50 models" in res.output
    res = runner.invoke(main, ["adapt", "--from", str(tmp_path / "src"), "--data",
                               str(new_ds.root), "--method", "stacked", "--out",
                               str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "with stacked on 50 models" in res.output
    assert LatencyModel.load(tmp_path / "s").training["method"] == "stacked"
    assert "overhead" in res.output
    assert LatencyModel.load(tmp_path / "a").target == NEW
    res = runner.invoke(main, ["adapt", "--from", str(tmp_path / "src"), "--data",
                               str(new_ds.root), "--target", "host/cpu/int8/t1", "--out",
                               str(tmp_path / "b")])
    assert res.exit_code == 2 and "no measurements for target host/cpu/int8/t1" in res.output
    res = runner.invoke(main, ["adapt", "--from", str(new_ds.root), "--data", str(new_ds.root),
                               "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "predictor.json is missing" in res.output


def test_adapt_dataset_needs_a_target_when_the_data_has_several(pair, tmp_path):
    from latpred.dataset_merge import merge_datasets

    source, new_ds, root = pair
    merge_datasets([new_ds.root, root / "src"], tmp_path / "both")
    with pytest.raises(PredictorError, match="name one with --target"):
        adapt_dataset(source, tmp_path / "both")


def test_a_source_of_another_precision_sees_the_new_kernels_in_its_own_bytes(pair, tmp_path):
    from latpred.predictors.adapt.types import BYTE_FEATURES

    source, _, root = pair
    int8 = simulate(root / "int8", "host/cpu/int8/t1", n_models=12, seed=3)
    kernels, models = load_tables(int8, "host/cpu/int8/t1")
    model = adapt(source, kernels, models, "host/cpu/int8/t1", "scale")
    reg = model.types["conv2d"].regressor
    want = tuple(4.0 if f in BYTE_FEATURES else 1.0 for f in model.types["conv2d"].features)
    assert reg.feature_scale == want and 4.0 in want
    rows = kernels[kernels["kernel_type"] == "conv2d"]
    X = rows[["f_" + f for f in model.types["conv2d"].features]].to_numpy(float)
    seen = source.types["conv2d"].regressor.predict(X * np.asarray(want))
    assert reg.predict(X) == pytest.approx(seen * reg.scale)
    model.save(tmp_path / "p")
    back = LatencyModel.load(tmp_path / "p").types["conv2d"].regressor
    assert back.feature_scale == want and back.predict(X) == pytest.approx(reg.predict(X))


def test_the_source_overhead_is_kept_scaled_unless_pinned_cross_validates_better(pair):
    from latpred.predictors.adapt.auto import AUTO_TOLERANCE
    from latpred.predictors.overhead import fit_overhead

    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 20)
    scaled = adapt(source, k, m, NEW, "scale", overhead="scaled")
    f, src = scaled.training["common_factor"], source.overhead
    assert scaled.training["overhead"] == "scaled" and f == pytest.approx(0.8, rel=0.3)
    # its milliseconds scale with the device; its share of the (new) kernel sum does not
    got = scaled.overhead
    assert (got.kind, got.per_kernel_ms) == (src.kind, src.per_kernel_ms)
    assert (got.intercept, got.per_kernel) == pytest.approx((src.intercept * f, src.per_kernel * f))
    refit = adapt(source, k, m, NEW, "scale", overhead="refit")
    want = fit_overhead(m["n_kernels"], m["kernel_sum_ms"], m["latency_ms"], "auto", 0)
    assert refit.overhead == want and refit.types.keys() == scaled.types.keys()
    pinned = adapt(source, k, m, NEW, "scale", overhead="pinned")
    auto = adapt(source, k, m, NEW, "auto")
    cv = auto.training["overhead_cv_mape"]
    assert set(cv) == {"scaled", "pinned"}    # `refit` only when asked for
    assert (auto.training["overhead"] == "scaled") == \
        (cv["scaled"] <= (1 + AUTO_TOLERANCE) * min(cv.values()))
    assert auto.overhead == (scaled if auto.training["overhead"] == "scaled" else pinned).overhead \
        or auto.training["method"] != "scale"
    with pytest.raises(PredictorError, match="Unknown overhead"):
        adapt(source, k, m, NEW, "scale", overhead="zero")


class _Flat:
    """A source regressor that learned nothing of a type's shape: one latency for every kernel."""

    def __init__(self, ms: float, n_features: int):
        self.ms, self.n_features_in_ = ms, n_features

    def predict(self, X):
        return np.full(len(X), self.ms)


def test_auto_blends_a_type_towards_its_scratch_fit_where_the_source_misses_its_shape(pair):
    """A type whose source regressor is flat (too few rows for `stacked`'s refit): the folds'
    kernel errors move it to the Lasso trained on the new rows, and its held-out kernels are
    predicted better than by the adapted source alone; the blend saves and loads."""
    from latpred.predictors.adapt.blend import BLEND_WEIGHTS
    from latpred.predictors.adapt.types import STACKED_MIN_ROWS

    source, new_ds, _ = pair
    k, m, k_rest, _ = _split(new_ds, 20)
    counts = k["kernel_type"].value_counts()
    ktype = next(t for t, c in counts.items() if 10 <= c < STACKED_MIN_ROWS and t in source.types)
    fit = source.types[ktype]
    flat = _Flat(float(k[k["kernel_type"] == ktype]["latency_ms"].median()), len(fit.features))
    blind = dataclasses.replace(source, types={**source.types,
                                               ktype: dataclasses.replace(fit, regressor=flat)})
    auto = adapt(blind, k, m, NEW, "auto")
    alone = adapt(blind, k, m, NEW, "auto", blend="none")
    weights = auto.training["blend_weights"]
    assert set(weights) == set(k["kernel_type"]) and set(weights.values()) <= set(BLEND_WEIGHTS)
    assert weights[ktype] < 1.0 and alone.training["blend_weights"] == {}
    rows = k_rest[k_rest["kernel_type"] == ktype]

    def held_out(model):
        f = model.types[ktype]
        p = f.regressor.predict(rows[["f_" + c for c in f.features]].to_numpy(float))
        return float(np.mean(np.abs(p - rows["latency_ms"]) / rows["latency_ms"]))

    assert held_out(auto) < 0.5 * held_out(alone)
    assert auto.training["blend_cv_mape"] is not None


def test_blended_regressor_mixes_its_parts_on_their_columns_and_round_trips(pair, tmp_path):
    from latpred.predictors.adapt.auto import type_low
    from latpred.predictors.adapt.blend import blend_types, scratch_types
    from latpred.predictors.adapt.wrappers import BlendedRegressor

    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 12)
    adapted = adapt(source, k, m, NEW, "scale").types
    scratch = scratch_types(k, 0)
    low = type_low(adapted, source.fallback, k)
    mixed = blend_types(adapted, scratch, {"conv2d": 0.5, "activation": 0.0}, low)
    assert mixed["pool"] is adapted["pool"]                        # weight 1 (by default)
    fit = mixed["conv2d"]
    assert isinstance(fit.regressor, BlendedRegressor)
    assert fit.metrics["blend_low_ms"] == low["conv2d"]

    def pred(f, ktype="conv2d"):
        rows = k[k["kernel_type"] == ktype]
        return f.regressor.predict(rows[["f_" + c for c in f.features]].to_numpy(float))

    # on the rows the scratch fits learned from (none below their smallest): the plain mixture
    assert pred(mixed["activation"], "activation") == pytest.approx(
        pred(scratch["activation"], "activation"), rel=1e-12)                  # weight 0
    want = 0.5 * pred(adapted["conv2d"]) + 0.5 * pred(scratch["conv2d"])
    assert pred(fit) == pytest.approx(want, rel=1e-12)
    data, params = fit.regressor.export()
    back = BlendedRegressor.restore(data, params)
    X = k[k["kernel_type"] == "conv2d"][["f_" + c for c in fit.features]].to_numpy(float)
    assert back.predict(X) == pytest.approx(fit.regressor.predict(X), rel=1e-12)
    assert back.low == low["conv2d"]
    doc = json.loads(data)
    del doc["low"]                # an artifact written before `low` existed
    assert BlendedRegressor.restore(json.dumps(doc).encode(), params).low == 0.0
    model = dataclasses.replace(adapt(source, k, m, NEW, "scale"), types=mixed)
    model.save(tmp_path / "p")
    loaded = LatencyModel.load(tmp_path / "p").types["conv2d"]
    assert pred(loaded) == pytest.approx(want, rel=1e-12)


def test_the_scratch_share_shrinks_below_the_rows_it_learned_from():
    """Below the smallest adapted prediction on the scratch fit's rows its share shrinks as
    adapted / low; at and above it the mixture is plain."""
    from latpred.predictors.adapt.wrappers import BlendedRegressor, mixed

    a = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 16.0])
    s = 2.0 * a + 1.0
    got = mixed(a, s, 0.25, 1.0)
    share = np.array([0.25, 0.5, 1.0, 1.0, 1.0, 1.0])
    assert got == pytest.approx(a + 0.75 * share * (s - a))
    assert mixed(a, s, 0.25, 0.0) == pytest.approx(0.25 * a + 0.75 * s)
    assert mixed(a, s, 1.0, 1.0) == pytest.approx(a)

    class Const:          # a stand-in regressor: column 0 times a factor, plus a constant
        def __init__(self, f, c=0.0):
            self.f, self.c = f, c

        def predict(self, X):
            return self.f * X[:, 0] + self.c

    reg = BlendedRegressor(Const(1.0), [0], Const(2.0, 1.0), [0], 0.25, 1.0)
    assert reg.predict(a[:, None]) == pytest.approx(got)


def _everywhere(n):
    """Per kernel row a smallest adapted prediction of 0: the scratch share never shrinks."""
    return np.zeros(n)


def test_blend_weights_follow_each_types_out_of_fold_kernel_error():
    """Per type, the adapted weight whose time-weighted out-of-fold error is within the
    tolerance of the best, the adapted prediction alone first."""
    from latpred.predictors.adapt.auto import OutOfFold

    y = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 4.0])
    kernels = pd.DataFrame({"kernel_type": ["a"] * 3 + ["b"] * 3, "latency_ms": y})
    adapted = y * np.array([1.0, 1.0, 1.0, 1.3, 0.7, 1.3])   # right on a, off on b
    scratch = y * np.array([1.2, 0.8, 1.2, 1.0, 1.0, 1.0])   # off on a, right on b
    oof = OutOfFold(kernels, pd.DataFrame(), np.zeros(6, int), np.zeros(1, int),
                    {"scale": adapted}, {"scale": _everywhere(6)}, {"lasso": scratch}, {})
    weights, errors = oof.blend_weights("scale")
    assert weights == {"a": 1.0, "b": 0.0}
    assert errors["b"][0.0] == 0.0 and errors["a"][1.0] == 0.0
    mixed = oof.blended("scale", {"a": 1.0, "b": 0.5})
    assert mixed == pytest.approx(np.concatenate([y[:3], 0.5 * adapted[3:] + 0.5 * y[3:]]))


def test_blend_weights_keep_the_adapted_type_where_the_models_disagree_about_the_gain():
    """The one-standard-error rule: a scratch fit better on the type's total error only
    because of one model (worse on the others) leaves the weight at 1; the same total gain
    spread evenly over the models moves it."""
    from latpred.predictors.adapt.auto import OutOfFold

    y = np.ones(8)
    kernels = pd.DataFrame({"kernel_type": ["a"] * 8, "latency_ms": y})
    row_model = np.arange(8)
    adapted = y * np.array([2.0, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1])   # one model far off
    lucky = y * np.array([1.0, 1.15, 1.15, 1.15, 1.15, 1.15, 1.15, 1.15])
    even = y * 1.05   # 0.40 in all, against the adapted 1.70: the same 8 models agree
    for scratch, want in ((lucky, 1.0), (even, 0.0)):
        oof = OutOfFold(kernels, pd.DataFrame(), row_model, np.zeros(8, int),
                        {"scale": adapted}, {"scale": _everywhere(8)}, {"lasso": scratch}, {})
        weights, errors = oof.blend_weights("scale")
        assert weights == {"a": want}
        # either scratch is better in total by far more than the 5% tolerance
        assert errors["a"][1.0] > 1.5 * errors["a"][0.0]


def test_blend_partner_is_the_first_whose_end_to_end_blend_is_within_the_tolerance():
    """The Lasso partner is kept unless the GBDT partner's blend is more than 5% better end to
    end out of fold; each partner's weights are its own."""
    from latpred.predictors.adapt.auto import OutOfFold
    from latpred.predictors.overhead import OverheadModel

    y = np.ones(8)
    kernels = pd.DataFrame({"kernel_type": ["a"] * 8, "latency_ms": y})
    models = pd.DataFrame({"model_id": list("abcdefgh"), "n_kernels": 1, "latency_ms": 1.0})
    zero = {("scale", "scaled"): [OverheadModel("constant", 0.0)]}
    adapted = np.full(8, 1.3)
    for gbdt, want in ((np.full(8, 1.0), "gbdt"), (np.full(8, 1.11), "lasso")):
        oof = OutOfFold(kernels, models, np.arange(8), np.zeros(8, int), {"scale": adapted},
                        {"scale": _everywhere(8)}, {"lasso": np.full(8, 1.1), "gbdt": gbdt},
                        zero)
        partner, weights, cv, every = oof.choose_blend("scale", "scaled")
        assert partner == want and weights == {"a": 0.0}
        assert set(every) == {"lasso", "gbdt"} and cv == every[want]
    assert every["lasso"] == pytest.approx(0.1) and every["gbdt"] == pytest.approx(0.11)


def test_gbdt_partner_fits_trees_where_a_type_has_rows_enough_and_round_trips(pair, tmp_path):
    from latpred.predictors.adapt.blend import (PARTNER_GBDT_MIN_ROWS, blend_types,
                                                scratch_types)
    from latpred.predictors.gbdt import PercentGBDT

    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 12)
    counts = k["kernel_type"].value_counts()
    gbdt = scratch_types(k, 0, "gbdt")
    assert set(gbdt) == set(counts.index)
    for ktype, n in counts.items():
        assert isinstance(gbdt[ktype].regressor, PercentGBDT) == (n >= PARTNER_GBDT_MIN_ROWS)
    adapted = adapt(source, k, m, NEW, "scale")
    mixed = blend_types(adapted.types, gbdt, {"conv2d": 0.5}, {"conv2d": 0.0})
    rows = k[k["kernel_type"] == "conv2d"]
    X = rows[["f_" + c for c in mixed["conv2d"].features]].to_numpy(float)
    want = mixed["conv2d"].regressor.predict(X)
    dataclasses.replace(adapted, types=mixed).save(tmp_path / "p")
    loaded = LatencyModel.load(tmp_path / "p").types["conv2d"]
    assert loaded.regressor.predict(X) == pytest.approx(want, rel=1e-12)


def test_a_source_with_a_typed_overhead_adapts_with_each_types_cost(pair):
    from latpred.dataset import Dataset

    _, new_ds, root = pair
    typed = LatencyModel.fit(Dataset.open(root / "src"), SRC, family="lasso", search="latpred",
                             overhead="typed")
    assert typed.overhead.kind == "typed"
    k, m, _, rest = _split(new_ds, 10)
    model = adapt(typed, k, m, NEW, "auto")   # the folds' end-to-end errors count types too
    if model.training["overhead"] == "scaled":
        assert model.overhead.types == typed.overhead.types
    assert _e2e_mape(model, new_ds, sorted(rest["model_id"])) < 0.25


def test_the_pinned_overhead_keeps_the_sources_cost_per_kernel_and_refits_the_rest(pair):
    """`pinned`: b = the source's cost per kernel times the common factor; a and c recovered
    exactly where the few models follow a + b n + c s, by weighted least squares otherwise."""
    from latpred.predictors.adapt.auto import PINNED_MIN_MODELS, pinned_overhead
    from latpred.predictors.overhead import OverheadModel

    rng = np.random.default_rng(3)
    n = rng.integers(15, 60, 12).astype(float)
    s = rng.uniform(0.5, 40.0, 12)
    src = OverheadModel("linear", 0.01, 0.002, 0.03)
    a, c, f = 0.05, 0.04, 1.5
    e = s + a + src.per_kernel * f * n + c * s
    got = pinned_overhead(src, f, n, s, e)
    assert (got.kind, got.n_models) == ("pinned", 12)
    assert (got.intercept, got.per_kernel, got.per_kernel_ms) == pytest.approx((a, 0.003, c))
    noisy = e * rng.uniform(0.95, 1.05, 12)
    got = pinned_overhead(src, f, n, s, noisy)
    w = 1.0 / noisy
    X = np.column_stack([np.ones(12), s]) * w[:, None]
    want, *_ = np.linalg.lstsq(X, (noisy - s - 0.003 * n) * w, rcond=None)
    assert (got.intercept, got.per_kernel_ms) == pytest.approx(tuple(want))
    # too few models for two coefficients: the source's share of the kernel sum stays
    few = pinned_overhead(src, f, n[:PINNED_MIN_MODELS - 1], s[:PINNED_MIN_MODELS - 1],
                          e[:PINNED_MIN_MODELS - 1])
    assert few.per_kernel_ms == src.per_kernel_ms and few.per_kernel == pytest.approx(0.003)
    # through adapt: the model's overhead is the pinned fit on the few models
    source, new_ds, _ = pair
    k, m, _, _ = _split(new_ds, 20)
    model = adapt(source, k, m, NEW, "scale", overhead="pinned")
    factor = model.training["common_factor"]
    want = pinned_overhead(source.overhead, factor, *(m[col].to_numpy(float) for col in
                                                      ("n_kernels", "kernel_sum_ms",
                                                       "latency_ms")))
    assert model.training["overhead"] == "pinned" and model.overhead == want
