"""Batch calls pause Python's cyclic garbage collector while they run.

A NAS batch (`predict_many`, `predict_many_with_memory`, `memory_totals`) builds tens of
thousands of short-lived containers (kernels, feature rows, keys, wiring lists) and frees them
by reference counting; none of them forms a cycle. Yet each allocation counts towards the
collector's thresholds, and every generation-2 collection walks every live object, the
caller's graphs included. On 1,000 synthetic_cnn graphs the collector took ~9% of
`predict_many` and ~15% of `predict_many_with_memory` (benchmarks/memory_speed.py, with and
without the pause). Cycles made meanwhile are collected after the call, when the collector
runs again.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector within the block, if it was enabled (nesting is fine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
