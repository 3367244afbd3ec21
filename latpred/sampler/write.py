"""Writing samples to disk: each as `<model_id>.tflite` beside its architecture
`<model_id>.json` (what `latpred sample` writes and `latpred profile` reads)."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from latpred.sampler.build import build_graph, model_id
from latpred.sampler.draw import sample
from latpred.sampler.space import SearchSpace


def write_samples(space: SearchSpace, n: int, seed: int, out: str | os.PathLike,
                  precision: str = "fp32", progress: Callable[[], Any] | None = None) -> list[str]:
    """Write `<model_id>.tflite` and `<model_id>.json` for `n` samples; returns the .tflite paths.

    Same (space, seed, precision): byte-identical files, weights included (seeded per model).
    """
    import json
    from pathlib import Path

    from latpred.tflite import write_tflite

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for arch in sample(space, n, seed):
        mid = model_id(space.name, seed, arch["index"])
        weights_seed = int(np.random.SeedSequence([seed, arch["index"]]).generate_state(1)[0])
        graph = build_graph(arch)
        # The JSON first, atomically: a .tflite on disk always has its architecture beside it.
        tmp = folder / f".{mid}.json.tmp"
        tmp.write_text(json.dumps(arch, indent=1) + "\n")
        os.replace(tmp, folder / f"{mid}.json")
        write_tflite(graph, folder / f"{mid}.tflite", precision, seed=weights_seed)
        paths.append(str(folder / f"{mid}.tflite"))
        if progress is not None:
            progress()
    return paths
