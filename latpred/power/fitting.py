"""The least squares behind APGPM and its baselines, and the scores its selection compares.

`LinearFit` is power = b0 + sum_i b_i x_i fitted on *standardized* columns (x - mean) / std
with numpy's SVD least squares, so counters of very different scale (event rates of 1e8 / ms
beside percentages) are fitted as well as each other. (scikit-learn 1.9's LinearRegression
passes `tol=1e-6` to scipy's lstsq as its cutoff on relative singular values; on raw counter
columns that silently zeroes the small-scale counters' coefficients, which is how APGPM's
final fit disagreed with the fits its selection had scored: docs/energy.md.)

`weighting`:
- "none": ordinary least squares, the paper's linear regression;
- "relative": each workload weighted by 1 / y^2, i.e. least squares on the relative error
  (pred - y) / y, the quantity MAPE averages. R^2 is weighted the same way (`r2`), so the
  forward selection scores candidates with the loss the final fit minimizes.
`nonneg`: every counter's coefficient >= 0 (the intercept is free), via scipy's nnls.
"""

from __future__ import annotations

import math

import numpy as np

WEIGHTINGS = ("none", "relative")


def weights(y, weighting: str) -> np.ndarray:
    """Per-sample least-squares weights (the squared residual's factor)."""
    y = np.asarray(y, float)
    if weighting == "none":
        return np.ones_like(y)
    if weighting == "relative":
        if (y <= 0).any():
            raise ValueError("relative weighting needs positive targets")
        return 1.0 / y ** 2
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, not {weighting!r}")


class LinearFit:
    """y = intercept_ + A @ coef_, least squares under `weighting` (module docstring)."""

    def __init__(self, weighting: str = "none", nonneg: bool = False):
        self.weighting = weighting
        self.nonneg = nonneg

    def fit(self, A, y) -> "LinearFit":
        A, y = np.asarray(A, float), np.asarray(y, float)
        if A.ndim == 1:
            A = A.reshape(-1, 1)
        s = np.sqrt(weights(y, self.weighting))
        mu, sd = A.mean(axis=0), A.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        Z = (A - mu) / sd
        one = np.ones((len(y), 1))
        if self.nonneg:
            from scipy.optimize import nnls

            M = np.column_stack([one, -one, Z]) * s[:, None]
            c, _ = nnls(M, y * s, maxiter=50 * M.shape[1])
            b0, b = c[0] - c[1], c[2:]
        else:
            c, *_ = np.linalg.lstsq(np.column_stack([one, Z]) * s[:, None], y * s, rcond=None)
            b0, b = c[0], c[1:]
        self.coef_ = b / sd
        self.intercept_ = float(b0 - (self.coef_ * mu).sum())
        return self

    def predict(self, A) -> np.ndarray:
        A = np.asarray(A, float)
        return self.intercept_ + (A.reshape(-1, 1) if A.ndim == 1 else A) @ self.coef_


def r2(y, pred, weighting: str = "none") -> float:
    """R^2 with the fit's weights (plain R^2 for "none")."""
    y, pred = np.asarray(y, float), np.asarray(pred, float)
    w = weights(y, weighting)
    mu = (w * y).sum() / w.sum()
    ss = (w * (y - mu) ** 2).sum()
    return 1.0 - (w * (y - pred) ** 2).sum() / ss if ss > 0 else 0.0


class Scorer:
    """The score the forward selection maximizes for a set of counter columns `A`: adjusted
    R^2 of the training fit (`"adjusted"`), its plain R^2 (`"r2"`), or the R^2 of `folds`-fold
    cross-validated predictions (`"heldout"`, folds drawn from `seed`); fits and R^2 both
    under `fit`'s weighting."""

    def __init__(self, y, criterion: str, folds: int, seed: int, fit: LinearFit):
        if criterion not in ("adjusted", "heldout", "r2"):
            raise ValueError(f"criterion must be adjusted, heldout or r2, not {criterion!r}")
        self.y, self.criterion, self.fit = np.asarray(y, float), criterion, fit
        order = np.random.default_rng(seed).permutation(len(self.y))
        self.splits = [order[k::folds] for k in range(folds)]

    def __call__(self, A: np.ndarray) -> float:
        y, n, p, wt = self.y, len(self.y), A.shape[1], self.fit.weighting
        if self.criterion == "heldout":
            pred = np.empty(n)
            for test in self.splits:
                train = np.setdiff1d(np.arange(n), test)
                pred[test] = self.fit.fit(A[train], y[train]).predict(A[test])
            return r2(y, pred, wt)
        score = r2(y, self.fit.fit(A, y).predict(A), wt)
        if self.criterion == "r2":
            return score
        return 1 - (1 - score) * (n - 1) / (n - p - 1) if n - p - 1 > 0 else -math.inf


def mape(y, pred) -> float:
    """Mean absolute percentage error in % (sklearn.metrics)."""
    from sklearn.metrics import mean_absolute_percentage_error

    return 100.0 * mean_absolute_percentage_error(np.asarray(y, float), np.asarray(pred, float))


def one_counter_r2(A, y, fit: LinearFit) -> np.ndarray:
    """R^2 of the one-counter fit of y on each column of A under `fit`'s weighting: the
    weighted squared correlation (0 for a negative one when `fit.nonneg`)."""
    A, y = np.asarray(A, float), np.asarray(y, float)
    w = weights(y, fit.weighting)
    w = w / w.sum()
    Ac = A - w @ A
    yc = y - w @ y
    cov = w @ (Ac * yc[:, None])
    var = w @ (Ac * Ac)
    r2_ = np.where(var > 0, cov ** 2 / np.where(var > 0, var, 1.0) / (w @ (yc * yc)), 0.0)
    return np.where(fit.nonneg & (cov < 0), 0.0, r2_)
