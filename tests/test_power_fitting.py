"""The least squares under APGPM: scale-free, relative weighting, non-negative coefficients, and
the selection scoring with the fit it ends with."""

import numpy as np
import pandas as pd
import pytest

from latpred.power import APGPM, LinearFit, mape
from latpred.power.fitting import Scorer, one_counter_r2, r2


def _scaled(n=120, seed=0):
    """Power from an event rate of ~1e8 / ms and a percentage: columns 1e10 apart in scale."""
    rng = np.random.default_rng(seed)
    rate = rng.uniform(1e7, 5e8, n)
    pct = rng.uniform(0.0, 60.0, n)
    y = 40 + 2e-7 * rate + 1.5 * pct
    return np.column_stack([rate, pct]), y


def test_fit_does_not_drop_small_scale_counters():
    # scikit-learn 1.9's LinearRegression (tol=1e-6 as lstsq's cutoff) zeroes the percentage's
    # coefficient here; the standardized fit recovers both
    A, y = _scaled()
    for weighting in ("none", "relative"):
        f = LinearFit(weighting).fit(A, y)
        assert f.coef_ == pytest.approx([2e-7, 1.5], rel=1e-6)
        assert f.intercept_ == pytest.approx(40, rel=1e-6)
        assert mape(y, f.predict(A)) < 1e-6


def test_apgpm_final_fit_is_the_fit_its_selection_scored():
    A, y = _scaled()
    rng = np.random.default_rng(1)
    X = pd.DataFrame({"rate": A[:, 0], "rate2": 8 * A[:, 0] + rng.normal(0, 1e5, len(y)),
                      "pct": A[:, 1], "junk": rng.normal(0, 1, len(y))})
    y = y + rng.normal(0, 0.5, len(y))
    for weighting in ("none", "relative"):
        m = APGPM(weighting=weighting, criterion="r2").fit(X, y)
        assert {"pct"} < set(m.counters_)
        direct = LinearFit(weighting).fit(X[m.counters_].to_numpy(), y)
        assert np.allclose(m.predict(X), direct.predict(X[m.counters_].to_numpy()))
        assert m.score_ == pytest.approx(r2(y, direct.predict(X[m.counters_].to_numpy()),
                                            weighting))


def test_relative_weighting_minimizes_the_squared_relative_error():
    rng = np.random.default_rng(2)
    A = rng.uniform(0, 10, (80, 2))
    y = (50 + 20 * A[:, 0] + 5 * A[:, 1]) * np.exp(rng.normal(0, 0.1, 80))
    rel = LinearFit("relative").fit(A, y)
    ols = LinearFit("none").fit(A, y)

    def sq_rel(f):
        return (((f.predict(A) - y) / y) ** 2).sum()

    def sq_abs(f):
        return ((f.predict(A) - y) ** 2).sum()

    assert sq_rel(rel) < sq_rel(ols) and sq_abs(ols) < sq_abs(rel)
    # the weighted normal equations' solution
    M = np.column_stack([np.ones(80), A]) / y[:, None]
    c = np.linalg.solve(M.T @ M, M.T @ np.ones(80))
    assert [rel.intercept_, *rel.coef_] == pytest.approx(c, rel=1e-8)
    # and it wins on MAPE where a few high-power workloads pull the ordinary fit
    y2 = y.copy()
    y2[:4] *= 3
    assert mape(y2[4:], LinearFit("relative").fit(A, y2).predict(A)[4:]) < \
        mape(y2[4:], LinearFit("none").fit(A, y2).predict(A)[4:])
    with pytest.raises(ValueError):
        LinearFit("relative").fit(A, -y)
    with pytest.raises(ValueError):
        LinearFit("huber").fit(A, y)


def test_nonneg_keeps_counter_coefficients_non_negative():
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 1, 100)
    b = a + rng.normal(0, 0.05, 100)                   # collinear: OLS gives one a minus
    y = 60 + 30 * a + rng.normal(0, 3, 100) - 10 * (b - a) * 8
    ols = LinearFit("none").fit(np.column_stack([a, b]), y)
    assert ols.coef_.min() < 0
    nn = LinearFit("none", nonneg=True).fit(np.column_stack([a, b]), y)
    assert nn.coef_.min() >= 0 and nn.coef_.max() > 0
    low = LinearFit("none", nonneg=True).fit(a.reshape(-1, 1) * 100, 200 - 50 * a)
    assert low.coef_[0] == 0 and low.intercept_ == pytest.approx((200 - 50 * a).mean())


def test_one_counter_r2_is_the_one_counter_fits_r2():
    rng = np.random.default_rng(4)
    A = np.column_stack([rng.uniform(0, 1, 60) * 10 ** k for k in (-3, 0, 4, 9)])
    A[:, 3] = -A[:, 3]
    y = 70 + 40 * A[:, 1] + 1e-4 * A[:, 2] + rng.normal(0, 2, 60)
    for weighting in ("none", "relative"):
        for nonneg in (False, True):
            fit = LinearFit(weighting, nonneg)
            got = one_counter_r2(A, y, fit)
            want = [r2(y, fit.fit(A[:, [j]], y).predict(A[:, [j]]), weighting)
                    for j in range(A.shape[1])]
            assert got == pytest.approx(want, abs=1e-9)


def test_scorer_criteria():
    A, y = _scaled(n=60)
    y = y + np.random.default_rng(5).normal(0, 1, 60)
    fit = LinearFit("relative")
    plain = Scorer(y, "r2", 5, 0, fit)(A)
    adj = Scorer(y, "adjusted", 5, 0, fit)(A)
    held = Scorer(y, "heldout", 5, 0, fit)(A)
    assert adj == pytest.approx(1 - (1 - plain) * 59 / 57)
    assert held < plain
    with pytest.raises(ValueError):
        Scorer(y, "bic", 5, 0, fit)


def test_apgpm_default_fits_relative_error_and_wins_on_mape():
    # a law the linear model cannot follow exactly (power convex in the activity), most
    # workloads at low power: the relative fit trades the few high-power ones for the many
    rng = np.random.default_rng(6)
    n = 300
    f = rng.beta(1.2, 4.0, n)
    X = pd.DataFrame({"inst": f * 1e8, "beats": 8e8 * f * (1 + rng.normal(0, 0.01, n)),
                      "pct": 100 * f + rng.normal(0, 0.5, n),
                      **{f"junk{j}": rng.normal(0, 1, n) for j in range(10)}})
    y = 50 + 300 * f ** 2 * (1 + rng.normal(0, 0.01, n))
    rel, ols = APGPM(), APGPM(weighting="none")
    assert rel.weighting == "relative" and rel.fit(X[:200], y[:200]).summary()["weighting"] \
        == "relative"
    ols.fit(X[:200], y[:200])
    assert mape(y[200:], rel.predict(X[200:])) < 0.8 * mape(y[200:], ols.predict(X[200:]))


def test_baselines_fit_with_the_given_weighting():
    from latpred.power import AllCountersModel, TopKModel, UtilFreqModel

    rng = np.random.default_rng(7)
    u = rng.uniform(0, 1, 120)
    f = np.where(np.arange(120) % 2, 1980, 1755)
    y = (50 + 200 * u ** 2) * np.exp(rng.normal(0, 0.05, 120))
    X = pd.DataFrame({"u": u, "u2": u * 1e9, "junk": rng.normal(0, 1, 120)})
    for weighting in ("none", "relative"):
        uf = UtilFreqModel(weighting=weighting).fit(u, f, y)
        fits = [uf.pooled_, *uf.per_freq_.values(), TopKModel(2, weighting).fit(X, y).linear_,
                AllCountersModel(weighting).fit(X, y).linear_]
        assert all(m.weighting == weighting for m in fits)
    rel = UtilFreqModel(weighting="relative").fit(u, f, y)
    ols = UtilFreqModel(weighting="none").fit(u, f, y)
    assert mape(y, rel.predict(u, f)) < mape(y, ols.predict(u, f))
