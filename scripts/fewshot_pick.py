"""Dev experiment (session 32, not adopted): pick the few models to measure by coverage instead
of at random, and adapt from them.

Picks n models of the few-shot pool greedily (facility location): every pool kernel weighs its
share of its model's predicted time (the source's prediction), and each pick is the model whose
kernels most reduce the weighted distance from every pool kernel to the nearest picked kernel of
its type (standardised log features of the source's regressor group). Then every method of
`latpred evaluate --protocol fewshot` is trained on the picked models and scored on the same
test set, for comparison with the random draws of the shipped report.

    .venv/bin/python scripts/fewshot_pick.py SOURCE POOL_DATA TARGET [TEST_DATA | -]

Result (docs/fewshot.md, "Picking the few models"): better than the random draws' mean on three
of the five cells where the pick is not the whole pool, worse on two; not adopted.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def pick(source, pool, n: int) -> list[str]:
    """The ids of n pool models (an EvalSet), in the order the greedy picks them."""
    from latpred.predictors.batch import predict_batch

    batch, _ = source.feature_batch(pool.graphs, pool.kernels, allow_fallback=True)
    pred = predict_batch(batch, source.regressors())
    offsets = np.cumsum([0] + [len(k) for k in pool.kernels])
    model_of = np.repeat(np.arange(len(pool.graphs)), np.diff(offsets))
    share = pred / np.bincount(model_of, pred)[model_of]
    groups = []
    for g, members in batch.members.items():
        x = np.log1p(np.abs(batch.rows[g]))
        sd = x.std(0)
        sd[sd == 0] = 1
        z = (x - x.mean(0)) / sd
        row_of = {c: i for i, c in enumerate(members)}
        idx = np.flatnonzero(np.isin(batch.config, members))
        f = z[[row_of[c] for c in batch.config[idx]]]
        d = np.sqrt(((f[:, None, :] - f[None, :, :]) ** 2).sum(-1))
        uncovered = np.full(len(idx), 3.0 * np.sqrt(f.shape[1]))
        groups.append([idx, d, model_of[idx], uncovered])
    chosen: list[int] = []
    for _ in range(n):
        gains = np.full(len(pool.graphs), -1.0)
        for m in range(len(pool.graphs)):
            if m in chosen:
                continue
            gain = 0.0
            for idx, d, mo, best in groups:
                cols = np.flatnonzero(mo == m)
                if len(cols):
                    gain += (share[idx] * (best - np.minimum(best, d[:, cols].min(1)))).sum()
            gains[m] = gain
        m = int(np.argmax(gains))
        chosen.append(m)
        for grp in groups:
            cols = np.flatnonzero(grp[2] == m)
            if len(cols):
                grp[3] = np.minimum(grp[3], grp[1][:, cols].min(1))
    return [pool.model_ids[i] for i in chosen]


def main() -> None:
    from latpred.evaluate.fewshot import _methods, pool_and_test_sets
    from latpred.evaluate.methods import score_latpred
    from latpred.predictors import LatencyModel
    from latpred.predictors.training import load_tables

    src, data, target = sys.argv[1:4]
    test_data = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    sizes = (10, 30)
    source = LatencyModel.load(src)
    everything, pool, test = pool_and_test_sets(data, target, sizes, 0, test_data)
    kernels, models = load_tables(data, target, pool)
    as_is = score_latpred(source, test, "source as is", "baseline")
    start = time.time()
    order = pick(source, everything.subset(pool), max(sizes))
    print(f"picked in {time.time() - start:.1f} s")
    for n in sizes:
        ids = sorted(order[:n])
        results = _methods(source, kernels, models, ids, test, target, ("gbdt", "lasso"), 0,
                           as_is, everything)
        print(n, {r.name: round(100 * r.metrics["mape"], 2) for r in results})


if __name__ == "__main__":
    main()
