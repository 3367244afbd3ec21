"""APGPM: counter-based GPU power models with automatically chosen counters.

The method of Dash, Hu and Jindal (papers/apgpm-pmc-power-model-mobile-gpu.md, section 4.5),
on any table of per-workload counter event rates and measured power:

1. Candidates. Counters that never vary are dropped. Optionally (section 4.3) each counter
   whose Pearson correlation with power is negative and significant (p < 0.05) gets an
   *inverted* copy 1 / (x + eps) and (section 4.4, 5.3) the `combine_top` counters most
   correlated with power give *pairwise combined* counters: every product and ratio
   (named `a × b`, `a ÷ b`).
2. Interdependence and clustering (4.5.1). Each candidate's rates are normalized
   ((x - mean) / std); the interdependence of two counters is the Euclidean distance between
   their normalized rate vectors (sqrt(2 n (1 - r)), r their Pearson correlation), and the
   counters are clustered by scipy's agglomerative clustering with Ward linkage, cut at
   `distance_factor` x the number of samples (0.05 in the paper).
3. Representatives (4.5.2). In each cluster, a one-counter linear regression of power on each
   member; the best R^2 is the cluster importance and its counter the representative.
4. Significant clusters (4.5.2). Clusters in descending importance; the first joins the set;
   for each next cluster, each member is tried beside the set's representatives (multi-variable
   linear regression) and the best one kept; the cluster joins when the set's score improves
   (by more than `add_gain`: 0 is the paper's rule, which lets noise counters in by gains of
   1e-5; the default 0.001 keeps them out).
   The search stops when the score has not grown by `min_gain` in `patience` clusters in a row.
   The score is the adjusted R^2 of the training fit (`criterion="adjusted"`) or the R^2 of
   `folds`-fold cross-validated predictions (`"heldout"`); the paper's plain R^2 always grows.
5. The power model: linear least squares on the chosen representatives. With `clip`, a
   representative outside its training range is clipped to it before the linear model (a
   linear law is not extrapolated past the workloads it was fitted on).

Every fit, in steps 3-5 alike, is `fitting.LinearFit(weighting, nonneg)` and every R^2 is
weighted as that fit is: `weighting="relative"` (the default) is least squares on the relative
error, 1 / power^2 weights, since the model is judged by MAPE; `"none"` is the paper's
ordinary least squares. `nonneg` keeps every counter's coefficient >= 0.

`APGPMSelect` chooses among APGPM settings (selection criterion, clipping, ...) by k-fold
cross-validated MAPE on the training workloads only, then refits the chosen one on all of them.

The paper's baselines (section 5.5) are in `latpred.power.baselines`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from latpred.power.fitting import LinearFit, Scorer, mape, one_counter_r2


# Combined counters are named `a × b` and `a ÷ b` (counter names hold '*' and '/' themselves).
MUL, DIV = " × ", " ÷ "


def usable(X: pd.DataFrame) -> pd.DataFrame:
    """The columns of `X` that are finite everywhere and vary (float64)."""
    X = X.apply(pd.to_numeric, errors="coerce").astype(float)
    X = X.loc[:, np.isfinite(X.to_numpy()).all(axis=0)]
    return X.loc[:, X.std(ddof=0).to_numpy() > 1e-12 * (1 + X.abs().max().to_numpy())]


def correlations(X: pd.DataFrame, y) -> pd.DataFrame:
    """Pearson r and its two-sided p-value of each column with `y` (scipy.stats.pearsonr)."""
    from scipy.stats import pearsonr

    y = np.asarray(y, float)
    rows = {c: pearsonr(X[c].to_numpy(), y) for c in X.columns}
    return pd.DataFrame({"r": {c: v.statistic for c, v in rows.items()},
                         "p": {c: v.pvalue for c, v in rows.items()}})


def interdependence(X: pd.DataFrame) -> pd.DataFrame:
    """The paper's counter-counter distance: Euclidean distance of the normalized rates."""
    Z = _normalize(X.to_numpy())
    sq = (Z * Z).sum(axis=0)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * Z.T @ Z, 0.0)
    return pd.DataFrame(np.sqrt(d2), index=X.columns, columns=X.columns)


def _normalize(A: np.ndarray) -> np.ndarray:
    sd = A.std(axis=0)
    return (A - A.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def candidates(X: pd.DataFrame, y, inverted: bool = False, combine_top: int = 0,
               eps: float = 1e-9) -> pd.DataFrame:
    """Usable counters, plus inverted and pairwise-combined ones when asked (module doc, 1)."""
    X = usable(X)
    extra = {}
    if inverted or combine_top:
        corr = correlations(X, y)
    if inverted:
        neg = corr.index[(corr["r"] < 0) & (corr["p"] < 0.05)]
        for c in neg:
            extra[f"inv({c})"] = 1.0 / (X[c].to_numpy() + eps * (1 + X[c].abs().max()))
    if combine_top:
        top = corr["r"].abs().sort_values(ascending=False).index[:combine_top]
        for i, a in enumerate(top):
            for b in top[i + 1:]:
                xa, xb = X[a].to_numpy(), X[b].to_numpy()
                extra[f"{a}{MUL}{b}"] = xa * xb
                extra[f"{a}{DIV}{b}"] = xa / (xb + eps * (1 + np.abs(xb).max()))
                extra[f"{b}{DIV}{a}"] = xb / (xa + eps * (1 + np.abs(xa).max()))
    if extra:
        X = usable(pd.concat([X, pd.DataFrame(extra, index=X.index)], axis=1))
    return X


def cluster(X: pd.DataFrame, distance_factor: float = 0.05) -> np.ndarray:
    """Cluster labels (1..k) of X's columns: Ward linkage on the normalized rates, cut at
    `distance_factor` x number of samples (scipy.cluster.hierarchy)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    if X.shape[1] == 1:
        return np.ones(1, dtype=int)
    Z = _normalize(X.to_numpy()).T
    link = linkage(Z, method="ward")
    return fcluster(link, t=distance_factor * X.shape[0], criterion="distance")


class APGPM:
    """The APGPM power model (see the module docstring); scikit-learn's fit/predict contract
    on a DataFrame of counter event rates."""

    def __init__(self, distance_factor: float = 0.05, criterion: str = "adjusted",
                 min_gain: float = 0.01, patience: int = 5, add_gain: float = 0.001,
                 inverted: bool = False,
                 combine_top: int = 0, folds: int = 5, seed: int = 0, clip: bool = False,
                 weighting: str = "relative", nonneg: bool = False):
        self.distance_factor = distance_factor
        self.weighting = weighting
        self.nonneg = nonneg
        self.clip = clip
        self.criterion = criterion
        self.min_gain = min_gain
        self.patience = patience
        self.add_gain = add_gain
        self.inverted = inverted
        self.combine_top = combine_top
        self.folds = folds
        self.seed = seed

    def fit(self, X: pd.DataFrame, y) -> "APGPM":
        y = np.asarray(y, float)
        fit = LinearFit(self.weighting, self.nonneg)
        C = candidates(X, y, self.inverted, self.combine_top)
        if C.shape[1] == 0:
            raise ValueError("No counter varies across the samples.")
        self.n_counters_ = usable(X).shape[1]
        self.n_candidates_ = C.shape[1]
        labels = cluster(C, self.distance_factor)
        A = C.to_numpy()
        one = dict(zip(C.columns, one_counter_r2(A, y, fit)))
        clusters: dict[int, list[str]] = {}
        for c, lab in zip(C.columns, labels):
            clusters.setdefault(int(lab), []).append(c)
        table = []
        for lab, members in clusters.items():
            rep = max(members, key=lambda c: one[c])
            table.append({"cluster": lab, "size": len(members), "importance": one[rep],
                          "representative": rep, "members": members})
        table.sort(key=lambda t: -t["importance"])
        score = Scorer(y, self.criterion, self.folds, self.seed, fit)
        col = {c: j for j, c in enumerate(C.columns)}
        chosen = [table[0]["representative"]]
        best = score(A[:, [col[chosen[0]]]])
        path = [{"cluster": table[0]["cluster"], "counter": chosen[0], "score": best,
                 "added": True}]
        stale = 0
        for t in table[1:]:
            base = [col[c] for c in chosen]
            trial = {c: score(A[:, base + [col[c]]]) for c in t["members"]}
            c_best = max(trial, key=trial.get)
            gain = trial[c_best] - best
            added = bool(gain > self.add_gain)
            path.append({"cluster": t["cluster"], "counter": c_best, "score": trial[c_best],
                         "added": added})
            if added:
                chosen.append(c_best)
                best = trial[c_best]
            stale = 0 if gain >= self.min_gain else stale + 1
            if stale >= self.patience:
                break
        self.clusters_ = table
        self.path_ = path
        self.counters_ = chosen
        self.score_ = best
        self.linear_ = LinearFit(self.weighting, self.nonneg).fit(C[chosen].to_numpy(), y)
        self.lo_ = C[chosen].to_numpy().min(axis=0)
        self.hi_ = C[chosen].to_numpy().max(axis=0)
        self._columns = list(C.columns)
        self._base = [c for c in _base_counters(chosen)]
        return self

    def transform(self, X: pd.DataFrame) -> np.ndarray:
        """The chosen representatives of X (computing inverted / combined ones)."""
        return np.column_stack([_counter_values(X, c) for c in self.counters_])

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        A = self.transform(X)
        if self.clip:
            A = np.clip(A, self.lo_, self.hi_)
        return self.linear_.predict(A)

    @property
    def counters_used_(self) -> list[str]:
        """The raw counters the model reads (a combined one reads two)."""
        return self._base

    def summary(self) -> dict:
        return {"n_counters": self.n_counters_, "n_candidates": self.n_candidates_,
                "n_clusters": len(self.clusters_), "n_significant": len(self.counters_),
                "representatives": self.counters_, "counters_used": self.counters_used_,
                "score": self.score_, "criterion": self.criterion, "clip": self.clip,
                "weighting": self.weighting, "nonneg": self.nonneg,
                "coef": dict(zip(self.counters_, self.linear_.coef_.tolist())),
                "intercept": float(self.linear_.intercept_)}


# The settings `APGPMSelect` chooses among by default: the two selection criteria of the
# module docstring, each with and without clipping.
SELECT_DEFAULT = {"adjusted": {"criterion": "adjusted"},
                  "heldout": {"criterion": "heldout"},
                  "adjusted, clipped": {"criterion": "adjusted", "clip": True},
                  "heldout, clipped": {"criterion": "heldout", "clip": True}}


class APGPMSelect:
    """APGPM with its settings chosen by `folds`-fold cross-validated MAPE on the training
    workloads (random folds from `seed`); the chosen setting is refitted on all of them.
    `candidates` maps a name to APGPM keyword arguments (`SELECT_DEFAULT`)."""

    def __init__(self, candidates: dict | None = None, folds: int = 5, seed: int = 0):
        self.candidates = dict(SELECT_DEFAULT if candidates is None else candidates)
        self.folds = folds
        self.seed = seed

    def fit(self, X: pd.DataFrame, y) -> "APGPMSelect":
        y = np.asarray(y, float)
        n = len(y)
        order = np.random.default_rng(self.seed).permutation(n)
        parts = [order[k::self.folds] for k in range(self.folds)]
        self.cv_mape_ = {}
        for name, kw in self.candidates.items():
            errs = []
            for test in parts:
                train = np.setdiff1d(np.arange(n), test)
                m = APGPM(**kw).fit(X.iloc[train], y[train])
                errs.append(mape(y[test], m.predict(X.iloc[test])))
            self.cv_mape_[name] = float(np.mean(errs))
        self.chosen_ = min(self.cv_mape_, key=self.cv_mape_.get)
        self.model_ = APGPM(**self.candidates[self.chosen_]).fit(X, y)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.model_.predict(X)

    @property
    def counters_(self) -> list[str]:
        return self.model_.counters_

    @property
    def counters_used_(self) -> list[str]:
        return self.model_.counters_used_

    def summary(self) -> dict:
        return {**self.model_.summary(), "chosen": self.chosen_, "cv_mape": self.cv_mape_}


def _base_counters(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        for part in _parts(n):
            if part not in out:
                out.append(part)
    return out


def _parts(name: str) -> list[str]:
    if name.startswith("inv(") and name.endswith(")"):
        return [name[4:-1]]
    for op in (MUL, DIV):
        if op in name:
            a, b = name.split(op, 1)
            return [a, b]
    return [name]


def _counter_values(X: pd.DataFrame, name: str, eps: float = 1e-9) -> np.ndarray:
    if name in X.columns:
        return X[name].to_numpy(float)
    if name.startswith("inv(") and name.endswith(")"):
        x = X[name[4:-1]].to_numpy(float)
        return 1.0 / (x + eps * (1 + np.abs(x).max()))
    a, b = _parts(name)
    xa, xb = X[a].to_numpy(float), X[b].to_numpy(float)
    if MUL in name:
        return xa * xb
    return xa / (xb + eps * (1 + np.abs(xb).max()))
