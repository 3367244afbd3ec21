"""Crash-safe file operations of a dataset directory: a file appears whole or not at all.

A write goes to a hidden temporary next to its final name, is flushed, then renamed into place
(and the directory flushed, which makes the rename durable); a table directory is replaced by
renaming the complete new one over it, with `recover` finishing or rolling back a swap a kill
interrupted. Used by `latpred.dataset`; one writer at a time owns a dataset.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

def tmp_name(final: Path) -> Path:
    # Hidden ("." prefix) so neither latpred nor pyarrow's dataset reader picks it up.
    return final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")


def fsync(path: Path) -> None:
    """Flush a file's or a directory's entries to disk (a rename is durable once its dir is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(final: Path, write: Callable[[Path], Any]) -> None:
    """`write` a hidden temporary next to `final`, flush it, then rename it into place."""
    tmp = tmp_name(final)
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(final.parent)


def remove_temporaries(directory: Path) -> None:
    """Drop parts a killed append left half-written (one writer at a time owns the dataset)."""
    for p in directory.iterdir():
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            p.unlink(missing_ok=True)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def swap_in(path: Path, new: Path) -> None:
    """Replace `path` (file or directory) by the complete `new`; `recover` finishes a kill."""
    old = path.with_name(path.name + ".old")
    remove(old)
    if path.exists():
        os.rename(path, old)
    os.rename(new, path)  # between the two renames `path` is absent and `new` is complete
    fsync(path.parent)
    remove(old)


def recover(path: Path) -> None:
    """Finish or roll back a `swap_in` that a kill interrupted."""
    new = path.with_name(path.name + ".new")
    old = path.with_name(path.name + ".old")
    if not path.exists() and new.exists():
        os.rename(new, path)
    for leftover in (new, old):
        if leftover.exists():
            remove(leftover)


def file_to_parts(path: Path) -> None:
    """Turn a compacted single-file table back into a directory holding it as its first part."""
    new = path.with_name(path.name + ".new")
    remove(new)
    new.mkdir()
    shutil.copyfile(path, new / "part-000000.parquet")
    fsync(new / "part-000000.parquet")
    swap_in(path, new)
