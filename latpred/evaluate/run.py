"""`latpred evaluate`: check the option combination, run the protocol, show progress."""

from __future__ import annotations

from typing import Sequence

from latpred.errors import LatpredError
from latpred.evaluate.protocols import (FAMILIES, Evaluation, evaluate_predictor,
                                        protocol_sizes, protocol_split, protocol_transfer)


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 2:
        raise LatpredError(f"--sizes must be a comma-separated list of training sizes >= 2, "
                           f"not {text!r}.")
    return tuple(sorted(set(sizes)))


def run_cli(data: str, predictor: str | None, protocol: str | None, target: str | None,
            train_data: str | None, families: Sequence[str], searches: Sequence[str],
            sizes: str, baselines: bool, ablations: bool, include_training: bool,
            seed: int, analytical: bool = False, draws: int = 10) -> Evaluation:
    """The Evaluation `latpred evaluate` asked for."""
    if protocol == "fewshot":
        return _fewshot(data, predictor, target, train_data, families, sizes, seed, draws)
    if (predictor is None) == (protocol is None):
        raise LatpredError("Give either --predictor DIR (score a trained predictor) or "
                           "--protocol a|b|c (train and compare), not both or neither.")
    if analytical and predictor is not None:
        raise LatpredError("--analytical-features trains extra methods for a --protocol; a "
                           "trained --predictor already says whether it uses them.")
    if predictor is not None:
        from latpred.predictors import LatencyModel

        return evaluate_predictor(LatencyModel.load(predictor, target), data, include_training)
    if target is None:
        raise LatpredError("--protocol needs --target, e.g. --target host/cpu/fp32/t1.")
    if (protocol == "c") != (train_data is not None):
        raise LatpredError("--train-data is the training set of --protocol c, and only of it.")
    families = tuple(families) or FAMILIES
    searches = tuple(searches) or ("latpred",)
    say = _progress()
    if protocol == "a":
        return protocol_split(data, target, families, searches, seed=seed, baselines=baselines,
                              ablations=ablations, progress=say, analytical=analytical)
    if protocol == "b":
        return protocol_sizes(data, target, families, searches[0],
                              parse_sizes(sizes or "30,100,300,900"), seed=seed,
                              baselines=baselines, progress=say, analytical=analytical)
    return protocol_transfer(train_data, data, target, families, searches, seed=seed,
                             baselines=baselines, ablations=ablations, progress=say,
                             analytical=analytical)


def _fewshot(data: str, predictor: str | None, target: str | None, train_data: str | None,
             families: Sequence[str], sizes: str | None, seed: int, draws: int) -> Evaluation:
    """Few-shot: --predictor is the source, --data the new device's models (split into a pool
    and a test set, or only the test set when --train-data is the pool)."""
    from latpred.evaluate.fewshot import SHOTS, protocol_fewshot
    from latpred.predictors import LatencyModel

    if predictor is None or target is None:
        raise LatpredError("--protocol fewshot needs --predictor SOURCE (trained on another "
                           "device) and --target, the new device's target.")
    shots = parse_sizes(sizes) if sizes else SHOTS
    source = LatencyModel.load(predictor)
    pool, test = (train_data, data) if train_data is not None else (data, None)
    return protocol_fewshot(source, pool, target, shots, draws, test_dataset=test,
                            families=tuple(families) or ("gbdt", "lasso"), seed=seed,
                            progress=_progress())


def _progress():
    import time

    from rich.console import Console

    console, start = Console(stderr=True), time.perf_counter()

    def say(text: str) -> None:
        console.print(f"[{time.perf_counter() - start:6.0f}s] {text}")

    return say
