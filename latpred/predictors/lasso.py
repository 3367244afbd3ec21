"""Lasso with non-negative weights on standardised features, minimising Eq. 1.

Eq. 1 of the operation-wise paper is a weighted least-squares problem with weights 1/y^2 plus an
L1 term; scikit-learn's coordinate-descent `Lasso(positive=True)` with `sample_weight` solves it
exactly. The target is divided by `percentage_scale(y)` first so that the squared term equals the
mean squared percentage error and the paper's alpha grid over [1e-5, 1e2] is unit-free.

The intercept is fitted and left unconstrained: with standardised (zero-mean) features and
non-negative weights, a model without one could not represent a positive mean latency.

`design="physics"` (the default) first expands the named feature columns into cost terms
(FLOPs per kernel window and stride, SIMD-padded FLOPs, working-set steps; see `lasso_terms`);
`design="raw"` is the paper's model on the columns as they are. Column names come from a
DataFrame's columns or `fit(..., feature_names=...)`; the fitted model stores them, so
`predict` takes the plain matrix. Without names the physics design falls back to raw.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, ClassVar, Sequence

import numpy as np
from sklearn import config_context
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso
from sklearn.metrics import mean_absolute_percentage_error

from latpred.predictors.base import LatencyRegressor, percentage_scale, standardize_fit
from latpred.predictors.lasso_terms import design_matrix, op_codes_of, packs_reduction
from latpred.predictors.objective import percentage_weights


class PositiveLasso(LatencyRegressor):
    """f(x) = b + w . x-hat with w >= 0, fitted on the mean squared percentage error."""

    artifact_suffix: ClassVar[str] = ".json"
    family: ClassVar[str] = "lasso"

    def __init__(self, alpha: float = 1e-3, max_iter: int = 20000, tol: float = 1e-6,
                 design: str = "physics"):
        self.alpha = alpha
        self.max_iter = max_iter
        self.tol = tol
        self.design = design

    def fit(self, X: Any, y: Any, feature_names: Any = None) -> "PositiveLasso":
        X, y = self._check_fit(X, y)
        names = feature_names if feature_names is not None else self.feature_names_
        self._solve(self._learn_design(X, names), y)
        return self

    def alpha_scores(self, X: Any, y: Any, alphas: Sequence[float],
                     splits: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """The negated MAPE of each alpha (rows) on each split's held-out rows (columns): what
        `GridSearchCV(self, {"alpha": alphas}, scoring=neg_mape_scorer, cv=splits)` scores,
        fit for fit, but with one design matrix per split for all alphas (a grid search
        rebuilds it, and validates its input, for every candidate; few-shot adaptation runs
        hundreds of these searches)."""
        probe = clone(self)
        X, y = probe._check_fit(X, y)
        names = probe.feature_names_
        scores = np.empty((len(alphas), len(splits)))
        for j, (train, test) in enumerate(splits):
            est = clone(self)
            Z_train = est._learn_design(X[train], names)
            Z_test = est._standardized(X[test])
            for i, alpha in enumerate(alphas):
                est.alpha = alpha
                est._solve(Z_train, y[train])
                scores[i, j] = -mean_absolute_percentage_error(y[test], est._from_standardized(
                    Z_test))
        return scores

    def _learn_design(self, X: np.ndarray, names: Any) -> np.ndarray:
        """Learn the design from the training rows (column names, the ops with terms of their
        own, packed reductions, the standardisation) and return their standardised matrix."""
        self.names_ = None if names is None else [str(n) for n in names]
        physics = self.design == "physics"
        self.op_codes_ = op_codes_of(X, self.names_) if physics else ()
        self.packed_ = physics and packs_reduction(X, self.names_)
        X = design_matrix(X, self.names_, self.design, self.op_codes_, self.packed_)
        self.mean_, self.scale_ = standardize_fit(X)
        if not np.isfinite(X).all():    # _solve leaves sklearn's own check out
            raise ValueError("The Lasso's cost terms of these rows are not all finite.")
        return (X - self.mean_) / self.scale_

    def _solve(self, Z: np.ndarray, y: np.ndarray) -> None:
        """Fit the weights on standardised rows `Z` at `self.alpha` (Eq. 1)."""
        s = percentage_scale(y)
        lasso = Lasso(alpha=self.alpha, positive=True, max_iter=self.max_iter, tol=self.tol)
        # A tiny alpha on collinear features converges slowly; the solution is still usable and
        # the cross-validation score says how good it is, so the warning is noise here. The
        # rows were checked (finite, positive) before: sklearn's checks again are a third of
        # a small fit's time, and searches run thousands of them.
        with warnings.catch_warnings(), config_context(assume_finite=True,
                                                       skip_parameter_validation=True):
            warnings.simplefilter("ignore", ConvergenceWarning)
            lasso.fit(Z, y / s, sample_weight=percentage_weights(y))
        self.coef_ = lasso.coef_ * s
        self.intercept_ = float(lasso.intercept_ * s)

    def _standardized(self, X: np.ndarray) -> np.ndarray:
        X = design_matrix(X, self.names_, self.design, self.op_codes_, self.packed_)
        return (X - self.mean_) / self.scale_

    def _from_standardized(self, Z: np.ndarray) -> np.ndarray:
        # A linear model can undershoot zero for the smallest kernels; a latency cannot.
        return np.maximum(Z @ self.coef_ + self.intercept_, 0.0)

    def predict(self, X: Any) -> np.ndarray:
        return self._from_standardized(self._standardized(self._check_predict(X)))

    def export(self) -> tuple[bytes, dict[str, Any]]:
        weights = {"mean": self.mean_.tolist(), "scale": self.scale_.tolist(),
                   "coef": self.coef_.tolist(), "intercept": self.intercept_,
                   "design": self.design, "names": self.names_,
                   "op_codes": list(self.op_codes_), "packed": self.packed_}
        return json.dumps(weights).encode(), self.hyperparameters()

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "PositiveLasso":
        w = json.loads(data)
        # The design travels with the weights: a GBDT's linear base is restored from them alone.
        # Weights written before designs existed are the raw design.
        est = cls(**{**params, "design": w.get("design", "raw")})
        est.names_ = w.get("names")
        est.op_codes_ = tuple(w.get("op_codes", ()))  # weights from before per-op terms: none
        est.packed_ = bool(w.get("packed", False))    # and before packed-reduction terms
        est.mean_ = np.asarray(w["mean"], dtype=np.float64)
        est.scale_ = np.asarray(w["scale"], dtype=np.float64)
        est.coef_ = np.asarray(w["coef"], dtype=np.float64)
        est.intercept_ = float(w["intercept"])
        n = len(est.coef_)
        if not (len(est.mean_) == len(est.scale_) == n):
            raise ValueError("lasso weights have inconsistent lengths")
        est.n_features_in_ = len(est.names_) if est.names_ is not None else n
        width = design_matrix(np.zeros((1, est.n_features_in_)), est.names_, est.design,
                              est.op_codes_, est.packed_).shape[1]
        if width != n:
            raise ValueError("lasso weights do not match their design")
        return est
