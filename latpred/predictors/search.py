"""Hyperparameter searches: the paper's grids (section 4.2) and latpred's own, cross-validated.

Searches are data, in `configs/predictors/<family>.yaml` (one file per family, several named
searches in each: `paper`, `latpred`). A search is scikit-learn's `GridSearchCV` or
`RandomizedSearchCV` scored by the mean absolute percentage error, the figure the evaluation
reports; the estimators themselves train on Eq. 1. `none` skips the search and fits the
family's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latpred.errors import ConfigError
from latpred.predictors import cluster
from latpred.predictors.base import LatencyRegressor
from latpred.predictors.forest import PercentRandomForest
from latpred.predictors.gbdt import PercentGBDT
from latpred.predictors.lasso import PositiveLasso
from latpred.predictors.mlp import PercentMLP
from latpred.predictors.objective import neg_mape_scorer

FAMILIES: dict[str, type[LatencyRegressor]] = {
    "lasso": PositiveLasso, "rf": PercentRandomForest, "gbdt": PercentGBDT, "mlp": PercentMLP}

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "predictors"

# Below this many rows a kernel type is fitted with the defaults: a 2-fold split of fewer rows
# scores noise, not hyperparameters.
MIN_ROWS_TO_SEARCH = 10


@dataclass(frozen=True)
class SearchSpec:
    """One named search of one family."""

    family: str
    name: str
    method: str = "grid"  # grid | random | none
    cv: int = 5
    n_iter: int = 10
    params: dict[str, tuple] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    def estimator(self, seed: int = 0) -> LatencyRegressor:
        """The family's estimator with the fixed hyperparameters (and the seed) applied."""
        est = FAMILIES[self.family](**self.fixed)
        if "random_state" in est.get_params():
            est.set_params(random_state=seed)
        return est


def family_class(family: str) -> type[LatencyRegressor]:
    if family not in FAMILIES:
        raise ConfigError(f"Unknown predictor family {family!r}; choose one of "
                          f"{', '.join(FAMILIES)}.")
    return FAMILIES[family]


def load_search(family: str, name: str = "latpred", path: str | Path | None = None) -> SearchSpec:
    """The search `name` of `family`, from `path` or `configs/predictors/<family>.yaml`."""
    family_class(family)
    if name == "none":
        return SearchSpec(family, "none", method="none")
    import yaml

    path = Path(path) if path else CONFIG_DIR / f"{family}.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"Cannot read the search file {path}: {err}.") from None
    searches = (doc or {}).get("searches") if isinstance(doc, dict) else None
    if not isinstance(searches, dict) or name not in searches:
        raise ConfigError(f"{path} has no search named {name!r}.")
    return _spec(family, name, searches[name], path)


def _spec(family: str, name: str, d: Any, path: Path) -> SearchSpec:
    if not isinstance(d, dict):
        raise ConfigError(f"Search {name!r} in {path} must be a mapping.")
    unknown = set(d) - {"method", "cv", "n_iter", "params", "fixed"}
    if unknown:
        raise ConfigError(f"Search {name!r} in {path} has unknown keys {sorted(unknown)}.")
    method = d.get("method", "grid")
    if method not in ("grid", "random", "none"):
        raise ConfigError(f"Search {name!r} in {path}: method must be grid, random or none.")
    params = {k: _values(v, k, path) for k, v in (d.get("params") or {}).items()}
    fixed = dict(d.get("fixed") or {})
    valid = set(FAMILIES[family]().get_params())
    bad = (set(params) | set(fixed)) - valid
    if bad:
        raise ConfigError(f"Search {name!r} in {path} names hyperparameters {sorted(bad)} that "
                          f"the {family} family does not have.")
    cv, n_iter = d.get("cv", 5), d.get("n_iter", 10)
    if not (isinstance(cv, int) and cv >= 2 and isinstance(n_iter, int) and n_iter >= 1):
        raise ConfigError(f"Search {name!r} in {path}: cv must be an integer >= 2 and n_iter >= 1.")
    return SearchSpec(family, name, method, cv, n_iter, params, fixed)


def _values(v: Any, key: str, path: Path) -> tuple:
    """A hyperparameter's candidate values: a list, {logspace: [a, b, n]} or {range: [a, b, s]}."""
    if isinstance(v, list) and v:
        return tuple(v)
    if isinstance(v, dict) and len(v) == 1:
        (kind, args), = v.items()
        if kind == "logspace" and isinstance(args, list) and len(args) == 3:
            return tuple(float(x) for x in np.logspace(args[0], args[1], int(args[2])))
        if kind == "range" and isinstance(args, list) and len(args) in (2, 3):
            return tuple(range(*(int(a) for a in args)))
    raise ConfigError(f"Hyperparameter {key!r} in {path} must be a non-empty list, "
                      "{logspace: [a, b, n]} or {range: [a, b, step]}.")


@dataclass(frozen=True)
class SearchResult:
    """The fitted best estimator and what the search found."""

    estimator: LatencyRegressor
    best_params: dict[str, Any]
    cv_mape: float | None  # mean cross-validated MAPE of the best candidate; None if no search
    n_candidates: int


def fit_searched(spec: SearchSpec, X: np.ndarray, y: np.ndarray, seed: int = 0,
                 groups: np.ndarray | None = None) -> SearchResult:
    """Search `spec` by cross-validation on (X, y) and refit the best on all rows.

    `groups` (the model each row comes from) keeps a model's kernels in one fold: kernels of
    one model share shapes, so row-wise folds score memorising them, which favours
    over-fitted candidates most when there are few models.
    """
    base = spec.estimator(seed)
    folds = min(spec.cv, len(y) // 5)
    if groups is not None:
        folds = min(folds, len(np.unique(groups)))
    if spec.method == "none" or not spec.params or len(y) < MIN_ROWS_TO_SEARCH or folds < 2:
        return SearchResult(base.fit(X, y), {}, None, 1)
    from sklearn.model_selection import (GridSearchCV, GroupKFold, KFold,
                                         RandomizedSearchCV)

    cv = (KFold(folds, shuffle=True, random_state=seed) if groups is None else
          list(GroupKFold(folds, shuffle=True, random_state=seed).split(X, y, groups)))
    grid = {k: list(v) for k, v in spec.params.items()}
    if spec.method == "grid" and set(grid) == {"alpha"} and hasattr(base, "alpha_scores"):
        return alpha_search(base, grid["alpha"], X, y, cv)
    if cluster.active():
        return _search_on_cluster(base, _candidates(spec, grid, seed), X, y, cv)
    if spec.method == "grid":
        search = GridSearchCV(base, grid, scoring=neg_mape_scorer, cv=cv, n_jobs=1,
                              error_score="raise")
    else:
        search = RandomizedSearchCV(base, grid, n_iter=spec.n_iter, scoring=neg_mape_scorer,
                                    cv=cv, n_jobs=1, random_state=seed, error_score="raise")
    search.fit(X, y)
    return SearchResult(search.best_estimator_, dict(search.best_params_),
                        float(-search.best_score_), len(search.cv_results_["params"]))


def _candidates(spec: SearchSpec, grid: dict[str, list], seed: int) -> list[dict[str, Any]]:
    """The candidates GridSearchCV / RandomizedSearchCV try, in their order."""
    from sklearn.model_selection import ParameterGrid, ParameterSampler

    if spec.method == "grid":
        return list(ParameterGrid(grid))
    return list(ParameterSampler(grid, spec.n_iter, random_state=seed))


def _search_on_cluster(base: Any, candidates: list[dict[str, Any]], X: Any, y: np.ndarray,
                       cv: Any) -> SearchResult:
    """The search GridSearchCV would run, each (candidate, fold) fit a task on the cluster
    (`cluster.run_all`): the same fits and scores, and the best candidate by its rule (the
    first of the highest mean fold scores), refitted on all rows here."""
    from sklearn.base import clone

    splits = cv if isinstance(cv, list) else list(cv.split(X, y))
    jobs = [(base, params, X, y, train, test) for params in candidates for train, test in splits]
    scores = np.array(cluster.run_all(_fold_score, jobs), np.float64)
    mean = np.average(scores.reshape(len(candidates), len(splits)), axis=1)
    best = int(np.argmax(mean))
    est = clone(base).set_params(**clone(candidates[best], safe=False)).fit(X, y)
    return SearchResult(est, dict(candidates[best]), float(-mean[best]), len(candidates))


def _fold_score(base: Any, params: dict[str, Any], X: Any, y: np.ndarray, train: np.ndarray,
                test: np.ndarray) -> float:
    """One candidate fitted on a fold's training rows and scored on its test rows, as
    scikit-learn's searches do (negative MAPE)."""
    from sklearn.base import clone

    rows = (lambda a, i: a.iloc[i]) if hasattr(X, "iloc") else (lambda a, i: a[i])
    est = clone(base).set_params(**clone(params, safe=False)).fit(rows(X, train), y[train])
    return float(neg_mape_scorer(est, rows(X, test), y[test]))


def alpha_search(base: Any, alphas: list[float], X: Any, y: Any, cv: Any) -> SearchResult:
    """GridSearchCV over `alphas` alone, for an estimator that scores the grid itself
    (`PositiveLasso.alpha_scores`: the same fits and scores, one design matrix a split); the
    best is picked and refitted as GridSearchCV does (the first of the highest mean scores)."""
    from sklearn.base import clone

    splits = cv if isinstance(cv, list) else list(cv.split(X, y))
    mean = np.average(base.alpha_scores(X, y, alphas, splits), axis=1)
    best = int(np.argmax(mean))
    est = clone(base).set_params(alpha=alphas[best]).fit(X, y)
    return SearchResult(est, {"alpha": alphas[best]}, float(-mean[best]), len(alphas))
