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
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

_NONE = float("inf")  # kNotAssigned


def _task_profiles(records: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    """Per task, the records alive at it, by non-increasing size (std::stable_sort)."""
    n_tasks = max((last + 1 for _, _, last in records), default=0)
    profiles: list[list[int]] = [[] for _ in range(n_tasks)]
    for r, (_, first, last) in enumerate(records):
        for t in range(first, last + 1):
            profiles[t].append(r)
    for p in profiles:
        p.sort(key=lambda r: -records[r][0])  # Python's sort is stable, as std::stable_sort
    return profiles


def _positional_maximums(records, profiles) -> list[int]:
    out: list[int] = []
    for p in profiles:
        for i, r in enumerate(p):
            if i < len(out):
                out[i] = max(out[i], records[r][0])
            else:
                out.append(records[r][0])
    return out


def greedy_by_size(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyBySizeDistPriorityAssignment: (object id per record, object sizes)."""
    n = len(records)
    pos_max = _positional_maximums(records, _task_profiles(records))
    position = []
    for size, _, _ in records:
        p = 0
        while p < len(pos_max) and pos_max[p] >= size:
            p += 1
        position.append(p - 1)
    dist: list[list[float]] = [[] for _ in range(n)]
    best_dist = [_NONE] * n
    best_obj = [-1] * n
    obj_of = [-1] * n
    sizes: list[int] = []
    for _ in range(n):
        best = -1
        for i in range(n):  # the highest priority among the unassigned (operator>)
            if obj_of[i] != -1:
                continue
            if best == -1 or _higher(position, best_dist, records, i, best):
                best = i
        if best_dist[best] == _NONE:
            new, obj = True, len(sizes)
            sizes.append(records[best][0])
        else:
            new, obj = False, best_obj[best]
            sizes[obj] = max(sizes[obj], records[best][0])
        obj_of[best] = obj
        b_size, b_first, b_last = records[best]
        for i in range(n):
            if obj_of[i] != -1:
                continue
            if not new and dist[i][obj] == _NONE:
                continue
            _, first, last = records[i]
            d = (b_first - last) if last < b_first else (first - b_last) if b_last < first \
                else _NONE
            if new:
                dist[i].append(d)
            elif d == _NONE:
                dist[i][obj] = _NONE
                if best_obj[i] == obj:  # RecalcBestDist
                    best_dist[i], best_obj[i] = _NONE, -1
                    for o, v in enumerate(dist[i]):
                        if v < best_dist[i]:
                            best_dist[i], best_obj[i] = v, o
            else:
                dist[i][obj] = min(dist[i][obj], d)
            if d < best_dist[i]:
                best_dist[i], best_obj[i] = d, obj
    return obj_of, sizes


def _higher(position, best_dist, records, a: int, b: int) -> bool:
    """SizeDistPriorityInfo::operator> (a over b)."""
    if position[a] != position[b]:
        return position[a] < position[b]
    if best_dist[a] != best_dist[b]:
        return best_dist[a] < best_dist[b]
    return records[a][0] > records[b][0]


def greedy_by_breadth(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyByBreadthAssignment: (object id per record, object sizes)."""
    profiles = _task_profiles(records)
    breadth = [(sum(records[r][0] for r in p), t) for t, p in enumerate(profiles)]
    # std::stable_sort over reverse iterators: by non-increasing breadth, ties by task id.
    order = sorted(breadth, key=lambda bt: (-bt[0], bt[1]))
    obj_of = [-1] * len(records)
    sizes: list[int] = []
    schedules: list[list[tuple[int, int]]] = []  # per object, (first, last) sorted by first
    for _, task in order:
        for r in profiles[task]:
            if obj_of[r] != -1:
                continue
            size, first, last = records[r]
            best = len(schedules)
            for o in range(len(schedules)):
                if best != len(schedules):
                    bs, cs = sizes[best], sizes[o]
                    if bs < size:
                        if cs <= bs:
                            continue
                    elif cs < size or cs >= bs:
                        continue
                if _fits(schedules[o], first, last):
                    best = o
            if best == len(schedules):
                schedules.append([(first, last)])
                sizes.append(size)
            else:
                sched = schedules[best]
                sched.insert(bisect_left(sched, (first,)), (first, last))
                sizes[best] = max(sizes[best], size)
            obj_of[r] = best
    return obj_of, sizes


def _fits(schedule: list[tuple[int, int]], first: int, last: int) -> bool:
    """No interval of the object's schedule meets [first, last] (std::set::lower_bound)."""
    k = bisect_left(schedule, (first,))
    if k < len(schedule) and schedule[k][0] <= last:
        return False
    return not (k > 0 and schedule[k - 1][1] >= first)


def greedy_best(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """BestGreedy: by size, unless by breadth totals strictly less."""
    by_size = greedy_by_size(records)
    by_breadth = greedy_by_breadth(records)
    return by_breadth if sum(by_breadth[1]) < sum(by_size[1]) else by_size
