"""The launch-pattern stage: which of cuDNN's launch sequences a grouped convolution runs.

cuDNN (benchmark off) runs one of some 64 launch patterns per grouped convolution on the H100
(one grouped kernel; two kernels; per-group loops of memsets, NCHW/NHWC transforms and convs;
...), chosen by its heuristics from the geometry, and the pattern sets much of the latency:
on h100-cuda-synthetic the grouped-conv regressor errs 14.7% per kernel on its features and
6.9% when it is told the pattern cuDNN ran (docs/results/cuda-campaigns/README.md, session 9;
`scripts/cuda_grouped_diag.py pattern`). The pattern is only known after running, but the
features nearly determine it, so for the kernel types of `LAUNCH_TYPES` whose training rows
carry the CUDA datasets' `launches` column (every row of the type), training adds a stage:

- the rows' patterns (`launches` without the fused epilogue's trailing
  "+elementwise+activation") are named canonically: a per-group loop (G groups, G convs, the
  launches G repeats of a unit of equal length) is "loop:" + its units' launch kinds, whatever
  G (cuDNN's fallback runs one conv per group: 2 groups and 20 are the same pattern, 2 and 20
  times); the classes are the `TOP_PATTERNS` commonest, the rest pooled into "loop:other" or
  "other"; a LightGBM classifier of those classes is trained on the type's features but the
  graph-level `context_bytes` (cuDNN chooses from the convolution alone), each row weighted
  by the square root of its latency (`WEIGHT_POWER`): a slow kernel given the wrong pattern
  costs the model's latency more than a fast one (protocol (a), seeds 1 and 2: end to end
  3.35% -> 3.24% and 3.41% -> 3.22%, seed 0 unchanged; weighted by the latency itself, a
  diagnostic's split lost 0.1 point);
- a loop's latency is about G times its unit's, which trees cannot extrapolate to G beyond
  the training rows': the regressor learns the latency per repetition (latency / G for a loop
  class, the latency otherwise; the same relative error, so the same Eq. 1) and the stage
  multiplies its prediction by the predicted class's repetitions (`repetitions`);
- the regressor is trained on the pattern class each training row really ran (one-hot
  columns `launch_p0..`) and, at prediction, given the classifier's likeliest class the same
  way (one-hot). Trained on out-of-fold probabilities instead (the first version), it learned
  to hedge between patterns and erred 11.6% per kernel in the diagnostic's CV against 9.5%
  this way (`scripts/cuda_grouped_diag.py pattern`; probabilities fed to a regressor trained
  on the true class: 46%). The classifier's out-of-fold accuracy (GroupKFold by model,
  `FOLDS` folds) is still computed and stored in the fit's metrics.

The type's TypeFit then holds a `LaunchStaged` regressor: it takes the type's usual feature
rows and appends the classifier's columns (`stage_columns`) itself, so `predict`, the batched
path and the supernet scorer call it like any regressor. Every family gets the columns. Datasets
without `launches` (every non-CUDA target) train no stage and exactly the model they trained
before. The classifier is saved as a LightGBM text model next to the regressor's artifact,
its sha256 in predictor.json (predictors/persist.py).

Protocol (a) on h100-cuda-synthetic (GBDT), probabilities: grouped convs 14.6% -> 12.6% per
kernel, end to end 3.91% -> 3.63%; protocol (c) on the zoo unchanged (2.72%). One-hot, and
loops per repetition: see docs/results/cuda-campaigns/README.md, sessions 12 and 13.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd

from latpred.predictors.base import ComposedRegressor, LatencyRegressor

# Kernel types whose regressor gets the launch-pattern stage when their rows carry `launches`.
LAUNCH_TYPES = frozenset({"grouped_conv2d"})
LAUNCH_COLUMN = "launches"
# The fused epilogue a kernel's launches end with whatever cuDNN chose for the convolution.
EPILOGUE = re.compile(r"\+elementwise\+activation$")
TOP_PATTERNS = 8          # classes: the commonest patterns, the others pooled
OTHER = "other"
LOOP = "loop:"            # class-name prefix of cuDNN's per-group loops
LOOP_OTHER = LOOP + "other"
GROUPS = "groups"         # the feature a loop class repeats its unit by
PER_GROUP, NO_SCALING = "per_group", "none"   # how the regressor's target is scaled
FOLDS = 5                 # the classifier's out-of-fold accuracy: GroupKFold by model
MIN_ROWS = 20             # fewer training rows of the type: no stage
COLUMN_PREFIX = "launch_p"
ONE_HOT, PROBABILITIES = "one_hot", "probabilities"   # what the regressor's columns hold
ENCODINGS = (ONE_HOT, PROBABILITIES)
ARTIFACT_SUFFIX = ".launch.lgb.txt"
# Fixed, small: `scripts/cuda_grouped_diag.py pattern`'s classifier (95% accurate on held-out
# models of h100-cuda-synthetic).
CLASSIFIER_PARAMS = {"n_estimators": 300, "learning_rate": 0.05, "num_leaves": 15,
                     "min_child_samples": 5}
WEIGHT_POWER = 0.5        # the classifier's row weights: latency ** WEIGHT_POWER


def launch_patterns(launches: Sequence[str] | pd.Series,
                    groups: Sequence[float] | None = None) -> np.ndarray:
    """The launch pattern of each kernel: its launches without the fused epilogue; with the
    rows' `groups`, per-group loops named canonically (`loop_name`)."""
    pats = [EPILOGUE.sub("", str(s)) for s in launches]
    if groups is not None:
        pats = [loop_name(p, int(g)) for p, g in zip(pats, groups)]
    return np.array(pats, dtype=object)


def loop_name(pattern: str, groups: int) -> str:
    """"loop:" + the sorted set of unit kinds where `pattern` runs one conv per group in
    `groups` units of equal length (cuDNN's per-group fallback: e.g. 'other+conv+other' x G),
    else `pattern` unchanged."""
    launches = pattern.split("+")
    if groups < 2 or launches.count("conv") != groups or len(launches) % groups:
        return pattern
    n = len(launches) // groups
    units = {"+".join(sorted(launches[i * n:(i + 1) * n])) for i in range(groups)}
    return LOOP + "|".join(sorted(units))


def applies(kernel_type: str, rows: pd.DataFrame) -> bool:
    """Whether a kernel type's training rows get the stage: a type of LAUNCH_TYPES, enough rows,
    every one with its launches, and at least two pattern classes."""
    if kernel_type not in LAUNCH_TYPES or LAUNCH_COLUMN not in rows or len(rows) < MIN_ROWS:
        return False
    launches = rows[LAUNCH_COLUMN]
    if launches.isna().any() or (launches.astype(str) == "").any():
        return False
    return len(set(launch_patterns(launches))) >= 2


def pattern_classes(patterns: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """The classes (the TOP_PATTERNS commonest patterns, most rows first, ties by name, then
    LOOP_OTHER and OTHER where rare loops / other patterns are left) and each row's class
    index."""
    counts = pd.Series(patterns).value_counts()
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    classes = [p for p, _ in ranked[:TOP_PATTERNS]]
    rest = [p for p, _ in ranked[TOP_PATTERNS:]]
    pool = {p: LOOP_OTHER if p.startswith(LOOP) else OTHER for p in rest}
    classes += sorted(set(pool.values()), key=[LOOP_OTHER, OTHER].index)
    index = {p: i for i, p in enumerate(classes)}
    labels = np.array([index[pool.get(p, p)] for p in patterns], dtype=np.int64)
    return tuple(classes), labels


def classifier_inputs(features: Sequence[str]) -> tuple[str, ...]:
    """The features the classifier reads: the type's, but the graph-level context."""
    from latpred.features import CONTEXT

    return tuple(f for f in features if f != CONTEXT)


class LaunchClassifier:
    """LightGBM multiclass model of the launch-pattern classes from a type's feature rows
    (of `features`; it reads the columns `inputs` of them)."""

    family: ClassVar[str] = "launch_classifier"

    def __init__(self, classes: Sequence[str], booster: Any, features: Sequence[str],
                 inputs: Sequence[str], encoding: str = ONE_HOT, scaling: str = NO_SCALING):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown launch-column encoding {encoding!r}")
        if scaling not in (PER_GROUP, NO_SCALING) or (scaling == PER_GROUP
                                                      and GROUPS not in features):
            raise ValueError(f"unknown launch target scaling {scaling!r}")
        self.encoding = encoding
        self.scaling = scaling
        self.classes = tuple(classes)
        self.booster = booster
        self.features = tuple(features)
        self.inputs = tuple(inputs)
        self.n_features = len(self.features)
        self._columns = np.array([self.features.index(f) for f in self.inputs], dtype=np.intp)
        self._loops = np.array([c.startswith(LOOP) for c in self.classes], dtype=bool)

    @classmethod
    def fit(cls, X: np.ndarray, labels: np.ndarray, classes: Sequence[str],
            features: Sequence[str], seed: int = 0,
            weights: np.ndarray | None = None) -> "LaunchClassifier":
        """Fit on feature rows X (columns `features`), optionally weighted per row."""
        import lightgbm as lgb

        inputs = classifier_inputs(features)
        X = np.asarray(X, dtype=np.float64)[:, [list(features).index(f) for f in inputs]]
        p = CLASSIFIER_PARAMS
        params = {"objective": "multiclass", "num_class": len(classes),
                  "learning_rate": p["learning_rate"], "num_leaves": p["num_leaves"],
                  "min_data_in_leaf": p["min_child_samples"], "seed": seed, "num_threads": 1,
                  "deterministic": True, "force_col_wise": True, "verbose": -1}
        data = lgb.Dataset(X, label=labels, weight=weights, params={"verbose": -1})
        booster = lgb.train(params, data, num_boost_round=p["n_estimators"])
        return cls(classes, booster, features, inputs,
                   scaling=PER_GROUP if GROUPS in features else NO_SCALING)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """(rows, classes) probabilities of feature rows (columns `features`)."""
        X = np.asarray(X, dtype=np.float64)[:, self._columns]
        P = self.booster.predict(X, num_threads=1)
        return np.asarray(P, dtype=np.float64).reshape(len(X), len(self.classes))

    def stage_columns(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The columns the regressor reads beside the type's features: the likeliest class,
        one-hot (predictors saved before the one-hot stage: the probabilities they were
        trained on); and each row's `repetitions` of that class."""
        P = self.predict_proba(X)
        labels = P.argmax(axis=1)
        cols = P if self.encoding == PROBABILITIES else one_hot(labels, P.shape[1])
        return cols, self.repetitions(X, labels)

    def repetitions(self, X: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """What the regressor's per-repetition prediction is multiplied by: the rows' groups
        where their class is a loop and the target is scaled per group, else 1 (predictors
        saved before the scaling: 1)."""
        if self.scaling == NO_SCALING:
            return np.ones(len(labels))
        groups = np.asarray(X, dtype=np.float64)[:, self.features.index(GROUPS)]
        return np.where(self._loops[labels], np.maximum(groups, 1.0), 1.0)

    def columns(self) -> list[str]:
        return [f"{COLUMN_PREFIX}{i}" for i in range(len(self.classes))]

    # -- artifact: LightGBM's text model (parsed, never executed) and a JSON-able dict --------
    def export(self) -> tuple[bytes, dict[str, Any]]:
        return (self.booster.model_to_string().encode(),
                {"classes": list(self.classes), "features": list(self.features),
                 "inputs": list(self.inputs), "params": dict(CLASSIFIER_PARAMS),
                 "encoding": self.encoding, "scaling": self.scaling,
                 "weight_power": WEIGHT_POWER})

    @classmethod
    def restore(cls, data: bytes, params: dict[str, Any]) -> "LaunchClassifier":
        import lightgbm as lgb

        booster = lgb.Booster(model_str=data.decode("utf-8"))
        classes = [str(c) for c in params["classes"]]
        features, inputs = [str(f) for f in params["features"]], [str(f) for f in params["inputs"]]
        if not set(inputs) <= set(features) or booster.num_feature() != len(inputs) or \
                booster.num_model_per_iteration() != len(classes):
            raise ValueError("the launch classifier does not match its declared shape")
        # Artifacts written before the one-hot stage have no "encoding": probabilities; before
        # the per-group loops no "scaling": none.
        return cls(classes, booster, features, inputs, params.get("encoding", PROBABILITIES),
                   params.get("scaling", NO_SCALING))


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    out = np.zeros((len(labels), n_classes))
    out[np.arange(len(labels)), labels] = 1.0
    return out


def out_of_fold(X: np.ndarray, labels: np.ndarray, classes: Sequence[str],
                features: Sequence[str], groups: np.ndarray | None, seed: int = 0,
                weights: np.ndarray | None = None) -> np.ndarray:
    """Each row's class probabilities from a classifier trained on the other folds (grouped by
    model when `groups` is given)."""
    from sklearn.model_selection import GroupKFold, KFold

    X = np.asarray(X, dtype=np.float64)
    n_groups = len(np.unique(groups)) if groups is not None else len(X)
    folds = min(FOLDS, n_groups)
    if folds < 2:
        return LaunchClassifier.fit(X, labels, classes, features, seed,
                                    weights).predict_proba(X)
    split = (KFold(folds, shuffle=True, random_state=seed).split(X) if groups is None else
             GroupKFold(folds, shuffle=True, random_state=seed).split(X, labels, groups))
    out = np.zeros((len(X), len(classes)))
    for tr, te in split:
        out[te] = LaunchClassifier.fit(X[tr], labels[tr], classes, features, seed,
                                       None if weights is None else weights[tr]
                                       ).predict_proba(X[te])
    return out


def fit_stage(X: np.ndarray, features: Sequence[str], rows: pd.DataFrame, seed: int = 0
              ) -> tuple[LaunchClassifier, np.ndarray, np.ndarray, dict[str, Any]]:
    """The classifier (fitted on every row), the regressor's extra training columns (each
    row's true class, one-hot), what each row's latency is divided by for the regressor
    (its true class's repetitions) and metrics (the classifier's out-of-fold accuracy), for
    training rows that `applies` accepts (X: their rows of `features`, in row order)."""
    X = np.asarray(X, dtype=np.float64)
    groups_col = X[:, list(features).index(GROUPS)] if GROUPS in features else None
    patterns = launch_patterns(rows[LAUNCH_COLUMN], groups_col)
    classes, labels = pattern_classes(patterns)
    groups = rows["model_id"].to_numpy() if "model_id" in rows else None
    weights = rows["latency_ms"].to_numpy(np.float64) ** WEIGHT_POWER \
        if "latency_ms" in rows else None
    oof = out_of_fold(X, labels, classes, features, groups, seed, weights)
    clf = LaunchClassifier.fit(X, labels, classes, features, seed, weights)
    metrics = {"n_patterns": int(len(set(patterns))), "n_classes": len(classes),
               "oof_accuracy": float(np.mean(np.argmax(oof, axis=1) == labels))}
    return clf, one_hot(labels, len(classes)), clf.repetitions(X, labels), metrics


class LaunchStaged(ComposedRegressor):
    """A type's regressor behind its launch classifier: takes the type's feature rows, appends
    the classifier's `stage_columns`, predicts with the regressor trained on both (a loop's
    latency per repetition) and multiplies by the predicted class's `repetitions`."""

    family: ClassVar[str] = "launch"
    built_by: ClassVar[str] = "latpred.predictors.training"

    def __init__(self, regressor: LatencyRegressor | None = None,
                 classifier: LaunchClassifier | None = None):
        self.regressor = regressor
        self.classifier = classifier
        if classifier is not None:
            self.n_features_in_ = classifier.n_features

    def predict(self, X: Any) -> np.ndarray:
        X = self._check_predict(X)
        cols, reps = self.classifier.stage_columns(X)
        return self.regressor.predict(np.hstack([X, cols])) * reps
