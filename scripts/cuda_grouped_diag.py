"""Dev diagnostic: why grouped convolutions are the CUDA protocol-(a) miss (issue 13).

    python scripts/cuda_grouped_diag.py oracle   # (a) e2e with one kernel type's predictions replaced by labels
    python scripts/cuda_grouped_diag.py pattern  # grouped-conv per-kernel CV: with cuDNN's launch pattern known / predicted

`oracle` trains protocol (a)'s GBDT (the 900 / 142 split of `latpred evaluate --protocol a`)
and re-scores the test models with each kernel type's predictions swapped for its labels.
`pattern` runs 5-fold CV grouped by model on the grouped-conv rows of h100-cuda-synthetic
(LightGBM on log latency): the features alone; plus the launch pattern cuDNN actually ran (the
`launches` column, an oracle: unknown before running); plus the class probabilities of a
classifier of the top-8 patterns trained on the training folds (out-of-fold inside them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

T = "h100/cuda/fp16"
DATA = "datasets/h100-cuda-synthetic"


def oracle() -> None:
    from latpred.dataset import Dataset
    from latpred.evaluate.data import load_eval_set, split_ids
    from latpred.evaluate.methods import fit_latpred

    ds = Dataset.open(DATA)
    ev = load_eval_set(ds, T)
    tr, te = split_ids(ev.model_ids, round(len(ev) / 10), 0)
    model, _ = fit_latpred(ds, tr[:900], T, "gbdt", "latpred", 0)
    test = ev.subset(te)
    preds = model.predict_kernels(test.graphs, test.kernels, allow_fallback=True)
    tot, y = np.array([p.total_ms for p in preds]), test.measured_ms
    mape = lambda a: float(np.mean(np.abs(a / y - 1)) * 100)  # noqa: E731
    print(f"e2e MAPE {mape(tot):.2f}%")
    for t in sorted({k.type for ks in test.kernels for k in ks}) + ["every kernel"]:
        alt = [pt + sum(m - q for k, m, q in zip(ks, ms, p.kernel_ms)
                        if (t == "every kernel" or k.type == t) and np.isfinite(m))
               for ks, ms, p, pt in zip(test.kernels, test.kernel_ms, preds, tot)]
        print(f"  {t:16s} labels in place of predictions: e2e {mape(np.array(alt)):.2f}%")


def pattern() -> None:
    import lightgbm as lgb
    from sklearn.model_selection import GroupKFold

    from latpred.dataset import Dataset
    from latpred.predictors.training import with_group_columns

    k = with_group_columns(Dataset.open(DATA).kernels(T))
    g = k[(k.kernel_type == "grouped_conv2d") & (k.status == "ok")].reset_index(drop=True)
    feats = [c for c in g.columns if c.startswith("f_") and g[c].nunique() > 1]
    pat = g.launches.str.replace(r"\+elementwise\+activation$", "", regex=True)
    g["pattern"] = pat.astype("category").cat.codes
    top = g.pattern.value_counts().index[:8]
    g["pattern_top"] = np.where(g.pattern.isin(top), g.pattern, -1)
    y = np.log(g.latency_ms.to_numpy())
    reg = dict(n_estimators=600, learning_rate=0.03, num_leaves=15, min_child_samples=5,
               subsample=0.8, subsample_freq=1, colsample_bytree=0.8, verbose=-1)
    cls = dict(n_estimators=300, learning_rate=0.05, num_leaves=15, min_child_samples=5,
               verbose=-1)
    folds = list(GroupKFold(5).split(g, groups=g.model_id))
    score = lambda p: float(np.mean(np.abs(np.exp(p - y) - 1)) * 100)  # noqa: E731

    def cv(cols):
        p = np.zeros(len(g))
        for tr, te in folds:
            p[te] = lgb.LGBMRegressor(**reg).fit(g.loc[tr, cols], y[tr]).predict(g.loc[te, cols])
        return score(p)

    def probs(tr, te):
        c = lgb.LGBMClassifier(**cls).fit(g.loc[tr, feats], g.pattern_top[tr])
        out = np.zeros((len(te), len(np.unique(g.pattern_top))))
        out[:, np.searchsorted(np.unique(g.pattern_top), c.classes_)] = \
            c.predict_proba(g.loc[te, feats])
        return out, float((c.predict(g.loc[te, feats]) == g.pattern_top[te]).mean())

    p, acc = np.zeros(len(g)), []
    for tr, te in folds:
        inner = np.zeros((len(tr), len(np.unique(g.pattern_top))))
        for itr, ite in GroupKFold(4).split(tr, groups=g.model_id[tr]):
            inner[ite] = probs(tr[itr], tr[ite])[0]
        outer, a = probs(tr, te)
        acc.append(a)
        model = lgb.LGBMRegressor(**reg).fit(np.column_stack([g.loc[tr, feats], inner]), y[tr])
        p[te] = model.predict(np.column_stack([g.loc[te, feats], outer]))
    # Trained on the pattern cuDNN ran (one-hot of the top-8 classes), given the classifier's
    # probabilities or its most likely class at test time (as scripts/tile_select.py does for
    # cuDNN's dense convolutions).
    classes = np.unique(g.pattern_top)
    truth = (g.pattern_top.to_numpy()[:, None] == classes[None, :]).astype(float)
    p_soft, p_hard = np.zeros(len(g)), np.zeros(len(g))
    for tr, te in folds:
        outer, _ = probs(tr, te)
        model = lgb.LGBMRegressor(**reg).fit(np.column_stack([g.loc[tr, feats], truth[tr]]), y[tr])
        p_soft[te] = model.predict(np.column_stack([g.loc[te, feats], outer]))
        hard = (outer == outer.max(1, keepdims=True)).astype(float)
        p_hard[te] = model.predict(np.column_stack([g.loc[te, feats], hard]))
    print(f"{len(g)} grouped-conv rows, {g.pattern.nunique()} launch patterns")
    print(f"  features alone:                    {cv(feats):.1f}% per kernel")
    print(f"  + the pattern cuDNN ran (oracle):  {cv(feats + ['pattern']):.1f}%")
    print(f"  + a pattern classifier's probabilities: {score(p):.1f}% "
          f"(classifier accuracy {np.mean(acc):.3f})")
    print(f"  trained on the true class, given the probabilities: {score(p_soft):.1f}%")
    print(f"  trained on the true class, given the likeliest class: {score(p_hard):.1f}%")


if __name__ == "__main__":
    {"oracle": oracle, "pattern": pattern}[sys.argv[1]]()
