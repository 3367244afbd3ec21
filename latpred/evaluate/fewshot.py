"""Few-shot protocol: a source predictor adapted to a new device from n models, against
training from scratch on the same n models (issue 17; HELP's and LitePred's setting).

The new device's dataset is split once into a test set and a pool (or the test set is another
dataset, e.g. the zoo measured on the new device). For each n in `shots`, `draws` random sets
of n pool models are drawn; on each, every method is trained and scored on the same test set:

- `adapt global`, `adapt scale`, `adapt residual`, `adapt stacked`, `adapt auto`
  (predictors/adapt/; each with its overhead chosen by `adapt`'s cross-validation: the
  source's scaled, or re-fitted; `auto` also mixes each kernel type with a scratch Lasso where
  the folds say so, and records the share of types it mixed);
- `scratch <family>`: a LatencyModel trained on the n models alone (its usual search);
- `source as is`: the source predictor unchanged (its kernel types that the new device lacks
  go to the flagged fallback), and `source x global factor`: its end-to-end predictions times
  the one factor that fits the n models best, the simplest adaptation there is.

The sizes table holds each method's mean figures over the draws (and the MAPE's standard
deviation); the methods shown in detail are those of the last draw at the largest n.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from latpred.errors import LatpredError
from latpred.evaluate.data import EvalSet, load_eval_set, split_ids
from latpred.evaluate.methods import MethodResult, score_latpred
from latpred.evaluate.metrics import e2e_metrics
from latpred.predictors import cluster

SHOTS = (10, 20, 30)
DRAWS = 10


def pool_and_test(model_ids: Sequence[str], shots: Sequence[int] = SHOTS, seed: int = 0,
                  n_test: int | None = None) -> tuple[list[str], list[str]]:
    """The pool the few models are drawn from and the test models, where one dataset holds
    both (`model_ids`: its `load_eval_set` models): all but the largest number of shots are
    held out for testing, unless `n_test` says otherwise."""
    return split_ids(model_ids, n_test or max(1, len(model_ids) - max(shots)), seed)


def pool_and_test_sets(dataset, target: str, shots: Sequence[int] = SHOTS, seed: int = 0,
                       test_dataset=None, n_test: int | None = None
                       ) -> tuple[EvalSet, list[str], EvalSet]:
    """The evaluation set of `dataset`, the ids of the pool the few models are drawn from and
    the test set: `test_dataset` whole, else `pool_and_test`'s split of `dataset`."""
    everything = load_eval_set(dataset, target)
    if test_dataset is not None:
        return everything, list(everything.model_ids), load_eval_set(test_dataset, target)
    pool, test_ids = pool_and_test(everything.model_ids, shots, seed, n_test)
    return everything, pool, everything.subset(test_ids)


def draw_ids(pool: Sequence[str], sizes: Sequence[int], draws: int, seed: int = 0
             ) -> Iterator[tuple[int, int, list[str]]]:
    """(n, draw, the drawn model ids) for `draws` random draws of n pool models per size, in
    the evaluator's order (one generator seeded with `seed` for all sizes)."""
    rng = np.random.default_rng(seed)
    for n in sizes:
        for draw in range(draws):
            yield n, draw, sorted(rng.choice(pool, size=n, replace=False))


def protocol_fewshot(source, dataset, target: str, shots: Sequence[int] = SHOTS,
                     draws: int = DRAWS, test_dataset=None, n_test: int | None = None,
                     families: Sequence[str] = ("gbdt", "lasso"), seed: int = 0,
                     progress: Callable[[str], None] | None = None):
    """Evaluation of adapting `source` (a LatencyModel) to `target` measured in `dataset`."""
    from latpred.evaluate.protocols import Evaluation
    from latpred.predictors.training import load_tables

    everything, pool, test = pool_and_test_sets(dataset, target, shots, seed, test_dataset,
                                                n_test)
    usable = [n for n in sorted(set(shots)) if n <= len(pool)]
    if not usable:
        raise LatpredError(f"The pool has {len(pool)} models, fewer than the smallest number of "
                           f"shots {min(shots)}.")
    kernels, models = load_tables(dataset, target, pool)
    as_is = score_latpred(source, test, "source as is", "baseline")
    drawn = list(draw_ids(pool, usable, draws, seed))
    # the same models give the same results (at n = the pool's size every draw is the whole
    # pool): each set of models is one job (`cluster.run_all`: a Ray task inside `on_ray`),
    # named in the progress by the first draw that holds it
    first: dict[tuple, tuple[int, int]] = {}
    for n, draw, ids in drawn:
        first.setdefault(tuple(ids), (n, draw))
    keys = list(first)

    def finished(i: int) -> None:
        if progress:
            n, draw = first[keys[i]]
            progress(f"{n} models, draw {draw + 1}/{draws} done")

    jobs = [(source, kernels, models, list(key), test, target, families, seed, as_is, everything)
            for key in keys]
    results = dict(zip(keys, cluster.run_all(_methods, jobs, finished)))
    rows, last = [], []
    for n, draw, ids in drawn:
        last = results[tuple(ids)]
        rows += [{"method": m.name, "n_train": n, "draw": draw, **m.metrics} for m in last]
    per_draw = pd.DataFrame(rows)
    notes = everything.notes + (test.notes if test_dataset is not None else ()) + (
        f"each figure is the mean over {draws} random draws of the n models from a pool of "
        f"{len(pool)}; the methods below are those of the last draw with n = {usable[-1]}",
        f"source predictor: {source.family} trained for {source.target} on "
        f"{source.training.get('n_models', '?')} models")
    return Evaluation("fewshot", target, everything.dataset, test, usable[-1], tuple(last),
                      sizes=summarize(per_draw), notes=notes)


def summarize(per_draw: pd.DataFrame) -> pd.DataFrame:
    """Mean figures per (method, n_train) over the draws, with the MAPE's standard deviation."""
    from latpred.predictors.adapt import SIMPLEST_FIRST

    chose = [f"chose_{m}" for m in SIMPLEST_FIRST] + ["chose_scaled_overhead", "blended_types"]
    cols = [c for c in ("mape", "acc10", "mpe", "kendall_tau", *chose) if c in per_draw]
    g = per_draw.groupby(["method", "n_train"], sort=False)
    out = g[cols].mean().reset_index()
    out["mape_std"] = g["mape"].std(ddof=0).to_numpy()
    out["draws"] = g.size().to_numpy()
    return out


def _methods(source, kernels, models, ids, test: EvalSet, target, families, seed,
             as_is: MethodResult, everything: EvalSet) -> list[MethodResult]:
    from latpred.predictors import LatencyModel
    from latpred.predictors.adapt import SIMPLEST_FIRST, adapt

    k = kernels[kernels["model_id"].isin(ids)]
    m = models[models["model_id"].isin(ids)]
    out = []
    for method in (*SIMPLEST_FIRST, "auto"):
        model = adapt(source, k, m, target, method, seed)
        result = score_latpred(model, test, f"adapt {method}")
        if method == "auto":
            for m_ in SIMPLEST_FIRST:  # how often auto picks each
                result.metrics[f"chose_{m_}"] = float(model.training["method"] == m_)
            result.metrics["chose_scaled_overhead"] = float(model.training["overhead"] == "scaled")
            weights = model.training["blend_weights"]   # share of types mixed with scratch
            result.metrics["blended_types"] = float(np.mean([w < 1 for w in weights.values()])) \
                if weights else 0.0
        out.append(result)
    for family in families:
        model = LatencyModel.fit_tables(k, m, target, family, seed=seed)
        out.append(score_latpred(model, test, f"scratch {family}"))
    out.append(as_is)
    out.append(_global_factor(as_is, source, everything.subset(ids), test))
    return out


def _global_factor(as_is: MethodResult, source, train: EvalSet, test: EvalSet) -> MethodResult:
    """The source's end-to-end predictions times the percentage-optimal factor on `train`."""
    p = np.array([x.total_ms for x in source.predict_kernels(train.graphs, train.kernels,
                                                             allow_fallback=True)])
    r = p / train.measured_ms
    factor = float(np.sum(r) / np.sum(r * r))
    pred = as_is.predicted_ms * factor
    return MethodResult("source x global factor", "baseline", pred,
                        e2e_metrics(test.measured_ms, pred),
                        notes=(f"factor {factor:.3f}",))
