"""The GPU delegate's buffer plan over one delegated part, compiled (numba).

`gpu_delegate` flattens a part's fused nodes (after `wide_chains`) into arrays: each node's
type code, group code, thin-chain step bytes (`gpu_thin`), inputs and outputs (CSR over
runtime tensor ids, the delegate's own tensors negative). `plan_part` then does, in one call,
what ML Drift does before it allocates (google-ai-edge/ml-drift @ 48cfed7e, see
`gpu_delegate`'s docstring for the files):
- joins thin pointwise chains (ThinPointwiseFuser) into one node whose inner tensors vanish;
- orders the values as the delegate's ValueIds (the graph's tensors by index, then each
  resolved grouped convolution's group inputs and outputs in turn, then the kernels' own
  tensors, then the partial results the wide chains made);
- takes each non-constant tensor's usage interval (CollectUsageInformation: the part's inputs
  at node 0, its outputs one past the last node);
- packs the records into shared buffers (`gpu_assign.best_sizes`, GREEDY_BEST).
`part_intermediates` runs it over every part of a batch of graphs (memory-aware NAS).

Tensors are indexed locally: a graph's own tensor t as t, the delegate's tensor -k as
n_graph + k - 1 (`_local`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from latpred.memory.compiled import leaf
from latpred.memory.gpu_assign import best_sizes

CONV, DWCONV = 1, 2        # node type codes: the kinds a thin chain's steps can be (0: other)
GROUP_SPLIT, GROUP_CONV = 1, 2   # group codes: a grouped convolution's split, one group's conv
THIN_MAX_CONVS = 3         # ThinPointwiseFuser's max_convs_count
THIN_MAX_BUFFER = 1024 * 3  # its max_buffer_size: bytes of weights and biases together


def group_code(part: str) -> int:
    """A node's role in a resolved grouped convolution, from its `part`: the group codes above
    (0 for a node in none, and for the groups' concatenation)."""
    if not part:
        return 0
    if part == "group_split":
        return GROUP_SPLIT
    return GROUP_CONV if part.startswith("group") and part != "group_concat" else 0


@leaf
def _local(t, n_graph):
    return t if t >= 0 else n_graph - 1 - t


@njit
def thin_chains(ntype, thin_first, thin_next, in_ptr, ins, out_ptr, outs, n_graph, n_local,
                graph_out):
    """The first node of each node after TryThinPointwiseFuser (a joined chain covers its
    nodes up to the next start): a depthwise or any convolution, then 1x1 convolutions, each
    reading the one output of the step before as its only reader (not a graph output); at most
    THIN_MAX_CONVS steps and THIN_MAX_BUFFER bytes of weights, at least 2. `thin_first` /
    `thin_next`: a node's weight bytes as a chain's first / later step, -1 where it cannot be
    one."""
    n = len(ntype)
    readers = np.zeros(n_local, np.int64)
    for p in range(len(ins)):
        readers[_local(ins[p], n_graph)] += 1
    starts = np.empty(n, np.int64)
    m = 0
    k = 0
    while k < n:
        starts[m] = k
        m += 1
        if k + 1 >= n or ntype[k + 1] != CONV or ntype[k] == 0:
            k += 1
            continue
        length, total, j = 0, 0, k
        while j < n and length < THIN_MAX_CONVS:
            if length > 0:
                if out_ptr[j] - out_ptr[j - 1] != 1 or in_ptr[j + 1] == in_ptr[j]:
                    break
                prev = outs[out_ptr[j - 1]]
                if ins[in_ptr[j]] != prev or readers[_local(prev, n_graph)] != 1 or \
                        (prev >= 0 and graph_out[prev]):
                    break
            step = thin_first[j] if length == 0 else thin_next[j]
            if step < 0 or total + step > THIN_MAX_BUFFER:
                break
            length += 1
            total += step
            j += 1
        k = j if length >= 2 else k + 1
    return starts[:m]


@leaf
def _use(first, last, t, k):
    if first[t] == -1:
        first[t] = k
    last[t] = k


@njit(cache=True)
def plan_part(ntype, group, thin_first, thin_next, in_ptr, ins, out_ptr, outs, n_graph,
              size, const, graph_out, outside, neg_size, neg_late):
    """One part's plan: `part_records` and the shared buffers' sizes."""
    starts, order, rec_size, rec_first, rec_last = part_records(
        ntype, group, thin_first, thin_next, in_ptr, ins, out_ptr, outs, n_graph, size, const,
        graph_out, outside, neg_size, neg_late)
    return starts, order, rec_size, rec_first, rec_last, best_sizes(rec_size, rec_first,
                                                                     rec_last)


@njit
def part_records(ntype, group, thin_first, thin_next, in_ptr, ins, out_ptr, outs, n_graph,
                 size, const, graph_out, outside, neg_size, neg_late):
    """One part's usage records: (starts of the joined nodes, then per record in ValueId order:
    local tensor, size, first node, last node).

    Per graph tensor: `size` (bytes on the GPU), `const`, `graph_out`, `outside` (read by an
    op outside this part); per delegate tensor -k at k - 1: `neg_size`, `neg_late` (a partial
    result `wide_chains` made: ranked after every other value)."""
    n_local = n_graph + len(neg_size)
    starts = thin_chains(ntype, thin_first, thin_next, in_ptr, ins, out_ptr, outs, n_graph,
                         n_local, graph_out)
    m = len(starts)
    ends = np.empty(m, np.int64)
    ends[:m - 1] = starts[1:]
    if m:
        ends[m - 1] = len(ntype)
    # a joined node reads its steps' inputs but the inner tensors, writes its last step's
    inner = np.zeros(n_local, np.bool_)
    written = np.zeros(n_local, np.bool_)
    for j in range(m):
        for k in range(starts[j], ends[j]):
            for p in range(out_ptr[k], out_ptr[k + 1]):
                t = _local(outs[p], n_graph)
                if k < ends[j] - 1:
                    inner[t] = True
                else:
                    written[t] = True
    first = np.full(n_local, -1, np.int64)
    last = np.full(n_local, -1, np.int64)
    for p in range(len(ins)):        # the part's inputs, at node 0
        t = ins[p]
        if t >= 0 and not const[t] and not written[t] and not inner[t]:
            _use(first, last, t, 0)
    for j in range(m):
        for k in range(starts[j], ends[j]):
            for p in range(in_ptr[k], in_ptr[k + 1]):
                t = _local(ins[p], n_graph)
                if not inner[t] and not (t < n_graph and const[t]):
                    _use(first, last, t, j)
        k = ends[j] - 1
        for p in range(out_ptr[k], out_ptr[k + 1]):
            _use(first, last, _local(outs[p], n_graph), j)
    for t in range(n_graph):         # its outputs, one past the last node
        if written[t] and (graph_out[t] or outside[t]):
            _use(first, last, t, m)
    order = _value_order(starts, ends, group, in_ptr, ins, out_ptr, outs, n_graph, n_local,
                         neg_late, first)
    rec_size = np.empty(len(order), np.int64)
    for r in range(len(order)):
        t = order[r]
        rec_size[r] = size[t] if t < n_graph else neg_size[t - n_graph]
    return starts, order, rec_size, first[order], last[order]


@njit
def _value_order(starts, ends, group, in_ptr, ins, out_ptr, outs, n_graph, n_local, late,
                 first):
    """The used tensors in the delegate's ValueId order (its usage records are a
    std::map<ValueId, ...>, and the greedy assignments break ties by record order): the
    graph's tensors by index; then, per grouped convolution's split, each group's input and
    the outputs of the (last) group convolution reading it (LiteRT
    tflite/delegates/gpu/common/model_builder.cc, ResolveGroupedConvolution: conv_src[i],
    conv_dst[i]); then the joined nodes' other outputs in node order (Winograd's tensors, made
    when the GPU model is built); then the wide chains' partial results."""
    ranked = np.zeros(n_local, np.bool_)
    order = np.empty(n_local, np.int64)
    n = 0
    for t in range(n_graph):
        if first[t] != -1:
            order[n] = t
            n += 1
    m = len(starts)
    for j in range(m):
        if group[starts[j]] != GROUP_SPLIT or ends[j] - starts[j] != 1:
            continue
        k = starts[j]
        for p in range(out_ptr[k], out_ptr[k + 1]):
            t = outs[p]
            lt = _local(t, n_graph)
            if lt >= n_graph:        # the graph's tensors have their ValueIds already
                if late[lt - n_graph]:
                    continue
                n = _rank(lt, ranked, order, n, first)
            reader = -1
            for i in range(m):      # the last group convolution reading it
                c = starts[i]
                if group[c] == GROUP_CONV and in_ptr[c + 1] > in_ptr[c] and ins[in_ptr[c]] == t:
                    reader = c
            if reader >= 0:
                for q in range(out_ptr[reader], out_ptr[reader + 1]):
                    u = _local(outs[q], n_graph)
                    if u >= n_graph:
                        n = _rank(u, ranked, order, n, first)
    for pass_late in (False, True):
        for j in range(m):
            k = ends[j] - 1
            for p in range(out_ptr[k], out_ptr[k + 1]):
                lt = _local(outs[p], n_graph)
                if lt >= n_graph and late[lt - n_graph] == pass_late:
                    n = _rank(lt, ranked, order, n, first)
    return order[:n]


@leaf
def _rank(t, ranked, order, n, first):
    """Give delegate tensor t the next ValueId if it has none; only used ones become records."""
    if not ranked[t]:
        ranked[t] = True
        if first[t] != -1:
            order[n] = t
            n += 1
    return n


@njit(cache=True)
def part_arguments(p, part_nodes, part_graph, g_tens, g_neg, ntype, group, thin_first,
                   thin_next, in_ptr, ins, out_ptr, outs, size, const, graph_out, outside,
                   neg_size, neg_late):
    """`plan_part`'s arguments for part p of a batch (`gpu_flat.FlatParts.arrays`). Parts:
    their nodes `part_nodes[p]:part_nodes[p + 1]` and graph; graphs: their tensors
    `g_tens[g]:g_tens[g + 1]` and delegate tensors `g_neg[g]:g_neg[g + 1]`; `in_ptr` /
    `out_ptr` hold absolute offsets into `ins` / `outs`."""
    a, b = part_nodes[p], part_nodes[p + 1]
    g = part_graph[p]
    t0, t1, n0, n1 = g_tens[g], g_tens[g + 1], g_neg[g], g_neg[g + 1]
    i0, o0 = in_ptr[a], out_ptr[a]
    return (ntype[a:b], group[a:b], thin_first[a:b], thin_next[a:b], in_ptr[a:b + 1] - i0,
            ins[i0:in_ptr[b]], out_ptr[a:b + 1] - o0, outs[o0:out_ptr[b]], t1 - t0,
            size[t0:t1], const[t0:t1], graph_out[t0:t1], outside[t0:t1], neg_size[n0:n1],
            neg_late[n0:n1])


@njit(cache=True)
def part_intermediates(part_nodes, part_graph, g_tens, g_neg, ntype, group, thin_first,
                       thin_next, in_ptr, ins, out_ptr, outs, size, const, graph_out, outside,
                       neg_size, neg_late):
    """`plan_part`'s buffer total for every part of a batch (`part_arguments`)."""
    out = np.zeros(len(part_graph), np.int64)
    for p in range(len(part_graph)):
        _, _, rec_size, rec_first, rec_last = part_records(*part_arguments(
            p, part_nodes, part_graph, g_tens, g_neg, ntype, group, thin_first, thin_next,
            in_ptr, ins, out_ptr, outs, size, const, graph_out, outside, neg_size, neg_late))
        out[p] = best_sizes(rec_size, rec_first, rec_last).sum()
    return out
