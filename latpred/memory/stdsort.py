"""The two library behaviours that order LiteRT's ties: libstdc++'s `std::unordered_set<int>`
iteration order and its `std::sort` (introsort), which is not stable.

ai-edge-litert 2.3.0 links libstdc++ (libpywrap_litert_common.so NEEDED libstdc++.so.6).
`ArenaPlanner::GetTensorsToAllocate` concatenates each node's `unordered_set` of tensors and
`CreateTensorAllocationVector` sorts them with `std::sort`, so tensors of equal size born at
the same node (a MEAN's output and its accumulator, SPLIT's outputs) are placed in the order
these two produce. Reproduced from libstdc++ (GCC 9-14, bits/hashtable.h
`_M_insert_unique_node`, `_M_insert_bucket_begin`, `_M_rehash_aux`; hashtable_c++0x.cc
`_Prime_rehash_policy`; bits/stl_algo.h `__introsort_loop`, `__final_insertion_sort`).
"""

from __future__ import annotations

from typing import Callable, Sequence

_FAST_BKT = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
# The start of libstdc++'s __prime_list (after its first 6 entries, where _M_next_bkt looks).
_PRIMES = (13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103,
           109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293,
           313, 337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953,
           1031, 1109, 1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753,
           2971, 3209, 3469, 3739, 4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123,
           8783, 9497, 10273, 11113, 12011, 12983, 14033, 15173, 16411, 17749, 19183, 20753)


def _next_bkt(n: int) -> int:
    if n < len(_FAST_BKT):
        return 1 if n == 0 else _FAST_BKT[n]
    for p in _PRIMES:
        if p >= n:
            return p
    return n   # beyond any plan latpred meets


def unordered_set_order(values: Sequence[int]) -> list[int]:
    """Iteration order of an `unordered_set<int32_t>` after inserting `values` in order."""
    order: list[int] = []            # the singly linked node list, front first
    buckets = 1
    next_resize = 0
    count = 0
    for v in values:
        if v in order:
            continue
        if count + 1 > next_resize:                       # _M_need_rehash
            min_bkts = max(count + 1, 0 if next_resize else 11)
            if min_bkts >= buckets:
                buckets = _next_bkt(max(min_bkts + 1, buckets * 2))
                next_resize = buckets
                order = _rehash(order, buckets)
            else:
                next_resize = buckets
        order = _insert(order, v, buckets)
        count += 1
    return order


def _insert(order: list[int], v: int, buckets: int) -> list[int]:
    """`_M_insert_bucket_begin`: right after the bucket's first node's predecessor, i.e. at the
    start of its bucket's run; into an empty bucket, at the front of the list."""
    b = v % buckets
    for k, x in enumerate(order):
        if x % buckets == b:
            return order[:k] + [v] + order[k:]
    return [v] + order


def _rehash(order: list[int], buckets: int) -> list[int]:
    """`_M_rehash_aux` (unique keys): walk the old list inserting each node as `_insert` does
    (after its new bucket's "before" node: the start of the bucket's run, or the list front)."""
    out: list[int] = []
    for v in order:
        out = _insert(out, v, buckets)
    return out


def std_sort(items: Sequence, less: Callable[[object, object], bool]) -> list:
    """libstdc++ `std::sort`: introsort (median-of-three, unguarded partition) down to runs of
    16, then insertion sort. The heap-sort fallback (depth limit) uses a stable sort instead."""
    a = list(items)
    n = len(a)
    if n < 2:
        return a
    _introsort(a, 0, n, 2 * (n.bit_length() - 1), less)
    if n > 16:
        _insertion(a, 0, 16, less)
        for i in range(16, n):
            _linear_insert(a, i, less)
    else:
        _insertion(a, 0, n, less)
    return a


def _introsort(a: list, first: int, last: int, depth: int, less) -> None:
    while last - first > 16:
        if depth == 0:
            import functools
            a[first:last] = sorted(a[first:last], key=functools.cmp_to_key(
                lambda x, y: -1 if less(x, y) else (1 if less(y, x) else 0)))
            return
        depth -= 1
        mid = first + (last - first) // 2
        _median_to_first(a, first, first + 1, mid, last - 1, less)
        cut = _partition(a, first + 1, last, first, less)
        _introsort(a, cut, last, depth, less)
        last = cut


def _median_to_first(a: list, r: int, x: int, y: int, z: int, less) -> None:
    if less(a[x], a[y]):
        k = y if less(a[y], a[z]) else (z if less(a[x], a[z]) else x)
    elif less(a[x], a[z]):
        k = x
    elif less(a[y], a[z]):
        k = z
    else:
        k = y
    a[r], a[k] = a[k], a[r]


def _partition(a: list, first: int, last: int, pivot: int, less) -> int:
    while True:
        while less(a[first], a[pivot]):
            first += 1
        last -= 1
        while less(a[pivot], a[last]):
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _insertion(a: list, first: int, last: int, less) -> None:
    for i in range(first + 1, last):
        v = a[i]
        if less(v, a[first]):
            a[first + 1:i + 1] = a[first:i]
            a[first] = v
        else:
            _linear_insert(a, i, less)


def _linear_insert(a: list, i: int, less) -> None:
    v = a[i]
    j = i - 1
    while less(v, a[j]):
        a[j + 1] = a[j]
        j -= 1
    a[j + 1] = v
