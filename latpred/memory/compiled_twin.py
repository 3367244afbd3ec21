"""`quantize.float_twin`'s decision for a whole batch, compiled (numba) over flat arrays.

For a float graph on an int8 target, `flat_int8.classify` needs to know whether its int8
model (`quantize.int8_layout`) keeps its ops and tensors (`SAME`: planned retyped), adds
requantizing QUANTIZE ops (`TWIN`: `float_twin` then builds that twin in Python), or wraps
an fp32 island or holds a float constant in a same-scale group (`LAYOUT`: only the layout
will do). `twin_kinds` answers by `float_twin`'s own rules, loop for loop (the union-find of
`quantize._same_scale_groups` included), so Python builds a twin only where there is one.
tests/test_memory_compiled.py compares it with `float_twin` on every space's candidates.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latpred.memory.compiled import leaf
from latpred.tflite.quantize import FIXED, INT8_KERNELS, SAME_SCALE

SAME, TWIN, LAYOUT = 0, 1, 2
# Per op type, one int: the category (bits 0-1: 0 another int8 kernel, 1 same-scale, 2 fixed
# parameters, 3 no int8 kernel), which inputs carry data (bits 2-3, `quantize._data_inputs`:
# 0 input 0, 1 all, 2 input 1, 3 inputs 0 and 2) and the fixed parameters' number (bits 4+).
_OTHER, _SAME_SCALE, _FIXED, _NO_KERNEL = 0, 1, 2, 3
_PARAMS = sorted(set(FIXED.values()))
_CODES: dict[str, int] = {}


def type_code(op_type: str) -> int:
    code = _CODES.get(op_type)
    if code is None:
        rule = {"CONCATENATION": 1, "MAXIMUM": 1, "MINIMUM": 1, "SPLIT": 2, "PADV2": 3}
        category = (_NO_KERNEL if op_type not in INT8_KERNELS else _SAME_SCALE
                    if op_type in SAME_SCALE else _FIXED if op_type in FIXED else _OTHER)
        param = _PARAMS.index(FIXED[op_type]) if op_type in FIXED else 0
        code = _CODES[op_type] = category | rule.get(op_type, 0) << 2 | param << 4
    return code


@leaf
def _data(code, a, b, ins, k):
    """Input k of the op's data inputs (inputs a..b-1), or -2 past the last."""
    rule = (code >> 2) & 3
    if rule == 1:
        return ins[a + k] if a + k < b else -2
    if rule == 2:
        return ins[a + 1] if k == 0 and b - a > 1 else -2
    if rule == 3:
        if k == 0:
            return ins[a] if b > a else -2
        return ins[a + 2] if k == 1 and b - a > 2 else -2
    return ins[a] if k == 0 and b > a else -2


@leaf
def _find(parent, t):
    root = t
    while parent[root] != root:
        root = parent[root]
    parent[t] = root
    return root


@njit
def _one_graph(o0, o1, n_t, t0, code, in_ptr, ins, out_ptr, outs, f32, const, requant):
    """(SAME, TWIN or LAYOUT, n): for a TWIN, requant[:n] gets the tensors `float_twin`
    requantizes, in its order."""
    read_same = np.zeros(n_t, np.bool_)
    fixed = np.full(n_t, -1, np.int64)        # the fixed parameters an op's output gets
    params = 0
    for j in range(o0, o1):
        c, a, b = code[j], in_ptr[j], in_ptr[j + 1]
        category = c & 3
        if category == _NO_KERNEL:
            return LAYOUT, 0
        if category == _SAME_SCALE:
            k = 0
            t = _data(c, a, b, ins, 0)
            while t != -2:
                if t >= 0:
                    if const[t0 + t] and f32[t0 + t]:
                        return LAYOUT, 0
                    read_same[t] = True
                k += 1
                t = _data(c, a, b, ins, k)
        elif category == _FIXED:
            params |= 1 << (c >> 4)
            for q in range(out_ptr[j], out_ptr[j + 1]):
                if outs[q] >= 0:
                    fixed[outs[q]] = c >> 4      # the last writer's, as in Python
    if params & (params - 1) == 0:               # fewer than two fixed parameters
        return SAME, 0
    meets = False
    for t in range(n_t):
        meets = meets or (fixed[t] >= 0 and read_same[t])
    if not meets:
        return SAME, 0
    parent = np.arange(n_t)
    for j in range(o0, o1):                      # quantize._same_scale_groups
        c, a, b = code[j], in_ptr[j], in_ptr[j + 1]
        if c & 3 != _SAME_SCALE:
            continue
        first, k = -1, 0
        t = _data(c, a, b, ins, 0)
        while True:
            if t == -2:                          # then the outputs
                break
            if t >= 0 and f32[t0 + t]:
                if first < 0:
                    first = t
                else:
                    parent[_find(parent, t)] = _find(parent, first)
            k += 1
            t = _data(c, a, b, ins, k)
        for q in range(out_ptr[j], out_ptr[j + 1]):
            t = outs[q]
            if t >= 0 and f32[t0 + t]:
                if first < 0:
                    first = t
                else:
                    parent[_find(parent, t)] = _find(parent, first)
    pinned = np.full(n_t, -1, np.int64)
    twin = False
    for t in range(n_t):
        if fixed[t] >= 0:
            root = _find(parent, t)
            if pinned[root] < 0:
                pinned[root] = fixed[t]
            elif pinned[root] != fixed[t]:
                twin = True
    if not twin:
        return SAME, 0
    # float_twin's requantized tensors: per group (float32 activations), in the order of its
    # first member, the fixed members whose parameters differ from the first fixed member's
    first = np.full(n_t, -1, np.int64)       # per root: its first member
    pinned[:] = -1
    n = 0
    for t in range(n_t):
        if f32[t0 + t] and not const[t0 + t]:
            root = _find(parent, t)
            if first[root] < 0:
                first[root] = t
            if fixed[t] >= 0:
                if pinned[root] < 0:
                    pinned[root] = fixed[t]
                elif pinned[root] != fixed[t]:
                    requant[n] = t
                    n += 1
    if n == 0:                               # the conflicts are not float32 activations
        return SAME, 0
    # stable: by the group's first member, then by index
    key = np.empty(n, np.int64)
    for k in range(n):
        key[k] = first[_find(parent, requant[k])] * n_t + requant[k]
    requant[:n] = requant[:n][np.argsort(key)]
    return TWIN, n


@njit(cache=True)
def twin_kinds(graphs, g_ops, g_tens, code, in_ptr, ins, out_ptr, outs, f32, const):
    """Per graph of `graphs` (indices): SAME, TWIN or LAYOUT (`code`: per op `type_code`;
    `f32`, `const`: per tensor of all graphs in a row, float32 and stored in the model), and
    per graph the tensors its twin requantizes (CSR: offsets, graph-local indices)."""
    out = np.empty(len(graphs), np.int64)
    ptr = np.zeros(len(graphs) + 1, np.int64)
    found = np.empty(len(const), np.int64)
    for i in range(len(graphs)):
        g = graphs[i]
        t0 = g_tens[g]
        out[i], n = _one_graph(g_ops[g], g_ops[g + 1], g_tens[g + 1] - t0, t0, code, in_ptr,
                               ins, out_ptr, outs, f32, const, found[ptr[i]:])
        ptr[i + 1] = ptr[i] + n
    return out, ptr, found[:ptr[-1]]


@njit(cache=True)
def splice(twins, ptr, requant, g_ops, g_tens, in_ptr, ins, out_ptr, outs, same_scale):
    """All graphs' ops and tensors with each twin (`twins`, graph indices, ascending; its
    requantized tensors requant[ptr[i]:ptr[i + 1]], as `twin_kinds` gives them) in its graph's
    place, as `quantize._requantize` builds it: each requantized tensor gets a new tensor after
    the graph's own, written by a QUANTIZE op right after its producer, and same-scale ops read
    the new tensor instead. Returns the new op and tensor offsets, the wiring (CSR), per op the
    op it was (-1: an added QUANTIZE) and per tensor the tensor it was or copies (the source of
    an added one), and which tensors were added."""
    n_g = len(g_ops) - 1
    extra = np.zeros(n_g, np.int64)
    twin_of = np.full(n_g, -1, np.int64)
    for i in range(len(twins)):
        extra[twins[i]] = ptr[i + 1] - ptr[i]
        twin_of[twins[i]] = i
    new_ops, new_tens = np.zeros(n_g + 1, np.int64), np.zeros(n_g + 1, np.int64)
    for g in range(n_g):
        new_ops[g + 1] = new_ops[g] + g_ops[g + 1] - g_ops[g] + extra[g]
        new_tens[g + 1] = new_tens[g] + g_tens[g + 1] - g_tens[g] + extra[g]
    n_added = len(requant)
    src_op = np.empty(new_ops[-1], np.int64)
    src_t = np.empty(new_tens[-1], np.int64)
    added = np.zeros(new_tens[-1], np.bool_)
    nin_ptr, nout_ptr = np.zeros(new_ops[-1] + 1, np.int64), np.zeros(new_ops[-1] + 1, np.int64)
    nin, nout = np.empty(len(ins) + n_added, np.int64), np.empty(len(outs) + n_added, np.int64)
    o, ni, no = 0, 0, 0
    for g in range(n_g):
        i, t0, nt0, n_t = twin_of[g], g_tens[g], new_tens[g], g_tens[g + 1] - g_tens[g]
        for t in range(n_t):
            src_t[nt0 + t] = t0 + t
        into = np.full(n_t if i >= 0 else 0, -1, np.int64)
        if i >= 0:
            for k in range(ptr[i], ptr[i + 1]):
                into[requant[k]] = n_t + k - ptr[i]
                src_t[nt0 + n_t + k - ptr[i]] = t0 + requant[k]
                added[nt0 + n_t + k - ptr[i]] = True
        for j in range(g_ops[g], g_ops[g + 1]):
            remap = i >= 0 and same_scale[j]
            for q in range(in_ptr[j], in_ptr[j + 1]):
                t = ins[q]
                nin[ni] = into[t] if remap and t >= 0 and into[t] >= 0 else t
                ni += 1
            for q in range(out_ptr[j], out_ptr[j + 1]):
                nout[no] = outs[q]
                no += 1
            src_op[o] = j
            o += 1
            nin_ptr[o], nout_ptr[o] = ni, no
            if i < 0:
                continue
            for q in range(out_ptr[j], out_ptr[j + 1]):
                t = outs[q]
                if t >= 0 and into[t] >= 0:        # QUANTIZE (t,) -> (into[t],)
                    nin[ni], nout[no] = t, into[t]
                    ni += 1
                    no += 1
                    src_op[o] = -1
                    o += 1
                    nin_ptr[o], nout_ptr[o] = ni, no
    return new_ops, new_tens, nin_ptr, nin[:ni], nout_ptr, nout[:no], src_op, src_t, added
