"""One graph's XNNPACK-delegated plan, compiled: partitions, TFLite's arena, the workspace.

A port of `xnnpack.delegated_input` (partitions in one pass,
`xnnpack_partition._subset_numbers`) and of `litert_plan.plan` for one chunk without in-place
sharing or temporaries, with the rules and sources those functions cite; the workspace
(`xnnpack.workspace_plan` without extents) is in `compiled_workspace.py`, the shared pieces
(the op flags `OP_*` among them) in `compiled.py`. Graphs outside that scope report `False`
(see `OP_*` and `flat.op_flags`) and `flat.py` plans them in Python. Tensor indices are the
graph's own; `-1` is an absent optional input.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latpred.memory.compiled import (OP_ALWAYS, OP_FOLD, OP_INPLACE, OP_KIND_STOP, OP_POOL,
                                     OP_RESHAPE, OP_SLICE, OP_SOFTMAX, OP_SPLIT, OP_STATIC,
                                     OP_TFLITE_ONLY, STATIC_SHIFT, leaf, tflite_arena)
from latpred.memory.compiled_workspace import ROWS, count_readers, workspace


@leaf
def _known(t, const):
    return t < 0 or const[t] != 0


@leaf
def _kinds_unchanged(o0, o1, flags, in_ptr, ins, const):
    """`tensor_kinds` would change no type and end no chunk (checked on default types: the
    first change would stop the graph here)."""
    for j in range(o0, o1):
        f, a, b = flags[j], in_ptr[j], in_ptr[j + 1]
        if f & OP_KIND_STOP:
            return False
        if f & OP_RESHAPE:
            if b - a >= 2 and not _known(ins[a + 1], const):
                return False
            if _known(ins[a], const):
                return False
        if f & (OP_SLICE | OP_FOLD):
            known, present = True, False
            for k in range(a, b):
                known = known and _known(ins[k], const)
                present = present or ins[k] >= 0
            bounds = True
            for k in range(a + 1, min(a + 4, b)):
                bounds = bounds and _known(ins[k], const)
            if f & OP_SLICE and (not bounds or known):
                return False
            if f & OP_FOLD and known and present:
                return False
    return True


@leaf
def _supported(j, flags, attr_ok, declined, in_ptr, ins, const, dtype_ok):
    """`xnnpack_partition.supported` with default allocation types (mmap: stored in the model);
    `declined[j]`: an 8-bit op the delegate's quantized checks refuse (asked in Python)."""
    if declined[j]:
        return False
    f, a, b = flags[j], in_ptr[j], in_ptr[j + 1]
    data = 1 if f & OP_SPLIT else 0
    if b - a > data and ins[a + data] >= 0 and not dtype_ok[ins[a + data]]:
        return False
    if f & OP_STATIC:
        for k in range(4):
            if (f >> (STATIC_SHIFT + k)) & 1 and k < b - a and ins[a + k] >= 0 \
                    and not const[ins[a + k]]:
                return False
        return True
    if f & OP_ALWAYS:
        return not f & OP_SPLIT or const[ins[a]] != 0
    return (f & (OP_POOL | OP_SOFTMAX)) != 0 and attr_ok[j] != 0


@leaf
def _subsets(o0, n_op, sup, in_ptr, ins, producer, sub):
    """`xnnpack_partition._subset_numbers` into `sub` (one subset: all 0); -1 in sub[0] when
    ops are out of order."""
    sub[:] = 0
    first = sup[0]
    mixed = False
    for j in range(n_op):
        mixed = mixed or sup[j] != first
    if not mixed:
        return 1, False
    top = 0
    for j in range(n_op):
        k = 0 if sup[j] == first else 1
        for q in range(in_ptr[o0 + j], in_ptr[o0 + j + 1]):
            t = ins[q]
            i = producer[t] if t >= 0 else -1
            if i < 0:
                continue
            if i >= j:
                sub[0] = -1
                return 0, True
            need = sub[i] if sup[i] == sup[j] else sub[i] + 1
            k = max(k, need)
        sub[j] = k
        top = max(top, k)
    return top + 1, True


@leaf
def _sort_ints(a, lo, hi):
    """Sorts a[lo:hi] in place (insertion: a partition's few inputs or outputs)."""
    for i in range(lo + 1, hi):
        v = a[i]
        k = i - 1
        while k >= lo and a[k] > v:
            a[k + 1] = a[k]
            k -= 1
        a[k + 1] = v


@leaf
def _nodes(o0, n_op, sub, n_sub, sup, leave, is_out, in_ptr, ins, out_ptr, outs, flags, n_t,
           W):
    """The execution plan `delegated_input` builds, into the rows from `W_NODES`: per node its
    inputs and outputs (CSR), and per delegated partition its ops and internal tensors.
    Returns (nodes, partitions); -1 nodes: an op left to TFLite that this port does not
    cover, or an empty subset."""
    cap_in = in_ptr[o0 + n_op] - in_ptr[o0]
    cap_out = out_ptr[o0 + n_op] - out_ptr[o0]
    nin_ptr, nin = W[W_NODES, :n_op + 1], W[W_NODES + 1, :cap_in]
    nout_ptr, nout = W[W_NODES + 2, :n_op + 1], W[W_NODES + 3, :cap_out]
    part_ptr, part_ops = W[W_NODES + 4, :n_op + 1], W[W_NODES + 5, :n_op]
    inner_ptr, inner = W[W_NODES + 6, :n_op + 1], W[W_NODES + 7, :cap_out]
    nin_ptr[0] = nout_ptr[0] = part_ptr[0] = inner_ptr[0] = 0
    # ops by subset, ascending within each (a stable counting sort)
    start = W[W_TEMP, :n_sub + 1]
    start[:] = 0
    for j in range(n_op):
        start[sub[j] + 1] += 1
    for k in range(n_sub):
        if start[k + 1] == 0:
            return -1, 0
        start[k + 1] += start[k]
    order, fill = W[W_TEMP + 1, :n_op], W[W_TEMP + 2, :n_sub]
    for k in range(n_sub):
        fill[k] = start[k]
    for j in range(n_op):
        order[fill[sub[j]]] = j
        fill[sub[j]] += 1
    made, read = W[W_TEMP + 3, :n_t], W[W_TEMP + 4, :n_t]
    made[:] = -1            # the subset that produced a tensor
    read[:] = -1
    n_node, n_part, ni, no, npo, nnr = 0, 0, 0, 0, 0, 0
    for k in range(n_sub):
        ops = order[start[k]:start[k + 1]]
        if not sup[ops[0]]:
            for j in ops:
                f = flags[o0 + j]
                if f & OP_TFLITE_ONLY or (f & OP_INPLACE and not (
                        out_ptr[o0 + j + 1] > out_ptr[o0 + j] and is_out[outs[out_ptr[o0 + j]]])):
                    return -1, 0
                for q in range(in_ptr[o0 + j], in_ptr[o0 + j + 1]):
                    nin[ni] = ins[q]
                    ni += 1
                for q in range(out_ptr[o0 + j], out_ptr[o0 + j + 1]):
                    nout[no] = outs[q]
                    no += 1
                n_node += 1
                nin_ptr[n_node], nout_ptr[n_node] = ni, no
            continue
        for j in ops:
            part_ops[npo] = j
            npo += 1
            for q in range(out_ptr[o0 + j], out_ptr[o0 + j + 1]):
                made[outs[q]] = k
        s0 = ni
        for j in ops:          # read and not produced here, once each, sorted; no -1
            for q in range(in_ptr[o0 + j], in_ptr[o0 + j + 1]):
                t = ins[q]
                if t >= 0 and made[t] != k and read[t] != k:
                    read[t] = k
                    nin[ni] = t
                    ni += 1
        _sort_ints(nin, s0, ni)
        s0 = no
        for j in ops:          # produced here: leaving (sorted) or internal (in order)
            for q in range(out_ptr[o0 + j], out_ptr[o0 + j + 1]):
                t = outs[q]
                if leave[t]:
                    nout[no] = t
                    no += 1
                else:
                    inner[nnr] = t
                    nnr += 1
        _sort_ints(nout, s0, no)
        n_node += 1
        n_part += 1
        nin_ptr[n_node], nout_ptr[n_node] = ni, no
        part_ptr[n_part], inner_ptr[n_part] = npo, nnr
    return n_node, n_part


# Scratch rows, allocated once a batch (`scratch`) instead of ~60 small arrays a graph: numba's
# allocation and release cost ~20-50 ns an array, a fifth of a graph's plan (session 40).
# Rows of `W` (int64): an op's producer and subset, then `_nodes`' plan (8 rows, read until
# the workspace is planned), `count_readers`' counts, then rows each stage uses only while it runs
# (`_nodes`' sort, the arena's, the workspace's). Rows of `B` (bool): below.
W_PRODUCER, W_SUB, W_NODES, W_READERS, W_TEMP = 0, 1, 2, 10, 11
W_ROWS = W_TEMP + ROWS
W_ARENA = W_TEMP
B_SUP, B_IS_OUT, B_LEAVE, B_WANTED, B_ROWS = 0, 1, 2, 3, 4


@njit
def scratch(g_ops, g_tens, g_in_ptr, in_ptr, out_ptr):
    """`W`, `B` with rows as long as the batch's largest graph needs: its tensors (and one),
    ops (and one), op inputs, op outputs plus graph inputs."""
    cap = 1
    for g in range(len(g_ops) - 1):
        o0, o1 = g_ops[g], g_ops[g + 1]
        cap = max(cap, g_tens[g + 1] - g_tens[g] + 1, o1 - o0 + 1, in_ptr[o1] - in_ptr[o0],
                  out_ptr[o1] - out_ptr[o0] + g_in_ptr[g + 1] - g_in_ptr[g])
    return np.empty((W_ROWS, cap), np.int64), np.empty((B_ROWS, cap), np.bool_)


@njit
def plan_graph(o0, o1, size, const, dtype_ok, g_in, g_out, in_ptr, ins, out_ptr, outs, flags,
               attr_ok, declined, clamp, noact, delegated, W, B):
    """(covered, arena bytes, workspace bytes, workspace regrowth) of the graph whose ops are
    o0..o1-1; sets delegated[op]. `W`, `B`: scratch rows (`scratch`)."""
    n_op, n_t = o1 - o0, len(size)
    if n_op == 0 or not _kinds_unchanged(o0, o1, flags, in_ptr, ins, const):
        return False, 0, 0, 0
    for q in range(out_ptr[o0], out_ptr[o1]):
        if outs[q] < 0:
            return False, 0, 0, 0
    sup = B[B_SUP, :n_op]
    producer = W[W_PRODUCER, :n_t]
    producer[:] = -1
    for j in range(n_op):
        sup[j] = _supported(o0 + j, flags, attr_ok, declined, in_ptr, ins, const, dtype_ok)
        for q in range(out_ptr[o0 + j], out_ptr[o0 + j + 1]):
            producer[outs[q]] = j       # the last writer, as Graph.producers
    sub = W[W_SUB, :n_op]
    n_sub, mixed = _subsets(o0, n_op, sup, in_ptr, ins, producer, sub)
    if sub[0] < 0:
        return False, 0, 0, 0
    is_out, leave = B[B_IS_OUT, :n_t], B[B_LEAVE, :n_t]
    is_out[:] = False
    for t in g_out:
        is_out[t] = True
    for t in range(n_t):
        leave[t] = is_out[t]
    for j in range(n_op if mixed else 0):      # read by another subset than its producer's
        for q in range(in_ptr[o0 + j], in_ptr[o0 + j + 1]):
            t = ins[q]
            if t >= 0 and producer[t] >= 0 and sub[producer[t]] != sub[j]:
                leave[t] = True
    n_node, n_part = _nodes(o0, n_op, sub, n_sub, sup, leave, is_out, in_ptr, ins, out_ptr,
                            outs, flags, n_t, W)
    if n_node < 0:
        return False, 0, 0, 0
    nin_ptr, nin = W[W_NODES, :n_node + 1], W[W_NODES + 1]
    nout_ptr, nout = W[W_NODES + 2, :n_node + 1], W[W_NODES + 3]
    part_ptr, part_ops = W[W_NODES + 4], W[W_NODES + 5]
    inner_ptr, inner = W[W_NODES + 6], W[W_NODES + 7]
    arena = tflite_arena(nin_ptr, nin, nout_ptr, nout, g_in, g_out, size, const,
                         W[W_ARENA:W_ARENA + 11], B[B_WANTED])
    if arena < 0:
        return False, 0, 0, 0
    count_readers(o0, n_op, n_t, in_ptr, ins, W[W_READERS], W[W_TEMP])
    ws, regrowth = workspace(o0, part_ptr, part_ops, inner_ptr, inner, n_part, in_ptr, ins,
                             out_ptr, outs, flags, clamp, noact, size, W[W_READERS, :n_t],
                             W[W_TEMP:W_TEMP + ROWS])
    for j in range(n_op):
        delegated[o0 + j] = sup[j]
    return True, arena, ws, regrowth


@njit(cache=True)
def plan_batch(g_ops, g_tens, g_in_ptr, g_in, g_out_ptr, g_out, in_ptr, ins, out_ptr, outs,
               flags, attr_ok, declined, clamp, noact, t_size, t_const, t_dtype_ok):
    """`plan_graph` for each graph (tensors g_tens[g]..g_tens[g+1]-1, inputs and outputs as
    CSR): per graph (covered, arena, workspace, regrowth), per op whether it is delegated."""
    n_g = len(g_ops) - 1
    res = np.zeros((n_g, 4), np.int64)
    delegated = np.zeros(len(flags), np.bool_)
    W, B = scratch(g_ops, g_tens, g_in_ptr, in_ptr, out_ptr)
    for g in range(n_g):
        t0, t1 = g_tens[g], g_tens[g + 1]
        res[g, 0], res[g, 1], res[g, 2], res[g, 3] = plan_graph(
            g_ops[g], g_ops[g + 1], t_size[t0:t1], t_const[t0:t1], t_dtype_ok[t0:t1],
            g_in[g_in_ptr[g]:g_in_ptr[g + 1]], g_out[g_out_ptr[g]:g_out_ptr[g + 1]], in_ptr,
            ins, out_ptr, outs, flags, attr_ok, declined, clamp, noact, delegated, W, B)
    return res, delegated
