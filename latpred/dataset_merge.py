"""Merge measured datasets into one, e.g. to train on several NAS spaces at once.

Rows are copied as they are (model ids must not collide: two spaces' ids never do, the same
models measured twice would); each target's manifest entry is the first source's, with the
sources' names and their own noise figures kept under `merged_from`, so no label noise is lost.
"""

from __future__ import annotations

import os
from typing import Sequence

import pandas as pd

from latpred.dataset import Dataset
from latpred.errors import DatasetError


def merge_datasets(sources: Sequence[str | os.PathLike], out: str | os.PathLike,
                   name: str | None = None) -> Dataset:
    """A new dataset at `out` holding every row of `sources`."""
    if len(sources) < 2:
        raise DatasetError("Merging needs at least two datasets.")
    opened = [Dataset.open(s) for s in sources]
    models = [ds.models() for ds in opened]
    seen: dict[tuple[str, str], str] = {}
    for ds, m in zip(opened, models):
        for key in zip(m["model_id"], m["target"]):
            if key in seen:
                raise DatasetError(f"Model {key[0]!r} ({key[1]}) is in both {seen[key]} and "
                                   f"{ds.root}; merge datasets of different models.")
            seen[key] = str(ds.root)
    merged = Dataset.create(out, name or "+".join(ds.manifest["name"] for ds in opened))
    merged.append_models(pd.concat(models, ignore_index=True))
    kernels = [ds.kernels() for ds in opened]
    if any(len(k) for k in kernels):
        merged.append_kernels(pd.concat(kernels, ignore_index=True))
    for ds in reversed(opened):   # the first source's entry wins
        for target, entry in ds.manifest["targets"].items():
            merged.update_manifest(target, **{k: v for k, v in entry.items() if k != "noise"})
    for target in merged.targets():
        parts = [{"name": ds.manifest["name"], "noise": ds.manifest["targets"][target].get("noise")}
                 for ds in opened if target in ds.manifest["targets"]]
        first = next((p["noise"] for p in parts if p["noise"]), None)
        merged.update_manifest(target, merged_from=parts, **({"noise": first} if first else {}))
    merged.compact()
    return merged
