"""What the four estimator families share: input checks and the artifact contract.

Every family is a scikit-learn regressor (hyperparameters in `__init__`, `fit(X, y)`,
`predict(X)`) that also knows how to write itself as one artifact that cannot run code when
read back: `export()` returns the artifact's bytes and a small JSON-able dict (the
hyperparameters and anything needed to rebuild it), `restore(data, params)` rebuilds a fitted
estimator from them. `persist.py` stores the dict in predictor.json and checks the artifact's
sha256 before `restore` ever sees it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_X_y

from latpred.predictors.objective import check_positive_target


class LatencyRegressor(RegressorMixin, BaseEstimator):
    """Base class of the families: validation at the boundary and the artifact contract."""

    #: File suffix of the artifact, e.g. ".json"; set by each family.
    artifact_suffix: ClassVar[str] = ""
    #: Short name used in predictor.json and on the command line.
    family: ClassVar[str] = ""

    def _check_fit(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        # A DataFrame's column names are kept for families whose design is built from named
        # columns (the Lasso's cost terms, also as the trees' linear base); others ignore them.
        columns = getattr(X, "columns", None)
        self.feature_names_ = None if columns is None else [str(c) for c in columns]
        X, y = check_X_y(X, y, dtype=np.float64, y_numeric=True)
        self.n_features_in_ = X.shape[1]
        return X, check_positive_target(y)

    def _check_predict(self, X: Any) -> np.ndarray:
        # Lighter than sklearn's check_array (50 us a call): predict_many calls this once per
        # kernel type, and for one model those calls are most of the prediction time.
        if not hasattr(self, "n_features_in_"):
            raise NotFittedError(f"This {type(self).__name__} is not fitted yet; call fit.")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be a 2-D array of features, not {X.ndim}-D.")
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was fitted on "
                             f"{self.n_features_in_}.")
        if not np.isfinite(X).all():
            raise ValueError("X contains NaN or infinity.")
        return X

    def hyperparameters(self) -> dict[str, Any]:
        """The `__init__` parameters as JSON-able values."""
        return {k: _jsonable(v) for k, v in self.get_params(deep=False).items()}

    def export(self) -> tuple[bytes, dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "LatencyRegressor":  # pragma: no cover
        raise NotImplementedError


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def standardize_fit(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Training-set mean and population standard deviation per column (the paper's x-hat).

    A constant column gets scale 1 so it standardises to 0 instead of dividing by zero. Constant
    is judged relative to the column's magnitude: the mean of identical floats can be off by an
    ulp, giving a std of ~1e-16 that would turn any unseen value into ~1e15 (an MLP trained on
    such a column predicted 1e18 ms for real-world models it had not seen).
    """
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[scale <= 1e-9 * np.maximum(1.0, np.abs(mean))] = 1.0
    return mean, scale


def percentage_scale(y: np.ndarray) -> float:
    """The latency scale s = 1/sqrt(mean(1/y^2)).

    Fitting y/s with weights 1/y^2 normalised to mean 1 makes the weighted mean squared error
    equal to Eq. 1's mean squared percentage error exactly, so regularisation strengths (alpha,
    weight decay) mean the same whatever the unit or typical size of the latencies.
    """
    return float(1.0 / np.sqrt(np.mean(1.0 / np.square(y))))


class LinearBaseMixin:
    """Optional `base="lasso"`: trees learn the ratio of the latency to a linear baseline.

    Trees are piecewise constant, so on latencies spanning orders of magnitude they
    extrapolate badly at the large end, where the kernels that dominate end-to-end latency
    are. With a baseline b(x) (a non-negative Lasso, floored at half the smallest training
    latency) the trees fit r = y / b(x) and predict b(x) * r-hat. Eq. 1 is unchanged:
    ((b r-hat - y) / y)^2 = ((r-hat - r) / r)^2, so fitting r with weights 1/r^2 minimises
    the same mean squared percentage error. The baseline's weights travel in predictor.json.
    """

    base: str
    base_alpha: float

    def _fit_base(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The target the trees fit: y itself, or y / b(x)."""
        if self.base not in ("none", "lasso"):
            raise ValueError(f"base must be 'none' or 'lasso', not {self.base!r}")
        self.base_ = None
        if self.base == "none":
            return y
        from latpred.predictors.lasso import PositiveLasso

        self.base_ = PositiveLasso(alpha=self.base_alpha).fit(X, y, self.feature_names_)
        self.base_floor_ = 0.5 * float(y.min())
        return y / self._base_of(X)

    def _base_of(self, X: np.ndarray) -> np.ndarray:
        return np.maximum(self.base_.predict(X), self.base_floor_)

    def _apply_base(self, X: np.ndarray, pred: np.ndarray) -> np.ndarray:
        return pred if self.base_ is None else pred * self._base_of(X)

    def _export_base(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.base_ is not None:
            import json

            data, _ = self.base_.export()
            params = {**params, "linear_base": {"weights": json.loads(data),
                                                "floor": self.base_floor_}}
        return params

    @classmethod
    def _restored(cls, params: dict[str, Any]):
        """An unfitted instance from exported params, with its baseline (if any) set."""
        params = dict(params)
        lb = params.pop("linear_base", None)
        est = cls(**params)
        est.base_ = None
        if lb is not None:
            import json

            from latpred.predictors.lasso import PositiveLasso

            est.base_ = PositiveLasso.restore(json.dumps(lb["weights"]).encode(),
                                              {"alpha": est.base_alpha})
            est.base_floor_ = float(lb["floor"])
        return est


class ComposedRegressor(LatencyRegressor):
    """A regressor assembled from fitted parts by another stage (`built_by`: adaptation, the
    launch-pattern stage); it is never fitted itself."""

    built_by: ClassVar[str] = ""

    def fit(self, X: Any, y: Any) -> "ComposedRegressor":  # pragma: no cover - built elsewhere
        raise NotImplementedError(f"{type(self).__name__} is built by {self.built_by}.")
