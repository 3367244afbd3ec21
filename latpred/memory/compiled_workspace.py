"""XNNPACK's workspace for one graph's delegated partitions, compiled: a port of
`xnnpack.workspace_plan` without extents (`_lifetimes`, `_reused`, `_partition_plan`), with
the rules and sources those functions cite. `compiled_graph.plan_graph` calls it after the
partitions and TFLite's arena; it allocates nothing (scratch rows come in).
"""

from __future__ import annotations

from latpred.memory.compiled import (ALIGN, OP_CONV, OP_PAD, OP_POOL, OP_XNN_IN_PLACE,
                                     gap_offset, leaf)

ROWS = 16       # the scratch rows `workspace` takes


@leaf
def _mapped(t, fused, fst, p):
    """`fused.get(t, t)` for partition p: an elided node's output stands for its source."""
    return fused[t] if t >= 0 and fst[t] == p else t


@leaf
def _lifetimes(o0, ops, p, pin, in_ptr, ins, out_ptr, outs, flags, noact, readers, first,
               last, cons, fused, fst, seen, cand):
    """`xnnpack._lifetimes` for partition p (its internal tensors have pin == p); returns the
    ops that may run in place (in `cand`). `readers[t]`: how many ops read t (-1 - the op,
    when one)."""
    n_cand = 0
    for n in range(len(ops)):
        j = o0 + ops[n]
        f, a, b = flags[j], in_ptr[j], in_ptr[j + 1]
        stamp = ops[n] + 1          # seen[t] == stamp: node n has read t (ops are unique)
        if f & (OP_POOL | OP_PAD | OP_XNN_IN_PLACE) and out_ptr[j + 1] > out_ptr[j] and \
                pin[outs[out_ptr[j]]] == p:
            r = readers[outs[out_ptr[j]]]
            if (f & OP_PAD and r < 0 and flags[o0 - 1 - r] & OP_CONV) or \
                    (not f & OP_PAD and noact[j]):
                # elided: its readers read its input, which it keeps alive (no consumer)
                out = outs[out_ptr[j]]
                fused[out], fst[out] = _mapped(ins[a], fused, fst, p), p
                for q in range(a, b):
                    t = _mapped(ins[q], fused, fst, p)
                    if t >= 0 and pin[t] == p and seen[t] != stamp:
                        seen[t], last[t] = stamp, n
                continue
            if f & (OP_XNN_IN_PLACE | OP_POOL):
                cand[n_cand] = j
                n_cand += 1
        for q in range(out_ptr[j], out_ptr[j + 1]):
            if pin[outs[q]] == p:
                first[outs[q]] = last[outs[q]] = n
        for q in range(a, b):        # a value read twice by one node is one consumer
            t = _mapped(ins[q], fused, fst, p)
            if t >= 0 and pin[t] == p and seen[t] != stamp:
                seen[t], last[t] = stamp, n
                cons[t] += 1
    return n_cand


@leaf
def _reused(cand, p, pin, in_ptr, ins, out_ptr, outs, flags, clamp, size, last, cons, fused,
            fst, reuse, rst):
    """`xnnpack._reused`: in-place outputs take a one-consumer input of equal size
    (reuse[t], valid where rst[t] == p), extending that value's lifetime."""
    for j in cand:
        out = outs[out_ptr[j]]
        if pin[out] != p or fst[out] == p or cons[out] != 1 or \
                not (flags[j] & OP_XNN_IN_PLACE or clamp[j]):
            continue
        for q in range(in_ptr[j], in_ptr[j + 1]):
            t = _mapped(ins[q], fused, fst, p)
            if t >= 0 and pin[t] == p and fst[t] != p and cons[t] == 1 and \
                    size[t] == size[out]:
                root = t
                while rst[root] == p:
                    root = reuse[root]
                reuse[out], rst[out] = root, p
                last[root] = max(last[root], last[out])
                break


@leaf
def _place(values, n_val, need, first, last, off, end, bs, be):
    """`xnnpack._partition_plan`'s placement: values (largest first) at the smallest gap
    among the blocks of those placed whose lifetimes meet theirs; the plan's size (`off`,
    `end`, `bs`, `be`: scratch of n_val entries)."""
    total = 0
    for v in range(n_val):
        t = values[v]
        nb = 0
        for k in range(v):
            u = values[k]
            if last[u] >= first[t] and first[u] <= last[t]:
                s, e = off[k], end[k]
                i = nb          # insertion by (start, end)
                while i > 0 and (bs[i - 1] > s or (bs[i - 1] == s and be[i - 1] > e)):
                    bs[i], be[i] = bs[i - 1], be[i - 1]
                    i -= 1
                bs[i], be[i] = s, e
                nb += 1
        off[v] = gap_offset(bs, be, nb, need[t]) if nb else 0
        end[v] = off[v] + need[t]
        total = max(total, end[v])
    return total


@leaf
def workspace(o0, part_ptr, part_ops, inner_ptr, inner, n_part, in_ptr, ins, out_ptr, outs,
              flags, clamp, noact, size, readers, T):
    """`xnnpack.workspace_plan(..., with_extent=False)`: (workspace bytes, regrowth). `T`:
    `ROWS` scratch rows, each at least as long as the tensors and the op outputs."""
    n_t = len(size)
    need = T[0, :n_t]
    for t in range(n_t):
        need[t] = (size[t] + ALIGN - 1) // ALIGN * ALIGN       # xnnpack.rounded
    pin, fst, rst = T[1, :n_t], T[2, :n_t], T[3, :n_t]
    fused, reuse, seen = T[4, :n_t], T[5, :n_t], T[6, :n_t]
    first, last, cons = T[7, :n_t], T[8, :n_t], T[9, :n_t]
    for row in (pin, fst, rst, fused, reuse):
        row[:] = -1
    for row in (seen, first, last, cons):
        row[:] = 0
    values, cand, off, end, bs, be = T[10], T[11], T[12], T[13], T[14], T[15]
    best, regrowth = 0, 0
    for p in range(n_part):
        inside = inner[inner_ptr[p]:inner_ptr[p + 1]]
        if best:
            total = 0
            for t in inside:
                total += need[t]
            if total <= best:
                continue    # cannot outgrow the workspace (see xnnpack.workspace_plan)
        for t in inside:
            pin[t], cons[t] = p, 0
        ops = part_ops[part_ptr[p]:part_ptr[p + 1]]
        n_cand = _lifetimes(o0, ops, p, pin, in_ptr, ins, out_ptr, outs, flags, noact, readers,
                            first, last, cons, fused, fst, seen, cand)
        _reused(cand[:n_cand], p, pin, in_ptr, ins, out_ptr, outs, flags, clamp, size, last,
                cons, fused, fst, reuse, rst)
        n_val = 0
        for t in inside:        # by rounded size, largest first; ties by tensor index
            if fst[t] != p and size[t] > 0 and rst[t] != p:
                k = n_val
                while k > 0 and (need[values[k - 1]] < need[t] or
                                 (need[values[k - 1]] == need[t] and values[k - 1] > t)):
                    values[k] = values[k - 1]
                    k -= 1
                values[k] = t
                n_val += 1
        size_p = _place(values, n_val, need, first, last, off, end, bs, be)
        if size_p > best:
            regrowth += best + 32 if best else 0        # 2 * XNN_EXTRA_BYTES
            best = size_p
    return (best + 32 if best else 0), regrowth


@leaf
def count_readers(o0, n_op, n_t, in_ptr, ins, readers, by):
    """Per tensor, into `readers[:n_t]`: 0 without readers, -1 - the op when one op reads it,
    2 for more (`by`: a scratch row)."""
    readers, by = readers[:n_t], by[:n_t]
    readers[:] = 0
    by[:] = -1
    for j in range(n_op):
        for q in range(in_ptr[o0 + j], in_ptr[o0 + j + 1]):
            t = ins[q]
            if t >= 0 and by[t] != j:
                by[t] = j
                readers[t] = -1 - j if readers[t] == 0 else 2
