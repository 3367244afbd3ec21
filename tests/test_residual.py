"""The end-to-end residual stage (latpred/predictors/residual.py): its per-type tables, when
`auto` keeps it, out-of-fold kernel predictions, and a model that carries it through predict,
predict_many, save/load and block scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import simdata
from latpred.errors import PredictorError
from latpred.predictors import LatencyModel
from latpred.predictors.residual import by_type, fit_residual, per_type
from latpred.predictors.search import SearchSpec
from latpred.predictors.training import fit_type, load_tables, out_of_fold_kernels

TARGET = "host/cpu/fp32/t1"
NO_SEARCH = SearchSpec("gbdt", "t", method="none")


def test_per_type_counts_and_sums_each_list_by_type():
    lists = [["a", "b", "a"], [], ["c", "b"]]
    counts, sums = per_type(lists, np.array([1.0, 2.0, 4.0, 8.0, 16.0]), ["a", "b"])
    assert counts.tolist() == [[2, 1], [0, 0], [0, 1]]     # "c" is not one of the types
    assert sums.tolist() == [[5.0, 2.0], [0.0, 0.0], [0.0, 16.0]]
    c, s = by_type(np.array([1, 1, 0]), np.array([0, -1, 1]), np.array([1.0, 2.0, 3.0]), 2, 2)
    assert c.tolist() == [[0, 1], [1, 0]] and s.tolist() == [[0.0, 3.0], [1.0, 0.0]]


def _models(n, rng):
    counts = pd.DataFrame({"a": rng.integers(0, 8, n), "b": rng.integers(0, 8, n)}, dtype=float)
    sums = counts * rng.uniform(0.05, 0.15, (n, 2))
    base = sums.sum(axis=1).to_numpy() + 0.1
    return counts, sums, base


def test_auto_keeps_a_learnable_residual_and_drops_noise():
    rng = np.random.default_rng(0)
    counts, sums, base = _models(400, rng)
    # What a kernel sum and a linear overhead miss: a step in one type's predicted time.
    e2e = base + np.where(sums["a"] > 0.4, 0.3, 0.0)
    stage, info = fit_residual(counts, sums, base, e2e)
    assert info["residual"] == "kept" and stage is not None
    assert info["residual_cv_mape_with"] < 0.5 * info["residual_cv_mape_without"]
    assert stage.types == ("a", "b")
    noisy = base * rng.lognormal(0, 0.02, len(base))
    stage, info = fit_residual(counts, sums, base, noisy)
    assert stage is None and info["residual"].startswith("not kept")


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    ds = simdata.simulate(tmp_path_factory.mktemp("res") / "ds", TARGET, n_models=110, seed=5)
    return load_tables(ds, TARGET)


def test_out_of_fold_predictions_come_from_fits_without_the_model(tables):
    from sklearn.model_selection import GroupKFold

    kernels, _ = tables
    model = LatencyModel.fit_tables(kernels, tables[1], TARGET, "gbdt", NO_SEARCH,
                                    residual="off")
    oof = out_of_fold_kernels(kernels, model.types, NO_SEARCH, seed=0, folds=3)
    ktype = "conv2d"
    rows = kernels[kernels["kernel_type"] == ktype]
    fit = model.types[ktype]
    X = rows[["f_" + f for f in fit.features]].to_numpy(np.float64)
    train, test = next(GroupKFold(3, shuffle=True, random_state=0).split(
        X, None, rows["model_id"].to_numpy()))
    refit = fit_type(ktype, rows.iloc[train], NO_SEARCH, 0, fit.features)
    pos = kernels.index.get_indexer(rows.index)
    assert np.allclose(oof[pos[test]], refit.regressor.predict(X[test]))
    assert not np.allclose(oof[pos], fit.regressor.predict(X))   # not the in-sample fit


def test_fit_keeps_the_stage_where_the_end_to_end_latency_has_a_step(tables):
    kernels, models = tables
    n_dw = kernels[kernels["kernel_type"] == "dwconv2d"].groupby("model_id").size()
    step = (n_dw.reindex(models["model_id"]).fillna(0).to_numpy() > n_dw.median()) * 0.4
    stepped = models.assign(latency_ms=models["latency_ms"] + step)
    model = LatencyModel.fit_tables(kernels, stepped, TARGET, "gbdt", NO_SEARCH)
    assert model.training["residual"] == "kept" and model.residual is not None
    off = LatencyModel.fit_tables(kernels, stepped, TARGET, "gbdt", NO_SEARCH, residual="off")
    assert off.residual is None and off.training["residual"] == "off"


def test_a_model_with_the_stage_predicts_saves_and_scores_blocks(tables, tmp_path):
    from latpred.sampler import build_graph, sample

    kernels, models = tables
    plain = LatencyModel.fit_tables(kernels, models, TARGET, "gbdt", NO_SEARCH, residual="off")
    model = simdata.with_residual_stage(plain)
    graphs = [build_graph(a) for a in sample(simdata.SPACE, 12, 99)]
    base, got = plain.predict_many(graphs), model.predict_many(graphs)
    for b, p, g in zip(base, got, graphs):
        counts, sums = per_type([[k.type for k in b.kernels]], b.kernel_ms, model.residual.types)
        want = b.total_ms + model.residual.predict(counts, sums)[0]
        assert p.total_ms == pytest.approx(want, rel=1e-12)
        assert model.predict(g).total_ms == pytest.approx(p.total_ms, rel=1e-12)
    assert len({round(p.total_ms - b.total_ms, 9) for b, p in zip(base, got)}) > 1
    model.save(tmp_path / "p")
    loaded = LatencyModel.load(tmp_path / "p")
    assert [p.total_ms for p in loaded.predict_many(graphs)] == [p.total_ms for p in got]
    (tmp_path / "p" / "residual.lgb.txt").write_text("tree\n")
    with pytest.raises(PredictorError, match="sha256"):
        LatencyModel.load(tmp_path / "p")
