"""The GPU delegate's shared-object assignment (ML Drift's memory_management, GREEDY_BEST).

The delegate gives every intermediate tensor (graph inputs and outputs included) a usage
interval [first task, last task] and packs the tensors into shared buffers: two tensors whose
intervals do not meet may share one, whose size is the largest tensor it holds. GREEDY_BEST runs
two greedy heuristics and keeps the one with the smaller total.

Ported rule by rule from google-ai-edge/ml-drift @ 48cfed7e (identical in TFLite's GPU delegate,
tensorflow/lite/delegates/gpu/common/memory_management/):
- ml_drift/common/memory_management.cc: BestGreedy (GreedyBySizeDistPriorityAssignment first,
  GreedyByBreadthAssignment replaces it only when strictly smaller);
- ml_drift/common/memory_management/greedy_by_size_assignment.cc:
  GreedyBySizeDistPriorityAssignment (positional maximums, the size-distance priority);
- ml_drift/common/memory_management/greedy_by_breadth_assignment.cc: GreedyByBreadthAssignment;
- ml_drift/common/memory_management/internal.cc: CalculateTaskProfiles (per task, its tensors
  by non-increasing size, stable), CalculatePositionalMaximums.

Compiled with numba (memory-aware NAS plans every candidate; in Python the two heuristics took
~2 ms of a GPU graph's ~2 ms of memory work). Records are three int64 arrays: size, first
task, last task. tests/test_memory_gpu_delegate.py checks the worked examples of TFLite's own
test and compares both heuristics with a plain Python port on random records.

Editing this file: numba's on-disk cache (`cache=True`) checks only the calling function's own
file, so `gpu_compiled`'s cached functions keep the old code of the ones here until
latpred/memory/__pycache__/*.nbi, *.nbc are deleted (a fresh install or clone has none).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from latpred.memory.compiled import leaf

NONE = np.int64(1) << 62       # kNotAssigned (no distance yet)


@njit
def task_profiles(size, first, last):
    """CalculateTaskProfiles: per task, the records alive at it by non-increasing size (stable:
    ties by record order), as CSR (ptr per task, then record ids). One stable sort of all
    records; each takes its place in the tasks it spans."""
    n = len(size)
    n_tasks = 0
    for r in range(n):
        n_tasks = max(n_tasks, last[r] + 1)
    ptr = np.zeros(n_tasks + 1, np.int64)
    for r in range(n):
        for t in range(first[r], last[r] + 1):
            ptr[t + 1] += 1
    for t in range(n_tasks):
        ptr[t + 1] += ptr[t]
    fill = ptr[:n_tasks].copy()
    prof = np.empty(ptr[n_tasks], np.int64)
    for r in np.argsort(-size, kind="mergesort"):
        for t in range(first[r], last[r] + 1):
            prof[fill[t]] = r
            fill[t] += 1
    return ptr, prof


@njit
def _positional_maximums(size, ptr, prof):
    """CalculatePositionalMaximums: per position p, the largest p-th largest size alive at a
    task."""
    n_pos = 0
    for t in range(len(ptr) - 1):
        n_pos = max(n_pos, ptr[t + 1] - ptr[t])
    out = np.zeros(n_pos, np.int64)
    for t in range(len(ptr) - 1):
        for i in range(ptr[t + 1] - ptr[t]):
            out[i] = max(out[i], size[prof[ptr[t] + i]])
    return out


@leaf
def _higher(position, best_dist, size, a, b):
    """SizeDistPriorityInfo::operator> (a over b)."""
    if position[a] != position[b]:
        return position[a] < position[b]
    if best_dist[a] != best_dist[b]:
        return best_dist[a] < best_dist[b]
    return size[a] > size[b]


@njit(cache=True)
def by_size(size, first, last):
    """GreedyBySizeDistPriorityAssignment: (object id per record, object sizes)."""
    ptr, prof = task_profiles(size, first, last)
    return _by_size(size, first, last, _positional_maximums(size, ptr, prof))


@njit
def _by_size(size, first, last, pos_max):
    n = len(size)
    position = np.empty(n, np.int64)
    for r in range(n):
        p = 0
        while p < len(pos_max) and pos_max[p] >= size[r]:
            p += 1
        position[r] = p - 1
    # per record, its distance to each object: written for every record still unassigned
    # when the object is made, and only such records read it (so no initial fill)
    dist = np.empty((n, n), np.int64)
    best_dist = np.full(n, NONE, np.int64)
    best_obj = np.full(n, -1, np.int64)
    obj_of = np.full(n, -1, np.int64)
    sizes = np.zeros(n, np.int64)
    free = np.arange(n)         # the unassigned records, in record order (ties go to the first)
    n_free = n
    n_obj = 0
    for _ in range(n):
        at = 0
        best = free[0]
        for q in range(1, n_free):   # the highest priority among the unassigned (operator>)
            i = free[q]
            if _higher(position, best_dist, size, i, best):
                best, at = i, q
        n_free -= 1
        free[at:n_free] = free[at + 1:n_free + 1]
        new = best_dist[best] == NONE
        if new:
            obj = n_obj
            sizes[obj] = size[best]
            n_obj += 1
        else:
            obj = best_obj[best]
            sizes[obj] = max(sizes[obj], size[best])
        obj_of[best] = obj
        b_first, b_last = first[best], last[best]
        for q in range(n_free):
            i = free[q]
            if not new and dist[i, obj] == NONE:
                continue
            if last[i] < b_first:
                d = b_first - last[i]
            elif b_last < first[i]:
                d = first[i] - b_last
            else:
                d = NONE
            if new:
                dist[i, obj] = d
            elif d == NONE:
                dist[i, obj] = NONE
                if best_obj[i] == obj:  # RecalcBestDist
                    best_dist[i], best_obj[i] = NONE, -1
                    for o in range(n_obj):
                        if dist[i, o] < best_dist[i]:
                            best_dist[i], best_obj[i] = dist[i, o], o
            else:
                dist[i, obj] = min(dist[i, obj], d)
            if d < best_dist[i]:
                best_dist[i], best_obj[i] = d, obj
    return obj_of, sizes[:n_obj].copy()


@leaf
def _fits(members, head, o, first, last, r_first, r_last):
    """No record already in object `o` meets [r_first, r_last] (its intervals are disjoint,
    so this is the std::set::lower_bound test of the original)."""
    m = head[o]
    while m != -1:
        if first[m] <= r_last and last[m] >= r_first:
            return False
        m = members[m]
    return True


@njit(cache=True)
def by_breadth(size, first, last):
    """GreedyByBreadthAssignment: (object id per record, object sizes)."""
    ptr, prof = task_profiles(size, first, last)
    return _by_breadth(size, first, last, ptr, prof)


@njit
def _by_breadth(size, first, last, ptr, prof):
    n, n_tasks = len(size), len(ptr) - 1
    breadth = np.zeros(n_tasks, np.int64)
    for t in range(n_tasks):
        for q in range(ptr[t], ptr[t + 1]):
            breadth[t] += size[prof[q]]
    # std::stable_sort over reverse iterators: by non-increasing breadth, ties by task id
    order = np.argsort(-breadth, kind="mergesort")
    obj_of = np.full(n, -1, np.int64)
    sizes = np.zeros(n, np.int64)
    head = np.full(n, -1, np.int64)         # per object, its first record; then a chain
    members = np.full(n, -1, np.int64)
    n_obj = 0
    for task in order:
        for q in range(ptr[task], ptr[task + 1]):
            r = prof[q]
            if obj_of[r] != -1:
                continue
            s = size[r]
            best = n_obj
            for o in range(n_obj):
                if best != n_obj:
                    bs, cs = sizes[best], sizes[o]
                    if bs < s:
                        if cs <= bs:
                            continue
                    elif cs < s or cs >= bs:
                        continue
                if _fits(members, head, o, first, last, first[r], last[r]):
                    best = o
            if best == n_obj:
                sizes[best] = s
                n_obj += 1
            else:
                sizes[best] = max(sizes[best], s)
            members[r] = head[best]
            head[best] = r
            obj_of[r] = best
    return obj_of, sizes[:n_obj].copy()


@njit
def best_sizes(size, first, last):
    """BestGreedy's object sizes: by size, unless by breadth totals strictly less."""
    ptr, prof = task_profiles(size, first, last)
    s = _by_size(size, first, last, _positional_maximums(size, ptr, prof))[1]
    b = _by_breadth(size, first, last, ptr, prof)[1]
    return b if b.sum() < s.sum() else s


def record_arrays(records: Sequence[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
    """(size, first, last) records as the three int64 arrays the heuristics take."""
    a = np.array(records, np.int64).reshape(-1, 3)
    return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy()


def greedy_by_size(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyBySizeDistPriorityAssignment of (size, first, last) records: (object id per
    record, object sizes)."""
    obj_of, sizes = by_size(*record_arrays(records))
    return obj_of.tolist(), sizes.tolist()


def greedy_by_breadth(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyByBreadthAssignment: (object id per record, object sizes)."""
    obj_of, sizes = by_breadth(*record_arrays(records))
    return obj_of.tolist(), sizes.tolist()


def greedy_best(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """BestGreedy: by size, unless by breadth totals strictly less."""
    by_size_ = greedy_by_size(records)
    by_breadth_ = greedy_by_breadth(records)
    return by_breadth_ if sum(by_breadth_[1]) < sum(by_size_[1]) else by_size_
