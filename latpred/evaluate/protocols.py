"""The evaluation protocols of the operation-wise paper, and scoring a saved predictor.

(a) `split`: a seeded hold-out of the synthetic dataset, 900 train / 100 test when it has 1,000
    models (in general 10% held out, at most 900 trained on), as Fig. 13;
(b) `sizes`: the same test models, training on the first 30 / 100 / 300 / 900 of the training
    models (a random order, so each prefix is a random sample), as Fig. 21;
(c) `transfer`: train on every model of one dataset, test on every model of another (synthetic
    to real-world), as Fig. 18.
Every protocol reports the baselines (FLOPs-linear, nn-Meter RF) trained on the same models,
and on GPU targets the section 5.4 ablations; with `analytical`, each family is also trained
with the analytical features (method "latpred <family> + analytical").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

from latpred.errors import LatpredError
from latpred.evaluate.data import EvalSet, load_eval_set, split_ids
from latpred.evaluate.methods import (MethodResult, fit_latpred, method_name, run_ablations,
                                      run_baselines, score_latpred)

FAMILIES = ("lasso", "rf", "gbdt", "mlp")
SIZES = (30, 100, 300, 900)


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Everything a report shows."""

    protocol: str
    target: str
    train_dataset: str
    test: EvalSet
    n_train: int
    methods: tuple[MethodResult, ...]
    sizes: pd.DataFrame | None = None  # protocol (b): method, n_train, mape, acc10, ...
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def noise(self) -> dict[str, Any]:
        return self.test.noise


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress:
        progress(text)


def _latpred_methods(dataset, train_ids, test: EvalSet, families, searches, seed,
                     progress, analytical: bool = False) -> list[MethodResult]:
    out = []
    for search in searches:
        for family in families:
            for extra in (False, True) if analytical else (False,):
                name = method_name(family, search, extra)
                _say(progress, f"training {name} on {len(train_ids)} models")
                model, secs = fit_latpred(dataset, train_ids, test.target, family, search,
                                          seed, extra)
                out.append(score_latpred(model, test, name, fit_seconds=secs))
    return out


def _others(train: EvalSet, test: EvalSet, family: str, search: str, seed: int,
            baselines: bool, ablations: bool, progress) -> list[MethodResult]:
    out = []
    if baselines:
        _say(progress, "training baselines (FLOPs-linear, nn-Meter RF)")
        out += run_baselines(train, test)
    if ablations and test.target.split("/")[1:2] == ["gpu"]:
        _say(progress, f"training GPU ablations of latpred {family}")
        out += run_ablations(train, test, family, search, seed)
    return out


def protocol_split(dataset, target: str, families: Sequence[str] = FAMILIES,
                   searches: Sequence[str] = ("latpred",), n_test: int | None = None,
                   seed: int = 0, baselines: bool = True, ablations: bool = True,
                   progress: Callable[[str], None] | None = None,
                   analytical: bool = False) -> Evaluation:
    """Protocol (a): hold out `n_test` models (default 10%), train on the rest (at most 900)."""
    _say(progress, "loading models, rebuilding graphs and deducing kernels")
    everything = load_eval_set(dataset, target)
    n_test = n_test or max(1, round(len(everything) / 10))
    train_ids, test_ids = split_ids(everything.model_ids, n_test, seed)
    train_ids = train_ids[:900]
    train, test = everything.subset(train_ids), everything.subset(test_ids)
    methods = _latpred_methods(dataset, train_ids, test, families, searches, seed, progress,
                               analytical)
    methods += _others(train, test, families[0], searches[0], seed, baselines, ablations,
                       progress)
    return Evaluation("split", target, everything.dataset, test, len(train_ids),
                      tuple(methods), notes=everything.notes)


def protocol_sizes(dataset, target: str, families: Sequence[str] = FAMILIES,
                   search: str = "latpred", sizes: Sequence[int] = SIZES,
                   n_test: int | None = None, seed: int = 0, baselines: bool = True,
                   progress: Callable[[str], None] | None = None,
                   analytical: bool = False) -> Evaluation:
    """Protocol (b): one test set, training sets of growing size drawn from the rest."""
    everything = load_eval_set(dataset, target)
    n_test = n_test or max(1, round(len(everything) / 10))
    train_all, test_ids = split_ids(everything.model_ids, n_test, seed)
    test = everything.subset(test_ids)
    usable = [n for n in sizes if n <= len(train_all)]
    if not usable:
        raise LatpredError(f"The dataset has {len(train_all)} training models, fewer than the "
                           f"smallest training size {min(sizes)}.")
    rows, last = [], []
    for n in usable:
        train_ids = train_all[:n]
        methods = _latpred_methods(dataset, train_ids, test, families, [search], seed,
                                   progress, analytical)
        if baselines:
            methods += run_baselines(everything.subset(train_ids), test)
        rows += [{"method": m.name, "n_train": n, **m.metrics} for m in methods]
        last = methods
    return Evaluation("sizes", target, everything.dataset, test, usable[-1], tuple(last),
                      sizes=pd.DataFrame(rows), notes=everything.notes)


def protocol_transfer(train_dataset, test_dataset, target: str,
                      families: Sequence[str] = FAMILIES, searches: Sequence[str] = ("latpred",),
                      seed: int = 0, baselines: bool = True, ablations: bool = True,
                      progress: Callable[[str], None] | None = None,
                      analytical: bool = False) -> Evaluation:
    """Protocol (c): train on all of one dataset, test on all of another."""
    train = load_eval_set(train_dataset, target)
    test = load_eval_set(test_dataset, target)
    methods = _latpred_methods(train_dataset, list(train.model_ids), test, families, searches,
                               seed, progress, analytical)
    methods += _others(train, test, families[0], searches[0], seed, baselines, ablations,
                       progress)
    return Evaluation("transfer", target, train.dataset, test, len(train), tuple(methods),
                      notes=train.notes + test.notes)


def evaluate_predictor(model, dataset, include_training: bool = False,
                       model_ids: Iterable[str] | None = None) -> Evaluation:
    """Score a trained LatencyModel on `dataset` (its training models left out by default)."""
    test = load_eval_set(dataset, model.target, model_ids)
    notes = list(test.notes)
    trained = set(model.training.get("train_models", ()))
    same = Path(str(model.training.get("dataset", ""))).resolve() == Path(test.dataset).resolve()
    if trained and not include_training and same:
        keep = [m for m in test.model_ids if m not in trained]
        notes.append(f"{len(test) - len(keep)} models the predictor was trained on were left "
                     "out.")
        if not keep:
            raise LatpredError("Every model of the dataset was used to train the predictor; "
                               "pass include_training (--include-training) to score them.")
        test = test.subset(keep)
    name = f"latpred {model.family}"
    return Evaluation("predictor", model.target, str(model.training.get("dataset", "")), test,
                      int(model.training.get("n_models", 0)),
                      (score_latpred(model, test, name),), notes=tuple(notes))
