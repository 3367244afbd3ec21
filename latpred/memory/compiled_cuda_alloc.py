"""`cuda_alloc.CachingAllocator`'s peak, compiled (numba) for `memory_totals` on CUDA targets.

The same rules, loop for loop (see `cuda_alloc` for where each comes from: round_size,
get_pool, get_free_block's (size, address) lower_bound, get_allocation_size, should_split,
free_block's merges), over blocks held in arrays instead of objects, for a whole batch of
graphs in one call. It keeps only what the peak needs: no reserved bytes, no segment list
(that is `empty_cache`'s). The process starts as `cuda_workspace.PROCESS_START` left it.
tests/test_memory_cuda.py compares it with the Python allocator on random request
sequences; scripts/memory_fast_check.py on every graph's totals.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latpred.memory.compiled import leaf
from latpred.memory.cuda_alloc import (K_LARGE_BUFFER, K_MIN_BLOCK, K_MIN_LARGE_ALLOC,
                                       K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE)
from latpred.memory.cuda_workspace import PROCESS_START
from latpred.memory.torch_plan import FREE    # an event's code: a free; else the bytes requested

_START = [(small, ((1 << 50) if small else 0), blocks) for small, blocks in PROCESS_START]
START_SIZE = np.array([s for _, _, bl in _START for s, _ in bl], np.int64)
START_USED = np.array([u for _, _, bl in _START for _, u in bl], np.bool_)
START_SMALL = np.array([sm for sm, _, bl in _START for _ in bl], np.bool_)
START_ADDR = np.array([a + sum(s for s, _ in bl[:k]) for _, a, bl in _START
                       for k in range(len(bl))], np.int64)
START_SEGMENT = np.array([k for k, (_, _, bl) in enumerate(_START) for _ in bl], np.int64)


@leaf
def _take_fit(pool, n_pool, b_size, b_addr, size):
    """`lower_bound` on (size, address): the index in `pool` of the smallest free block of at
    least `size` bytes, lowest address among equals; -1 when none."""
    best = -1
    for k in range(n_pool):
        b = pool[k]
        if b_size[b] >= size and (best == -1 or b_size[b] < b_size[pool[best]] or (
                b_size[b] == b_size[pool[best]] and b_addr[b] < b_addr[pool[best]])):
            best = k
    return best


@njit
def _peak(codes, sids, reset_at, start_size, start_used, start_small, start_addr,
          start_segment):
    """max_memory_allocated after the events from `reset_at` on (the peak is reset there)."""
    n_ev = len(codes)
    cap = len(start_size) + 2 * n_ev + 1
    b_addr = np.zeros(cap, np.int64)
    b_size = np.zeros(cap, np.int64)
    b_small = np.zeros(cap, np.bool_)
    b_used = np.zeros(cap, np.bool_)
    b_prev = np.full(cap, -1, np.int64)
    b_next = np.full(cap, -1, np.int64)
    pools = np.zeros((2, cap), np.int64)        # free blocks per pool (0 large, 1 small)
    n_pool = np.zeros(2, np.int64)
    where = np.full(cap, -1, np.int64)          # a free block's index in its pool
    n_sid = 0
    for k in range(n_ev):
        n_sid = max(n_sid, sids[k] + 1)
    block_of = np.full(n_sid, -1, np.int64)
    n_b = 0
    current = 0
    for k in range(len(start_size)):
        b_addr[k], b_size[k], b_small[k], b_used[k] = (start_addr[k], start_size[k],
                                                        start_small[k], start_used[k])
        if k > 0 and start_segment[k] == start_segment[k - 1]:
            b_prev[k], b_next[k - 1] = k - 1, k
        if start_used[k]:
            current += start_size[k]
        else:
            p = 1 if start_small[k] else 0
            pools[p, n_pool[p]], where[k] = k, n_pool[p]
            n_pool[p] += 1
        n_b += 1
    next_addr = np.int64(1) << 40
    peak = current
    for k in range(n_ev):
        if k == reset_at:
            peak = current
        code = codes[k]
        if code != FREE:
            size = K_MIN_BLOCK if code < K_MIN_BLOCK else \
                K_MIN_BLOCK * ((code + K_MIN_BLOCK - 1) // K_MIN_BLOCK)
            small = size <= K_SMALL_SIZE
            p = 1 if small else 0
            i = _take_fit(pools[p], n_pool[p], b_size, b_addr, size)
            if i == -1:
                if size <= K_SMALL_SIZE:
                    seg = K_SMALL_BUFFER
                elif size < K_MIN_LARGE_ALLOC:
                    seg = K_LARGE_BUFFER
                else:
                    seg = K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)
                b = n_b
                n_b += 1
                b_addr[b], b_size[b], b_small[b] = next_addr, seg, small
                next_addr += seg + K_ROUND_LARGE
            else:
                b = pools[p, i]
                _pool_remove(pools, n_pool, where, p, b)
            remaining = b_size[b] - size
            if (remaining >= K_MIN_BLOCK) if small else (remaining > K_SMALL_SIZE):
                rest = n_b
                n_b += 1
                b_addr[rest], b_size[rest], b_small[rest] = b_addr[b] + size, remaining, small
                b_prev[rest], b_next[rest] = b, b_next[b]
                if b_next[b] != -1:
                    b_prev[b_next[b]] = rest
                b_next[b] = rest
                b_size[b] = size
                _pool_add(pools, n_pool, where, p, rest)
            b_used[b] = True
            block_of[sids[k]] = b
            current += b_size[b]
            if current > peak:
                peak = current
        else:
            b = block_of[sids[k]]
            b_used[b] = False
            current -= b_size[b]
            p = 1 if b_small[b] else 0
            prev, nxt = b_prev[b], b_next[b]
            if prev != -1 and not b_used[prev]:
                _pool_remove(pools, n_pool, where, p, prev)
                b_addr[b], b_prev[b] = b_addr[prev], b_prev[prev]
                if b_prev[b] != -1:
                    b_next[b_prev[b]] = b
                b_size[b] += b_size[prev]
            if nxt != -1 and not b_used[nxt]:
                _pool_remove(pools, n_pool, where, p, nxt)
                b_next[b] = b_next[nxt]
                if b_next[b] != -1:
                    b_prev[b_next[b]] = b
                b_size[b] += b_size[nxt]
            _pool_add(pools, n_pool, where, p, b)
    return peak if reset_at < n_ev else current


@leaf
def _pool_add(pools, n_pool, where, p, b):
    pools[p, n_pool[p]], where[b] = b, n_pool[p]
    n_pool[p] += 1


@leaf
def _pool_remove(pools, n_pool, where, p, b):
    last = pools[p, n_pool[p] - 1]
    pools[p, where[b]], where[last] = last, where[b]
    n_pool[p] -= 1
    where[b] = -1


@njit(cache=True)
def peaks(codes, sids, g_ptr, g_reset, start_size, start_used, start_small, start_addr,
          start_segment):
    """`_peak` of each graph's events codes[g_ptr[g]:g_ptr[g + 1]], reset at g_reset[g]."""
    out = np.zeros(len(g_ptr) - 1, np.int64)
    for g in range(len(out)):
        a, b = g_ptr[g], g_ptr[g + 1]
        out[g] = _peak(codes[a:b], sids[a:b], g_reset[g], start_size, start_used,
                       start_small, start_addr, start_segment)
    return out


def batch_peaks(codes, sids, g_ptr, g_reset) -> np.ndarray:
    """Per graph, the peak after its load (events from the process start's state); lists or
    int64 arrays."""
    return peaks(np.asarray(codes, np.int64), np.asarray(sids, np.int64),
                 np.asarray(g_ptr, np.int64), np.asarray(g_reset, np.int64), START_SIZE,
                 START_USED, START_SMALL, START_ADDR, START_SEGMENT)
