"""Read a tracer log (mlog.c): the allocations still live at a MARK, named by their callers.

Shared by attribute.py and compare.py. Dev-only.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

LIB = "libpywrap_litert_common.so"      # the ai-edge-litert library that holds TFLite + XNNPACK


@dataclass(frozen=True)
class Live:
    """One allocation live at the mark: bytes, the step that made it, its callers (offsets
    into LIB, immediate caller first; the immediate one only when it is in LIB)."""

    nbytes: int
    stage: str
    callers: tuple[str, ...]


def live_at(log: str | Path, mark: str = "invoke2") -> list[Live]:
    """Allocations made after the file was read and not freed when `mark` was written."""
    live: dict[str, Live] = {}
    stage = "start"
    with open(log) as f:
        for line in f:
            p = line.split()
            if p[0] == "MARK":
                if p[1] == mark:
                    break
                stage = p[1]
                continue
            if p[0] == "f":
                live.pop(p[1], None)
                continue
            kind, ptr, nbytes, old, where = p[0], p[1], int(p[2]), p[3], p[4]
            if kind == "r":
                live.pop(old, None)
            lib, _, off = where.rpartition("+")
            callers = ((off,) if lib == LIB else ()) + tuple(a[1:] for a in p[6:]
                                                             if a.startswith("@"))
            live[ptr] = Live(nbytes, stage, callers)
    return [a for a in live.values() if a.stage not in ("start", "read")]


def library_path() -> str:
    import ai_edge_litert

    return str(Path(ai_edge_litert.__file__).parent / LIB)


def symbols(offsets) -> dict[str, str]:
    """Function names (demangled) of offsets into LIB, by addr2line (the wheel keeps its
    symbols)."""
    offsets = sorted(set(offsets))
    if not offsets:
        return {}
    out = subprocess.run(["addr2line", "-f", "-C", "-e", library_path(),
                          *("0x" + a for a in offsets)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {a: out[2 * i].split("(")[0] for i, a in enumerate(offsets)}
