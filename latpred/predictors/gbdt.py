"""Gradient-boosted decision trees (LightGBM) fitted on the mean squared percentage error.

LightGBM's built-in L2 objective with sample weights 1/y^2 has, per row, gradient
w (f - y) and hessian w: exactly the gradient and hessian of Eq. 1 (`objective.mspe_objective`),
so it optimises the paper's objective while staying in LightGBM's C++ core (a Python callback
objective is several times slower); tests check both give the same model.

The paper's "number of examples required to split a node" maps to LightGBM's
`min_child_samples` (examples per leaf). Prediction runs on one thread: a NAS loop calls it on
one large matrix per kernel type, where threads buy little and cost start-up time.
The artifact is LightGBM's own text model format, which is parsed, never executed.
`base="lasso"` (searched in the `latpred` grid) makes the trees fit the ratio of the latency to
a linear baseline (see `base.LinearBaseMixin`), still on Eq. 1.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from latpred.predictors.base import LatencyRegressor, LinearBaseMixin
from latpred.predictors.objective import percentage_weights


class PercentGBDT(LinearBaseMixin, LatencyRegressor):
    """LightGBM regressor whose boosting minimises the squared percentage error."""

    artifact_suffix: ClassVar[str] = ".lgb.txt"
    family: ClassVar[str] = "gbdt"

    def __init__(self, n_estimators: int = 200, learning_rate: float = 0.1,
                 num_leaves: int = 31, max_depth: int = -1, min_child_samples: int = 5,
                 subsample: float = 1.0, colsample_bytree: float = 1.0,
                 reg_lambda: float = 0.0, base: str = "none", base_alpha: float = 1e-4,
                 random_state: int = 0):
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.max_depth = max_depth
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.reg_lambda = reg_lambda
        self.base = base
        self.base_alpha = base_alpha
        self.random_state = random_state

    def _lgb_params(self) -> dict[str, Any]:
        return dict(
            n_estimators=self.n_estimators, learning_rate=self.learning_rate,
            num_leaves=self.num_leaves, max_depth=self.max_depth,
            min_child_samples=self.min_child_samples, subsample=self.subsample,
            subsample_freq=1 if self.subsample < 1.0 else 0,
            colsample_bytree=self.colsample_bytree, reg_lambda=self.reg_lambda,
            random_state=self.random_state, n_jobs=1, deterministic=True, verbose=-1,
            # Small kernel tables: let a bin hold few rows so rare shapes still get splits.
            min_data_in_bin=1)

    def fit(self, X: Any, y: Any, objective: Any = "regression") -> "PercentGBDT":
        """Fit; `objective` is for tests comparing the weighted L2 with the explicit Eq. 1."""
        import lightgbm as lgb

        X, y = self._check_fit(X, y)
        y = self._fit_base(X, y)
        if len(y) == 1:
            # LightGBM wants two rows; one given twice fits what one row can: a constant (a
            # kernel type that a few models hold once, e.g. few-shot training)
            X, y = np.repeat(X, 2, axis=0), np.repeat(y, 2)
        if callable(objective):
            model = lgb.LGBMRegressor(objective=objective, **self._lgb_params())
            # A custom objective starts from 0; start from the percentage-optimal constant.
            w = percentage_weights(y)
            init = np.full(len(y), np.sum(w * y) / np.sum(w))
            model.fit(X, y, init_score=init)
            self.init_score_ = float(init[0])
        else:
            model = lgb.LGBMRegressor(objective=objective, **self._lgb_params())
            model.fit(X, y, sample_weight=percentage_weights(y))
            self.init_score_ = 0.0
        self.booster_ = model.booster_
        return self

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        return self._apply_base(X, self.booster_.predict(X, num_threads=1) + self.init_score_)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        if self.init_score_ != 0.0:
            raise ValueError("a GBDT fitted with a callback objective is for comparison only")
        return (self.booster_.model_to_string().encode(),
                self._export_base(self.hyperparameters()))

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "PercentGBDT":
        import lightgbm as lgb

        est = cls._restored(params)
        est.booster_ = lgb.Booster(model_str=data.decode("utf-8"))
        est.init_score_ = 0.0
        est.n_features_in_ = int(est.booster_.num_feature())
        return est
