"""Compiled planners (numba) for `predict_many_with_memory`: one call plans a whole batch.

The rules are those of the Python planners, ported loop for loop over flat arrays so that the
totals stay identical (scripts/memory_fast_check.py; tests/test_memory_compiled.py compares
each piece with its Python original):

- `arena_offset` is `arena.SimpleArena.allocate`, `gap_offset` `xnnpack._find_offset`,
  `set_order` `stdsort.unordered_set_order`, `_std_sort` `stdsort.std_sort`;
- `tflite_arena` is `litert_plan.plan`'s arena size for one chunk without in-place sharing
  or temporaries;
- `plan_graph` (in `compiled_graph`) is `xnnpack.delegated_input` + `litert_plan.plan` +
  `xnnpack.workspace_plan` for the graphs `flat.py` hands over: those in which Prepare changes
  no allocation type and ends no chunk, whose ops left to TFLite have no temporaries and do
  not run in place (their output is not shared: a graph output). Any other graph reports
  `False` and is planned in Python. 8-bit ops: the delegate's decision comes in per op
  (`flat_int8`).

On-disk cache: only the functions Python calls (`compiled_graph.plan_batch`,
`compiled_buffers.op_buffers`, ...) are compiled with `cache=True`; a cached function carries
the code of the helpers it calls, which are therefore never compiled in a process that loads
it. Helpers are not cached: numba writes a function's cache index and its data files
separately, so two processes compiling different signatures of one function at once (helpers
get several: literal arguments) can leave the index naming one signature's code for
another's, which then runs on the wrong types (session 39 met a twin classification reading
garbage tensor indices after two such processes; numba/numba#10128 reports the same race).
Editing this file (or `compiled_workspace.py`): the cache checks only the cached function's
own file, so `compiled_graph`'s cached functions keep the old code of the ones here until
latpred/memory/__pycache__/*.nbi, *.nbc are deleted (a fresh install or clone has none).

Arrays: `t_*` per tensor, `op_*` per op; `*_ptr` are CSR offsets (entries [ptr[i], ptr[i+1])).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Per op type, what the host's compiled plan reads (`compiled_graph`, `compiled_workspace`;
# `flat.op_flags` sets them from the Python planners' own type sets).
OP_ALWAYS, OP_SPLIT, OP_STATIC, OP_POOL, OP_SOFTMAX = 1, 2, 4, 8, 16
OP_TFLITE_ONLY = 32        # temporaries when left to TFLite: not here
OP_INPLACE = 8192          # may share its input's buffer when left to TFLite: here only when
                           # its output is a graph output, which `IdentifyInPlaceTensors` never
                           # shares (an int8 model's closing SOFTMAX, which XNNPACK declines)
OP_KIND_STOP = 64          # SHAPE, REDUCE_PROD: may change allocation types: not here
OP_RESHAPE, OP_SLICE, OP_FOLD = 128, 256, 512    # may fold at Prepare (litert_builtin)
OP_XNN_IN_PLACE, OP_PAD, OP_CONV = 1024, 2048, 4096
STATIC_SHIFT = 16          # bits 16-19: `xnnpack_partition._STATIC`'s input positions

NEVER = 2 ** 31 - 1            # arena.NEVER
ALIGN = 64                     # arena.TENSOR_ALIGNMENT, xnnpack.ALIGNMENT
# libstdc++'s bucket counts (stdsort._FAST_BKT, stdsort._PRIMES)
FAST_BKT = np.array((1, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13), dtype=np.int64)
PRIMES = np.array((13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89,
                   97, 103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227,
                   241, 257, 277, 293, 313, 337, 359, 383, 409, 439, 467, 503, 541, 577, 619,
                   661, 709, 761, 823, 887, 953, 1031, 1109, 1193, 1289, 1381, 1493, 1613,
                   1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739, 4027,
                   4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497, 10273,
                   11113, 12011, 12983, 14033, 15173, 16411, 17749, 19183, 20753),
                  dtype=np.int64)


def leaf(fn):
    """`njit` for a helper that allocates nothing and returns no array: compiled without
    numba's reference counting (`_nrt=False`, an option numba's own tests use). With it, each
    call increments and decrements the count of every array argument atomically at entry and
    exit; helpers called per op or per comparison paid more for that than for their work
    (`_supported`, 8 arrays: ~55 ns a call against ~3 ns without, session 39). Its arguments
    are borrowed from a caller that holds them, so no count is needed. Like every helper it
    is not cached on disk (see the module's docstring)."""
    return njit(_nrt=False)(fn)


@leaf
def arena_offset(live_off, live_size, live_first, live_last, n_live, size, first, last):
    """`SimpleArena.allocate`'s offset for a tensor of `size` bytes live over [first, last]
    among the `n_live` allocations (sorted by offset); inserts it there (after equal offsets,
    `std::upper_bound`). Returns (offset, n_live + 1)."""
    best, best_fit, current, have_fit = -1, 0, 0, False
    for k in range(n_live):
        if live_last[k] < first or live_first[k] > last:
            continue
        offset = live_off[k]
        aligned = -(-current // ALIGN) * ALIGN
        if aligned + size <= offset and (not have_fit or offset - aligned < best_fit):
            best, best_fit, have_fit = aligned, offset - current, True
        if offset + live_size[k] > current:
            current = offset + live_size[k]
        if have_fit and best_fit == 0:
            break
    if best < 0:
        best = -(-current // ALIGN) * ALIGN
    at = n_live
    while at > 0 and live_off[at - 1] > best:
        at -= 1
    for k in range(n_live, at, -1):
        live_off[k], live_size[k] = live_off[k - 1], live_size[k - 1]
        live_first[k], live_last[k] = live_first[k - 1], live_last[k - 1]
    live_off[at], live_size[at], live_first[at], live_last[at] = best, size, first, last
    return best, n_live + 1


@leaf
def gap_offset(starts, ends, n, need):
    """`xnnpack._find_offset` over the first `n` blocks, sorted by (start, end)."""
    start, end = starts[0], ends[0]
    have, best_gap, offset = start >= need, start, 0
    for k in range(1, n):
        s, e = starts[k], ends[k]
        if s > end:
            gap = s - end
            if gap >= need and (not have or gap < best_gap):
                have, best_gap, offset = True, gap, end
            end = e
        elif e > end:
            end = e
    return offset if have else end


@leaf
def _next_bkt(n):
    if n < 14:
        return FAST_BKT[n]
    for p in PRIMES:
        if p >= n:
            return p
    return n


@leaf
def _insert(order, n, v, buckets):
    """stdsort._insert on order[:n]: before the first node of v's bucket, else at the front."""
    at = 0
    for k in range(n):
        if order[k] % buckets == v % buckets:
            at = k
            break
    for k in range(n, at, -1):
        order[k] = order[k - 1]
    order[at] = v


@njit
def set_order(values, n, out):
    """`unordered_set_order(values[:n])` into `out`; returns its length."""
    count, buckets, next_resize = 0, 1, 0
    tmp = np.empty(n, dtype=np.int64)
    for i in range(n):
        v = values[i]
        seen = False
        for k in range(count):
            if out[k] == v:
                seen = True
        if seen:
            continue
        if count + 1 > next_resize:
            min_bkts = max(count + 1, 0 if next_resize else 11)
            if min_bkts >= buckets:
                buckets = _next_bkt(max(min_bkts + 1, buckets * 2))
                next_resize = buckets
                tmp[:count] = out[:count]
                for k in range(count):
                    _insert(out, k, tmp[k], buckets)
            else:
                next_resize = buckets
        _insert(out, count, v, buckets)
        count += 1
    return count


@leaf
def _before(a, b, size, first, last, with_index):
    """`CreateTensorAllocationVector`'s order (`litert_plan._order`): whole-run tensors first
    by index, then larger first, then earlier allocation node (then index, `with_index`)."""
    wa = first[a] == 0 and last[a] == NEVER
    wb = first[b] == 0 and last[b] == NEVER
    if wa or wb:
        return wa and (not wb or a < b)
    if size[a] != size[b]:
        return size[a] > size[b]
    if first[a] != first[b]:
        return first[a] < first[b]
    return with_index and a < b


@leaf
def _sort(items, n, size, first, last, with_index):
    """Stable insertion sort of items[:n] by `_before` (at most a few dozen tensors)."""
    for i in range(1, n):
        v = items[i]
        k = i - 1
        while k >= 0 and _before(v, items[k], size, first, last, with_index):
            items[k + 1] = items[k]
            k -= 1
        items[k + 1] = v


@njit
def _std_sort(a, n, size, first, last):
    """`stdsort.std_sort` of a[:n] by `_before` without the index (libstdc++'s introsort down
    to runs of 16, then one insertion sort); False where its depth limit would switch to heap
    sort, which this port does not follow (the caller leaves the graph to Python)."""
    if n > 16:
        depth = 0
        m = n
        while m > 1:
            m >>= 1
            depth += 1
        if not _introsort(a, 0, n, 2 * (depth - 1), size, first, last):
            return False
    _sort(a, n, size, first, last, False)       # insertion sort, as __final_insertion_sort
    return True


@njit
def _introsort(a, lo, hi, depth, size, first, last):
    """`stdsort._introsort` (the recursion on the upper part as an explicit stack)."""
    stack = np.empty((64, 3), np.int64)
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = lo, hi, depth
    top = 1
    while top:
        top -= 1
        lo, hi, depth = stack[top, 0], stack[top, 1], stack[top, 2]
        while hi - lo > 16:
            if depth == 0:
                return False
            depth -= 1
            _median_to_first(a, lo, lo + 1, lo + (hi - lo) // 2, hi - 1, size, first, last)
            cut = _partition(a, lo + 1, hi, lo, size, first, last)
            if top == 64:
                return False
            stack[top, 0], stack[top, 1], stack[top, 2] = cut, hi, depth
            top += 1
            hi = cut
    return True


@leaf
def _median_to_first(a, r, x, y, z, size, first, last):
    if _before(a[x], a[y], size, first, last, False):
        if _before(a[y], a[z], size, first, last, False):
            k = y
        elif _before(a[x], a[z], size, first, last, False):
            k = z
        else:
            k = x
    elif _before(a[x], a[z], size, first, last, False):
        k = x
    elif _before(a[y], a[z], size, first, last, False):
        k = z
    else:
        k = y
    a[r], a[k] = a[k], a[r]


@leaf
def _partition(a, lo, hi, pivot, size, first, last):
    while True:
        while _before(a[lo], a[pivot], size, first, last, False):
            lo += 1
        hi -= 1
        while _before(a[pivot], a[hi], size, first, last, False):
            hi -= 1
        if not lo < hi:
            return lo
        a[lo], a[hi] = a[hi], a[lo]
        lo += 1


@njit
def tflite_arena(nin_ptr, nin, nout_ptr, nout, g_in, g_out, size, const, R, wanted):
    """`litert_plan.plan`'s arena size for one chunk, no sharing, no temporaries (-1: a case
    this port leaves to Python: a tensor allocated twice, or ties that std::sort would finish
    with heap sort). `R`: 11 scratch rows, `wanted`: one, each at least as long as the
    tensors and as the graph inputs plus the nodes' outputs (`compiled_graph.scratch`)."""
    n_node, n_t = len(nin_ptr) - 1, len(size)
    base = R[0, :n_t]
    base[:] = 0
    for t in g_out:
        base[t] += 1
    for t in g_in:
        base[t] += 1
    first = R[1, :n_t]
    first[:] = -1
    for i in range(n_node - 1, -1, -1):
        for q in range(nout_ptr[i], nout_ptr[i + 1]):
            first[nout[q]] = i
    for t in g_in:
        first[t] = 0
    last_read = R[2, :n_t]
    last_read[:] = -1
    for i in range(n_node):
        for q in range(nin_ptr[i], nin_ptr[i + 1]):
            if nin[q] >= 0:
                last_read[nin[q]] = i
    last = R[3, :n_t]
    last[:] = NEVER
    for t in range(n_t):
        if first[t] >= 0 and last_read[t] >= first[t] and base[t] == 0:
            last[t] = last_read[t]
    # node_tensors: node 0 holds the graph inputs, then each node its outputs
    seq = R[4, :len(g_in) + nout_ptr[n_node]]
    seq[:len(g_in)] = g_in
    seq[len(g_in):] = nout[:nout_ptr[n_node]]
    todo = R[5]
    wanted = wanted[:n_t]
    wanted[:] = False
    m = 0
    for t in seq:
        if not const[t] and size[t] > 0:
            if wanted[t]:
                return -1
            wanted[t] = True
            todo[m] = t
            m += 1
    # Sorted with the index as the last key, tensors that tie without it (not whole-run,
    # equal size and first node) sit next to each other: one pass finds any.
    _sort(todo, m, size, first, last, True)
    tied = False
    for k in range(1, m):
        x, y = todo[k - 1], todo[k]
        if not (first[x] == 0 and last[x] == NEVER) and \
                not (first[y] == 0 and last[y] == NEVER) and \
                size[x] == size[y] and first[x] == first[y]:
            tied = True
            break
    if tied:        # each node's unordered_set order, concatenated, then std::sort
        m = 0
        done = R[6]
        for i in range(n_node):
            lo = nout_ptr[i] + (len(g_in) if i else 0)
            hi = nout_ptr[i + 1] + len(g_in)
            n = set_order(seq[lo:hi], hi - lo, done)
            for k in range(n):
                if wanted[done[k]]:
                    todo[m] = done[k]
                    m += 1
        if not _std_sort(todo, m, size, first, last):
            return -1
    off, sz, lf, ll = R[7], R[8], R[9], R[10]
    hwm, n_live = 0, 0
    for k in range(m):
        t = todo[k]
        at, n_live = arena_offset(off, sz, lf, ll, n_live, size[t], first[t], last[t])
        hwm = max(hwm, at + size[t])
    return hwm
