"""TFLite/LiteRT's offset planner, step for step: `SimpleMemoryArena` and the order
`ArenaPlanner` hands it tensors in.

Every rule below is cited from google-ai-edge/LiteRT at tag v2.2.0 (identical at
f67457790, the newest commit before ai-edge-litert 2.3.0; `git diff v2.2.0 f67457790` is empty
for tflite/arena_planner.cc and tflite/simple_memory_arena.cc):

- tflite/simple_memory_arena.cc `SimpleMemoryArena::Allocate`: walk the live allocations in
  offset order, skipping those whose [first_node, last_node] does not meet the new one's; take
  the gap with the smallest "fit" that holds the aligned size (the fit is measured from the
  *unaligned* end of the previous allocation: `best_offset_fit = alloc.offset -
  current_offset`), stop at a fit of 0; else place it at the aligned end. The high-water mark
  `max(offset + size)` is the buffer `Commit` resizes to, and what `GetAllocInfo` reports.
- tflite/arena_planner.cc `CreateTensorAllocationVector`: tensors alive through the whole run
  (allocated at node 0, never deallocated) first, by index; then by size, largest first; equal
  sizes by allocation node. (`std::sort` over an `unordered_set`'s order is not stable; ties of
  equal size and equal allocation node are broken here by tensor index: an approximation that
  only moves offsets of same-sized tensors born at the same node.)
- `CalculateAllocations`: a first chunk (first_node < last_active_node) clears the live list,
  a later one keeps the allocations still alive at its first node (`PurgeActiveAllocs`).
- tflite/util.h `kDefaultTensorAlignment = 64` (offsets); the buffer is 64-aligned
  (`kDefaultArenaAlignment`, tflite/arena_planner.h).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

TENSOR_ALIGNMENT = 64          # tflite/util.h kDefaultTensorAlignment
NEVER = 2 ** 31 - 1            # arena_planner.cc kNodeNotAssigned (std::numeric_limits<int32>::max)


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


class Alloc(NamedTuple):
    """One tensor placed in an arena: bytes [offset, offset + size), live over nodes [first, last].
    (A NamedTuple: a NAS loop plans thousands of them a second.)"""

    tensor: int
    offset: int
    size: int
    first: int
    last: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class SimpleArena:
    """`SimpleMemoryArena`'s planning half (no buffer): live allocations sorted by offset."""

    def __init__(self, alignment: int = TENSOR_ALIGNMENT) -> None:
        self.alignment = alignment
        self.high_water_mark = 0
        self._live: list[Alloc] = []
        self._offsets: list[int] = []

    def reset(self) -> None:
        """`ResetAllocs`."""
        self._live, self._offsets = [], []

    def purge_before(self, node: int) -> None:
        """`PurgeActiveAllocs(node)`: drop allocations that ended before `node`."""
        keep = [a for a in self._live if a.last >= node]
        self._live, self._offsets = keep, [a.offset for a in keep]

    def allocate(self, tensor: int, size: int, first: int, last: int) -> Alloc:
        """`SimpleMemoryArena::Allocate`: best-fit gap among allocations whose lifetimes meet."""
        if size == 0:
            return Alloc(tensor, 0, 0, first, last)
        alignment = self.alignment
        best, best_fit, current = -1, None, 0
        for a in self._live:
            if a.last < first or a.first > last:
                continue
            offset = a.offset
            aligned = -(-current // alignment) * alignment          # align_up, inlined
            if aligned + size <= offset and (best_fit is None or offset - aligned < best_fit):
                best, best_fit = aligned, offset - current
            if offset + a.size > current:                           # max(current, a.end)
                current = offset + a.size
            if best_fit == 0:
                break
        if best < 0:
            best = align_up(current, alignment)
        self.high_water_mark = max(self.high_water_mark, best + size)
        alloc = Alloc(tensor, best, size, first, last)
        at = bisect.bisect_right(self._offsets, best)     # std::upper_bound by offset
        self._live.insert(at, alloc)
        self._offsets.insert(at, best)
        return alloc


def allocation_order(tensors: list[int], sizes: dict[int, int], first: dict[int, int],
                     last: dict[int, int]) -> list[int]:
    """`CreateTensorAllocationVector`'s order (see the module docstring for ties)."""
    def key(t: int) -> tuple:
        if first[t] == 0 and last[t] == NEVER:
            return (0, t, 0, 0)
        return (1, -sizes[t], first[t], t)
    return sorted(tensors, key=key)
