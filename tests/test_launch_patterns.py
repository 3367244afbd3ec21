"""The launch-pattern stage of CUDA grouped convolutions (latpred/predictors/launch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from latpred.errors import PredictorError
from latpred.features import FEATURES
from latpred.predictors import LatencyModel, PercentGBDT, SearchSpec, launch
from latpred.predictors.adapt.wrappers import AdaptedRegressor
from latpred.predictors.launch import LaunchClassifier, LaunchStaged

ROOT = Path(__file__).resolve().parents[1]
SYN = ROOT / "datasets" / "h100-cuda-synthetic"
T = "h100/cuda/fp16"
GROUPED = "grouped_conv2d"
COLS = ["f_" + c for c in FEATURES[GROUPED]]
FIXED = {"gbdt": {"n_estimators": 100}, "rf": {"n_estimators": 10}}


def quick(family: str = "gbdt") -> SearchSpec:
    return SearchSpec(family, "quick", method="none", fixed=FIXED[family])


def frame(n_models: int, per: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Grouped-conv rows whose latency is a roofline-ish cost times a factor of the launch
    pattern, which the features determine (channels per group not a multiple of 16: transforms
    around the conv; else one conv up to 8 groups, two above)."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_models):
        for _ in range(per):
            f = {c: float(rng.integers(1, 64)) for c in FEATURES[GROUPED]}
            groups = float(rng.choice([2, 4, 8, 16, 32]))
            gin = float(rng.choice([4, 8, 12, 16, 24, 32, 48, 64]))
            hw = float(rng.choice([7, 14, 28, 56]))
            f.update(groups=groups, group_in_c=gin, input_c=groups * gin, output_h=hw,
                     output_w=hw, flops=2 * hw * hw * groups * gin * gin * 9)
            pattern = ("memset+transform+conv+transform" if gin % 16 else
                       "conv" if groups <= 8 else "conv+conv")
            factor = {"conv": 1.0, "conv+conv": 1.6, "memset+transform+conv+transform": 3.0}
            ms = (2e-8 * f["flops"] + 0.005) * factor[pattern] * rng.lognormal(0, 0.01)
            rows.append({"model_id": f"m{seed}-{m}", "kernel_type": GROUPED, "latency_ms": ms,
                         "launches": pattern + "+elementwise+activation",
                         **{"f_" + k: v for k, v in f.items()}})
    k = pd.DataFrame(rows)
    s = k.groupby("model_id")["latency_ms"].agg(["sum", "size"])
    m = pd.DataFrame({"model_id": s.index, "latency_ms": s["sum"].to_numpy() + 0.1,
                      "n_kernels": s["size"].to_numpy(), "kernel_sum_ms": s["sum"].to_numpy()})
    return k, m


def test_patterns_drop_the_fused_epilogue_and_pool_the_rare_ones():
    pats = launch.launch_patterns(["conv+elementwise+activation", "conv", "a+b+elementwise"])
    assert list(pats) == ["conv", "conv", "a+b+elementwise"]
    many = np.array([f"p{i}" for i in range(12) for _ in range(12 - i)], dtype=object)
    classes, labels = launch.pattern_classes(many)
    assert classes == tuple(f"p{i}" for i in range(launch.TOP_PATTERNS)) + (launch.OTHER,)
    assert labels[-1] == launch.TOP_PATTERNS and labels[0] == 0


def test_per_group_loops_get_one_name_whatever_the_groups():
    assert launch.loop_name("conv+conv", 2) == "loop:conv"
    assert launch.loop_name("+".join(["conv"] * 16), 16) == "loop:conv"
    unit = "other+memset+other+conv+transform"
    assert launch.loop_name("+".join([unit] * 20), 20) == launch.loop_name(unit + "+" + unit, 2)
    mixed = unit + "+other+memset+other+conv+other"
    assert launch.loop_name(mixed, 2) == ("loop:conv+memset+other+other+other|"
                                          "conv+memset+other+other+transform")
    # Not a loop: one grouped kernel, two convs for four groups, units of unequal length.
    assert launch.loop_name("memset+transform+conv+transform", 4) == \
        "memset+transform+conv+transform"
    assert launch.loop_name("conv+conv", 4) == "conv+conv"
    assert launch.loop_name("conv+conv+transform", 2) == "conv+conv+transform"
    pats = launch.launch_patterns(["conv+conv+elementwise+activation", "conv"], [2, 8])
    assert list(pats) == ["loop:conv", "conv"]


def test_rare_loops_and_rare_patterns_pool_apart():
    many = [f"p{i}" for i in range(10) for _ in range(20 - i)] + ["loop:a", "loop:b", "q"]
    classes, labels = launch.pattern_classes(np.array(many, dtype=object))
    assert classes[-2:] == (launch.LOOP_OTHER, launch.OTHER)
    assert [classes[i] for i in labels[-3:]] == [launch.LOOP_OTHER, launch.LOOP_OTHER,
                                                 launch.OTHER]


def loop_frame(n_models: int, per: int, seed: int, groups=(2, 3, 4, 6)) -> pd.DataFrame:
    """Grouped-conv rows where cuDNN either runs one grouped kernel or loops over the groups
    (per-group channels not a multiple of 8): a loop costs groups x its unit."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_models):
        for _ in range(per):
            f = {c: float(rng.integers(1, 64)) for c in FEATURES[GROUPED]}
            g = float(rng.choice(groups))
            gin = float(rng.choice([4, 6, 8, 12, 16, 24]))
            f.update(groups=g, group_in_c=gin, group_in_align=8.0 if gin % 8 == 0 else 2.0,
                     input_c=g * gin)
            loop = gin % 8 != 0
            unit = 0.004 + 0.0005 * gin
            ms = (g * unit if loop else unit * 1.5) * rng.lognormal(0, 0.01)
            launches = "+".join(["other+conv+other"] * int(g)) if loop else "conv"
            rows.append({"model_id": f"m{seed}-{m}", "kernel_type": GROUPED, "latency_ms": ms,
                         "launches": launches + "+elementwise+activation",
                         **{"f_" + k: v for k, v in f.items()}})
    return pd.DataFrame(rows)


def test_loops_are_learned_per_repetition_and_extrapolate_in_groups():
    k = loop_frame(40, 10, 0)
    s = k.groupby("model_id")["latency_ms"].agg(["sum", "size"])
    m = pd.DataFrame({"model_id": s.index, "latency_ms": s["sum"].to_numpy() + 0.1,
                      "n_kernels": s["size"].to_numpy(), "kernel_sum_ms": s["sum"].to_numpy()})
    fit = LatencyModel.fit_tables(k, m, T, "gbdt", quick()).types[GROUPED]
    clf = fit.regressor.classifier
    assert clf.scaling == launch.PER_GROUP and "loop:conv+other+other" in clf.classes
    test = loop_frame(10, 10, 1, groups=(16, 32))       # four to eight times the groups seen
    loops = test["launches"].str.startswith("other").to_numpy()
    X, y = test[COLS].to_numpy(), test["latency_ms"].to_numpy()
    err = np.abs(fit.regressor.predict(X) / y - 1)
    assert loops.any() and np.median(err[loops]) < 0.1
    # The same regressor without the scaling (a predictor saved before it) cannot follow.
    data, params = clf.export()
    params["scaling"] = launch.NO_SCALING
    old = LaunchStaged(fit.regressor.regressor, LaunchClassifier.restore(data, params))
    assert np.median(np.abs(old.predict(X) / y - 1)[loops]) > 0.5


def test_stage_is_trained_only_where_launches_exist():
    k, m = frame(12, 8, 0)
    staged = LatencyModel.fit_tables(k, m, T, "gbdt", quick())
    fit = staged.types[GROUPED]
    assert isinstance(fit.regressor, LaunchStaged)
    assert fit.features == FEATURES[GROUPED]       # the usual feature rows go in
    assert fit.metrics["launch"]["n_classes"] == 3 and fit.metrics["launch"]["oof_accuracy"] > .5
    assert fit.regressor.regressor.n_features_in_ == len(FEATURES[GROUPED]) + 3
    assert "context_bytes" not in fit.regressor.classifier.inputs
    plain = LatencyModel.fit_tables(k.drop(columns="launches"), m, T, "gbdt", quick())
    assert isinstance(plain.types[GROUPED].regressor, PercentGBDT)
    assert "launch" not in plain.types[GROUPED].metrics
    other = LatencyModel.fit_tables(k.assign(kernel_type="conv2d"), m, T, "gbdt", quick())
    assert isinstance(other.types["conv2d"].regressor, PercentGBDT)     # not a LAUNCH_TYPE
    one = LatencyModel.fit_tables(k.assign(launches="conv"), m, T, "gbdt", quick())
    assert isinstance(one.types[GROUPED].regressor, PercentGBDT)        # one pattern: nothing


@pytest.mark.parametrize("family", ["gbdt", "rf"])
def test_stage_lowers_the_error_when_the_pattern_sets_the_latency(family):
    k, m = frame(40, 10, 0)
    test, _ = frame(20, 10, 1)
    X = test[COLS].to_numpy()
    y = test["latency_ms"].to_numpy()

    def mape(model):
        return float(np.mean(np.abs(model.types[GROUPED].regressor.predict(X) / y - 1)))

    staged = mape(LatencyModel.fit_tables(k, m, T, family, quick(family)))
    plain = mape(LatencyModel.fit_tables(k.drop(columns="launches"), m, T, family, quick(family)))
    assert staged < 0.85 * plain


# -- on measured CUDA data: 120 models of h100-cuda-synthetic, predicted on 12 others ----------
@pytest.fixture(scope="module")
def cuda(tmp_path_factory):
    from latpred.dataset import Dataset
    from latpred.sampler import build_graph

    ds = Dataset.open(SYN)
    models = ds.models(T).sort_values("model_id")
    kernels = ds.kernels(T)
    grouped = set(kernels.loc[kernels["kernel_type"] == GROUPED, "model_id"])
    ids = list(models["model_id"])
    train = ids[:120]
    test = [i for i in ids[120:] if i in grouped][:12]
    model = LatencyModel.fit(ds, T, "gbdt", quick(), model_ids=train)
    arch = dict(zip(models["model_id"], models["arch"]))
    graphs = [build_graph(json.loads(arch[i])) for i in test]
    path = tmp_path_factory.mktemp("cuda") / "p"
    model.save(path)
    return model, graphs, path


def test_cuda_predictor_has_the_stage_and_uses_it(cuda):
    model, graphs, _ = cuda
    fit = model.types[GROUPED]
    assert isinstance(fit.regressor, LaunchStaged)
    assert all(not isinstance(f.regressor, LaunchStaged) for t, f in model.types.items()
               if t != GROUPED)
    preds = model.predict_many(graphs)
    assert sum(k.type == GROUPED for p in preds for k in p.kernels) >= 12


def test_predict_and_batched_predict_many_agree(cuda):
    model, graphs, _ = cuda
    many = model.predict_many(graphs)
    for g, p in zip(graphs, many):
        one = model.predict(g)
        assert np.allclose(one.kernel_ms, p.kernel_ms, rtol=1e-12, atol=0)
        assert one.total_ms == pytest.approx(p.total_ms, rel=1e-12)


def test_saved_and_loaded_predictor_predicts_identically(cuda):
    model, graphs, path = cuda
    doc = json.loads((path / "predictor.json").read_text())
    entry = doc["kernel_types"][GROUPED]["launch"]
    assert entry["artifact"] == GROUPED + ".launch.lgb.txt" and len(entry["sha256"]) == 64
    assert entry["classes"] == list(model.types[GROUPED].regressor.classifier.classes)
    assert all("launch" not in e for t, e in doc["kernel_types"].items() if t != GROUPED)
    back = LatencyModel.load(path, target=T)
    assert isinstance(back.types[GROUPED].regressor, LaunchStaged)
    for a, b in zip(model.predict_many(graphs), back.predict_many(graphs)):
        assert np.array_equal(a.kernel_ms, b.kernel_ms) and a.total_ms == b.total_ms


def test_typed_overhead_counts_each_graphs_kernels_per_type(cuda, tmp_path):
    from latpred.dataset import Dataset

    model, graphs, _ = cuda
    typed = LatencyModel.fit(Dataset.open(SYN), T, "gbdt", quick(), overhead="typed",
                             model_ids=model.training["train_models"])
    o = typed.overhead
    assert o.kind == "typed" and GROUPED in o.types
    for p in typed.predict_many(graphs):
        kinds = [k.type for k in p.kernels]
        want = (o.intercept + o.per_kernel_ms * p.kernel_sum_ms
                + sum(dict(o.per_type).get(t, o.per_kernel) for t in kinds))
        assert p.overhead_ms == pytest.approx(want, rel=1e-9)
    typed.save(tmp_path / "p")
    back = LatencyModel.load(tmp_path / "p")
    assert back.overhead == o
    assert [p.total_ms for p in back.predict_many(graphs)] == \
        [p.total_ms for p in typed.predict_many(graphs)]


def test_a_modified_classifier_is_refused(cuda, tmp_path):
    import shutil

    _, _, path = cuda
    shutil.copytree(path, tmp_path / "p")
    art = tmp_path / "p" / (GROUPED + ".launch.lgb.txt")
    art.write_bytes(art.read_bytes() + b"\n")
    with pytest.raises(PredictorError, match="sha256"):
        LatencyModel.load(tmp_path / "p")


def test_adapted_staged_regressor_round_trips(cuda):
    model, _, _ = cuda
    staged = model.types[GROUPED].regressor
    adapted = AdaptedRegressor(staged, 1.3)
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 64, (20, staged.n_features_in_))
    data, params = adapted.export()
    back = AdaptedRegressor.restore(data, params)
    assert np.array_equal(back.predict(X), adapted.predict(X))
    assert np.allclose(adapted.predict(X), 1.3 * staged.predict(X))


def test_the_regressor_gets_the_likeliest_class_one_hot(cuda):
    model, _, _ = cuda
    clf = model.types[GROUPED].regressor.classifier
    X = np.random.default_rng(1).uniform(1, 64, (30, clf.n_features))
    (cols, _), P = clf.stage_columns(X), clf.predict_proba(X)
    assert clf.encoding == "one_hot"
    assert np.array_equal(cols.sum(axis=1), np.ones(len(X))) and set(np.unique(cols)) <= {0, 1}
    assert np.array_equal(cols.argmax(axis=1), P.argmax(axis=1))
    # A classifier saved before the one-hot stage (no "encoding") feeds its probabilities.
    data, params = clf.export()
    params.pop("encoding")
    assert np.array_equal(LaunchClassifier.restore(data, params).stage_columns(X)[0], P)
