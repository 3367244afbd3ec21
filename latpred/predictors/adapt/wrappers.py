"""The adapted predictor's persisted regressors: each saves as one JSON artifact that embeds the
regressors it wraps (base64, with their sha256, checked when loaded), so an adapted predictor
is an ordinary predictor directory (predictors/persist.py registers these families)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, ClassVar, Sequence

import numpy as np

from latpred.predictors.base import ComposedRegressor, LatencyRegressor


class AdaptedRegressor(ComposedRegressor):
    """A source regressor times a factor, optionally times a residual GBDT's ratio."""

    artifact_suffix: ClassVar[str] = ".adapted.json"
    family: ClassVar[str] = "adapted"
    built_by: ClassVar[str] = "latpred.predictors.adapt"

    def __init__(self, base: LatencyRegressor | None = None, scale: float = 1.0,
                 residual: LatencyRegressor | None = None,
                 feature_scale: Sequence[float] | None = None):
        self.base = base
        self.scale = scale
        self.residual = residual
        self.feature_scale = None if feature_scale is None else tuple(feature_scale)
        if base is not None:
            self.n_features_in_ = base.n_features_in_

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        seen = X if self.feature_scale is None else X * np.asarray(self.feature_scale)
        p = self.base.predict(seen) * self.scale
        return p if self.residual is None else p * self.residual.predict(X)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        doc = {"scale": float(self.scale), "base": pack(self.base),
               "feature_scale": None if self.feature_scale is None else list(self.feature_scale),
               "residual": pack(self.residual) if self.residual is not None else None}
        return json.dumps(doc).encode(), {}

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "AdaptedRegressor":
        doc = json.loads(data.decode("utf-8"))
        residual = unpack(doc["residual"]) if doc.get("residual") else None
        return cls(unpack(doc["base"]), float(doc["scale"]), residual, doc.get("feature_scale"))


class StackedRegressor(ComposedRegressor):
    """A linear-family regressor over a type's features plus `base`'s prediction (the source
    regressor times its factor) as one more column."""

    artifact_suffix: ClassVar[str] = ".stacked.json"
    family: ClassVar[str] = "stacked"
    built_by: ClassVar[str] = "latpred.predictors.adapt"

    def __init__(self, base: AdaptedRegressor | None = None,
                 head: LatencyRegressor | None = None,
                 residual: LatencyRegressor | None = None):
        self.base, self.head, self.residual = base, head, residual
        if base is not None:
            self.n_features_in_ = base.n_features_in_

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        p = self.head.predict(np.column_stack([X, self.base.predict(X)]))
        return p if self.residual is None else p * self.residual.predict(X)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        data, _ = self.base.export()
        doc = {"base": json.loads(data.decode("utf-8")), "head": pack(self.head),
               "residual": pack(self.residual) if self.residual is not None else None}
        return json.dumps(doc).encode(), {}

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "StackedRegressor":
        doc = json.loads(data.decode("utf-8"))
        base = AdaptedRegressor.restore(json.dumps(doc["base"]).encode(), {})
        residual = unpack(doc["residual"]) if doc.get("residual") else None
        return cls(base, unpack(doc["head"]), residual)


def mixed(adapted: np.ndarray, scratch: np.ndarray, weight: np.ndarray | float,
          low: np.ndarray | float) -> np.ndarray:
    """weight x `adapted` + (1 - weight) x `scratch` for kernels at least as long as the
    scratch regressor's rows (an adapted prediction of at least `low`, the smallest on the
    rows it was trained on); below, the scratch share shrinks as adapted / low.

    The scratch regressor learned from 10-30 models' kernels, the adapted one from the
    source's whole dataset. Past the few models' largest kernel a scratch fit's error in
    percent levels off (its slope is off by a fraction); below their smallest it grows
    without bound (its intercept, a fraction of a millisecond, prices a 0.1 ms kernel). On
    the third VM -> second VM, 10 synthetic models, one draw blended a Lasso on five 7x7
    depthwise IGEMM kernels of 1.8-8.1 ms at 0.25: it priced the test set's 864 kernels under
    2 ms at 2.7x and the whole set +19% too slow (docs/fewshot.md, session 36). Shrinking the
    share on both sides cost two int8 pairs up to 2 points, where the scratch trees follow
    the int8 convolutions' cost past the few models' largest kernel and the source does not.
    """
    share = np.minimum(1.0, adapted / np.maximum(low, 1e-12))
    return adapted + (1.0 - weight) * share * (scratch - adapted)


class BlendedRegressor(ComposedRegressor):
    """weight x `adapted` + (1 - weight) x `scratch`, each on its own columns of X (the union of
    the adapted type's and the scratch type's features): the adapted source and a regressor
    trained on the new device's rows alone, averaged where cross-validation says so, the
    scratch share shrinking below `low` (`mixed`)."""

    artifact_suffix: ClassVar[str] = ".blended.json"
    family: ClassVar[str] = "blended"
    built_by: ClassVar[str] = "latpred.predictors.adapt"

    def __init__(self, adapted: LatencyRegressor | None = None,
                 adapted_columns: Sequence[int] = (),
                 scratch: LatencyRegressor | None = None,
                 scratch_columns: Sequence[int] = (), weight: float = 1.0,
                 low: float = 0.0):
        self.adapted, self.scratch, self.weight = adapted, scratch, float(weight)
        self.low = float(low)
        self.adapted_columns = tuple(int(c) for c in adapted_columns)
        self.scratch_columns = tuple(int(c) for c in scratch_columns)
        self.n_features_in_ = max((*self.adapted_columns, *self.scratch_columns), default=-1) + 1

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        a = self.adapted.predict(X[:, list(self.adapted_columns)])
        s = self.scratch.predict(X[:, list(self.scratch_columns)])
        return mixed(a, s, self.weight, self.low)

    def export(self) -> tuple[bytes, dict[str, Any]]:
        doc = {"weight": self.weight, "low": self.low, "adapted": pack(self.adapted),
               "adapted_columns": list(self.adapted_columns), "scratch": pack(self.scratch),
               "scratch_columns": list(self.scratch_columns)}
        return json.dumps(doc).encode(), {}

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "BlendedRegressor":
        # artifacts written before `low` existed blend every kernel alike
        doc = json.loads(data.decode("utf-8"))
        return cls(unpack(doc["adapted"]), doc["adapted_columns"], unpack(doc["scratch"]),
                   doc["scratch_columns"], float(doc["weight"]), float(doc.get("low", 0.0)))


WRAPPERS: dict[str, type[LatencyRegressor]] = {
    c.family: c for c in (AdaptedRegressor, StackedRegressor, BlendedRegressor)}


def pack(reg: Any) -> dict[str, Any]:
    """`reg`'s artifact as a JSON entry (family, params, sha256, base64 bytes)."""
    from latpred.predictors.launch import LaunchStaged

    if isinstance(reg, LaunchStaged):   # a source type with the launch-pattern stage
        return {"family": LaunchStaged.family, "regressor": pack(reg.regressor),
                "classifier": pack(reg.classifier)}
    data, params = reg.export()
    return {"family": type(reg).family, "params": params,
            "sha256": hashlib.sha256(data).hexdigest(),
            "artifact": base64.b64encode(data).decode("ascii")}


def unpack(entry: dict[str, Any]) -> LatencyRegressor:
    """The regressor of a `pack` entry; ValueError where its bytes fail their sha256."""
    from latpred.predictors.launch import LaunchClassifier, LaunchStaged
    from latpred.predictors.search import FAMILIES

    if entry["family"] == LaunchStaged.family:
        c = entry["classifier"]
        return LaunchStaged(unpack(entry["regressor"]),
                            LaunchClassifier.restore(_checked(c), dict(c["params"])))
    data = _checked(entry)
    families = {**FAMILIES, **WRAPPERS}
    if entry["family"] not in families:
        raise ValueError(f"unknown embedded family {entry['family']!r}")
    return families[entry["family"]].restore(data, dict(entry["params"]))


def _checked(entry: dict[str, Any]) -> bytes:
    """A `pack` entry's artifact bytes; ValueError where they fail their sha256."""
    data = base64.b64decode(entry["artifact"])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError("an embedded artifact does not match its sha256")
    return data
