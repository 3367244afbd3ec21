"""The models a profile run measures: .tflite files and the architecture JSON beside them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from latpred.errors import LatpredError


def model_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """The .tflite files named, folders expanded to their *.tflite files (sorted)."""
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        paths.extend(sorted(p.glob("*.tflite")) if p.is_dir() else [p])
    if not paths:
        raise LatpredError(f"No .tflite models in {', '.join(map(str, items))}.")
    return paths


@dataclass(frozen=True)
class ModelEntry:
    """A model file to profile, with what its architecture JSON says about it."""

    path: Path
    model_id: str
    space: str = ""
    seed: int = -1
    arch: str = ""


def load_entry(path: str | os.PathLike) -> ModelEntry:
    """The model at `path` and the architecture JSON beside it (`<stem>.json`), if any."""
    path = Path(path)
    if not path.is_file():
        raise LatpredError(f"Model file {path} does not exist.")
    meta = path.with_suffix(".json")
    if not meta.is_file():
        return ModelEntry(path=path, model_id=path.stem)
    try:
        arch = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LatpredError(f"Architecture file {meta} is not valid JSON: {err}.") from None
    info = arch if isinstance(arch, dict) else {}
    seed = info.get("seed", -1)
    return ModelEntry(path=path, model_id=str(info.get("model_id") or path.stem),
                      space=str(info.get("space", "")),
                      seed=int(seed) if isinstance(seed, int) else -1,
                      arch=json.dumps(arch, sort_keys=True, separators=(",", ":")))


def load_entries(paths: Sequence[str | os.PathLike]) -> list[ModelEntry]:
    """`load_entry` of each path; two files with one model id are refused (a dataset holds one
    row per model and target)."""
    entries = [load_entry(p) for p in paths]
    seen: dict[str, Path] = {}
    for e in entries:
        if seen.setdefault(e.model_id, e.path) != e.path:
            raise LatpredError(f"Model id {e.model_id!r} is both {seen[e.model_id]} and {e.path}; "
                               "a dataset holds one row per model and target.")
    return entries
