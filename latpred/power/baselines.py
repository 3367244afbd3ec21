"""The paper's baselines for APGPM (section 5.5), fitted by the same least squares
(`fitting.LinearFit`, with the same `weighting`): `UtilFreqModel` (power linear in utilization,
one fit per frequency, eq. 1), `AllCountersModel` (one regression on every counter) and
`TopKModel` (the k counters most correlated with power)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latpred.power.apgpm import correlations, usable
from latpred.power.fitting import LinearFit


class AllCountersModel:
    """Baseline: one linear regression on every usable counter (the paper's All-PMC; with more
    counters than workloads, the minimum-norm solution on standardized counters)."""

    def __init__(self, weighting: str = "none"):
        self.weighting = weighting

    def fit(self, X: pd.DataFrame, y) -> "AllCountersModel":
        self.columns_ = list(usable(X).columns)
        self.linear_ = LinearFit(self.weighting).fit(X[self.columns_].to_numpy(float), y)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.linear_.predict(X[self.columns_].to_numpy(float))


class TopKModel:
    """Baseline: linear regression on the k counters most correlated with power (k-top-PMC)."""

    def __init__(self, k: int, weighting: str = "none"):
        self.k = k
        self.weighting = weighting

    def fit(self, X: pd.DataFrame, y) -> "TopKModel":
        U = usable(X)
        corr = correlations(U, y)["r"].abs().sort_values(ascending=False)
        self.columns_ = list(corr.index[:self.k])
        self.linear_ = LinearFit(self.weighting).fit(U[self.columns_].to_numpy(), y)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.linear_.predict(X[self.columns_].to_numpy(float))


class UtilFreqModel:
    """Baseline (paper eq. 1): power = beta_f * utilization + beta_0, one fit per frequency
    (frequencies rounded to `bin_mhz`; a frequency seen fewer than `min_samples` times, or not
    seen in training, uses the fit on every sample)."""

    def __init__(self, bin_mhz: float = 50.0, min_samples: int = 5, weighting: str = "none"):
        self.bin_mhz = bin_mhz
        self.min_samples = min_samples
        self.weighting = weighting

    def _bins(self, freq) -> np.ndarray:
        return np.round(np.asarray(freq, float) / self.bin_mhz).astype(int)

    def fit(self, util, freq, y) -> "UtilFreqModel":
        u, b, y = np.asarray(util, float).reshape(-1, 1), self._bins(freq), np.asarray(y, float)
        self.pooled_ = LinearFit(self.weighting).fit(u, y)
        self.per_freq_ = {int(k): LinearFit(self.weighting).fit(u[b == k], y[b == k])
                          for k in np.unique(b) if (b == k).sum() >= self.min_samples}
        return self

    def predict(self, util, freq) -> np.ndarray:
        u, b = np.asarray(util, float).reshape(-1, 1), self._bins(freq)
        out = self.pooled_.predict(u)
        for k, m in self.per_freq_.items():
            if (b == k).any():
                out[b == k] = m.predict(u[b == k])
        return out
