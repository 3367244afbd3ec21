"""APGPM on counters generated with a known power law: it must find the right counters."""

import numpy as np
import pandas as pd
import pytest

from latpred.power import (APGPM, AllCountersModel, TopKModel, UtilFreqModel, cluster,
                           interdependence, mape)


def _law(n=300, seed=0, noise=0.5):
    """Four hidden activities; each seen through a family of related counters (scaled copies,
    sums of parts, noisy views); power depends on three of them."""
    rng = np.random.default_rng(seed)
    fma, dram, l2, idle_unit = (rng.uniform(0.1, 1.0, n) for _ in range(4))
    cols = {}
    for name, f in (("fma", fma), ("dram", dram), ("l2", l2), ("tex", idle_unit)):
        part = rng.uniform(0.3, 0.7, n)
        cols[f"{name}_inst"] = f * 1000
        cols[f"{name}_beats"] = 8 * f * 1000                       # conversion
        cols[f"{name}_rd"] = f * part * 500
        cols[f"{name}_wr"] = f * (1 - part) * 500
        cols[f"{name}_total"] = cols[f"{name}_rd"] + cols[f"{name}_wr"]   # derivation
        cols[f"{name}_noisy"] = f * 1000 * (1 + rng.normal(0, 0.05, n))
    for j in range(30):                                             # unrelated counters
        cols[f"junk{j}"] = rng.normal(0, 1, n)
    cols["constant"] = np.full(n, 7.0)
    X = pd.DataFrame(cols)
    y = 60 + 40 * fma + 25 * dram + 10 * l2 + rng.normal(0, noise, n)
    return X, y


def _family(counter: str) -> str:
    return counter.split("_")[0]


@pytest.mark.parametrize("criterion", ["adjusted", "heldout"])
def test_apgpm_recovers_the_law(criterion):
    X, y = _law()
    m = APGPM(criterion=criterion, min_gain=0.001).fit(X.iloc[:200], y[:200])
    fams = {_family(c) for c in m.counters_}
    assert {"fma", "dram", "l2"} <= fams and "tex" not in fams
    assert m.counters_[0].startswith("fma")          # the most important cluster first
    if criterion == "heldout":                        # held-out R^2 keeps the junk out
        assert fams == {"fma", "dram", "l2"}
    assert mape(y[200:], m.predict(X.iloc[200:])) < 2.0
    assert len(m.counters_used_) <= 0.15 * X.shape[1]
    # one representative per cluster; the families' exact copies share a cluster
    labels = dict(zip(X.columns.drop("constant"), cluster(X.drop(columns="constant"))))
    assert labels["fma_inst"] == labels["fma_beats"] == labels["fma_total"]
    assert labels["fma_inst"] != labels["dram_inst"]


def test_interdependence_is_the_normalized_distance():
    X, _ = _law(n=100)
    d = interdependence(X[["fma_inst", "fma_beats", "dram_inst"]])
    assert d.loc["fma_inst", "fma_beats"] == pytest.approx(0.0, abs=1e-6)
    r = np.corrcoef(X["fma_inst"], X["dram_inst"])[0, 1]
    assert d.loc["fma_inst", "dram_inst"] == pytest.approx(np.sqrt(2 * 100 * (1 - r)), rel=1e-6)


def test_inverted_and_combined_counters():
    rng = np.random.default_rng(1)
    n = 300
    stall = rng.uniform(1, 10, n)
    a, b = rng.uniform(1, 5, n), rng.uniform(1, 5, n)
    X = pd.DataFrame({"stall": stall, "a": a, "b": b,
                      **{f"junk{j}": rng.normal(0, 1, n) for j in range(10)}})
    y = 50 + 100 / stall + 3 * a * b + rng.normal(0, 0.2, n)
    plain = APGPM().fit(X.iloc[:200], y[:200])
    inv = APGPM(inverted=True, criterion="heldout").fit(X.iloc[:200], y[:200])
    assert inv.counters_[0] == "inv(stall)"
    rich = APGPM(inverted=True, combine_top=5, min_gain=0.001).fit(X.iloc[:200], y[:200])
    assert any(c in rich.counters_ for c in ("a × b", "b × a"))
    assert set(rich.counters_used_) <= {"stall", "a", "b"}
    err_plain = mape(y[200:], plain.predict(X.iloc[200:]))
    err_inv = mape(y[200:], inv.predict(X.iloc[200:]))
    err_rich = mape(y[200:], rich.predict(X.iloc[200:]))
    assert max(err_inv, err_rich) < 0.7 * err_plain


def test_baselines():
    X, y = _law()
    allc = AllCountersModel().fit(X.iloc[:200], y[:200])
    assert mape(y[200:], allc.predict(X.iloc[200:])) < 3.0
    top = TopKModel(3).fit(X.iloc[:200], y[:200])
    assert all(_family(c) == "fma" for c in top.columns_)   # correlated, not complementary
    util = X["fma_inst"] / 1000
    freq = np.where(np.arange(len(y)) % 2, 1980, 1755)
    uf = UtilFreqModel().fit(util[:200], freq[:200], y[:200])
    assert set(uf.per_freq_) == {35, 40}
    assert mape(y[200:], uf.predict(util[200:], freq[200:])) > \
        mape(y[200:], APGPM().fit(X.iloc[:200], y[:200]).predict(X.iloc[200:]))


def test_bad_criterion():
    X, y = _law(n=50)
    with pytest.raises(ValueError):
        APGPM(criterion="bic").fit(X, y)


def test_clip_keeps_the_linear_law_inside_the_training_range():
    X, y = _law()
    plain = APGPM().fit(X.iloc[:200], y[:200])
    clipped = APGPM(clip=True).fit(X.iloc[:200], y[:200])
    far = X.iloc[200:210] * 10.0                       # ten times any training workload
    coef = clipped.linear_.coef_                        # the law's largest value in the box
    hi = clipped.linear_.intercept_ + np.maximum(coef * clipped.lo_, coef * clipped.hi_).sum()
    assert (clipped.predict(far) <= hi + 1e-6).all()
    assert plain.predict(far).max() > 2 * hi             # the unclipped law extrapolates
    inside = X.iloc[200:]
    in_range = ((inside[clipped.counters_] >= clipped.lo_) &
                (inside[clipped.counters_] <= clipped.hi_)).all(axis=1).to_numpy()
    assert np.allclose(clipped.predict(inside)[in_range], plain.predict(inside)[in_range])
    assert clipped.summary()["clip"] is True


def test_select_chooses_the_setting_with_the_lowest_cv_error():
    from latpred.power import APGPMSelect

    X, y = _law(n=150)
    # a crippled candidate (one counter only: every cluster merged) must lose to the paper's
    sel = APGPMSelect(candidates={"merged": {"distance_factor": 1e6},
                                  "paper": {"criterion": "adjusted"}}).fit(X, y)
    assert set(sel.cv_mape_) == {"merged", "paper"}
    assert sel.chosen_ == "paper" and sel.cv_mape_["paper"] < sel.cv_mape_["merged"]
    assert sel.summary()["chosen"] == "paper"
    ref = APGPM(criterion="adjusted").fit(X, y)        # refitted on every workload
    assert np.allclose(sel.predict(X), ref.predict(X))
    assert sel.counters_ == ref.counters_


def test_count_metrics_are_summed_over_cuda_kernels_and_ratios_are_not():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from power_counters import is_count

    units = {"smsp__cycles_active.avg": "cycle", "l1tex__data_pipe_lsu_wavefronts.avg": "",
             "sm__warps_active.avg.per_cycle_active": "warp", "launch__grid_size": "",
             "launch__thread_count": "thread", "inst_executed": "inst",
             "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
             "smsp__average_warp_latency_per_inst_issued.ratio": "cycle",
             "dram__bytes.sum.per_second": "Gbyte/s", "smsp__pcsamp_sample_count": "",
             "Block Size": ""}
    counts = {n for n in units if is_count(n, units)} | {n for n in ("x.sum",)
                                                           if is_count(n, units)}
    assert counts == {"smsp__cycles_active.avg", "l1tex__data_pipe_lsu_wavefronts.avg",
                      "inst_executed", "smsp__pcsamp_sample_count", "x.sum"}
