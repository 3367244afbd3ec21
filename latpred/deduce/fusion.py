"""GPU kernel fusion: Algorithm 3.1 of the operation-wise paper (the delegate's MergeNodes).

Works on `GpuNode`s, the delegate's kernels before fusion (one per op, three for a Winograd
convolution, ...), in execution order. A node absorbs its successor when the node has exactly one
output tensor, the successor is that tensor's only consumer, takes it as its first input, has one
output, is linkable (element-wise), has all its other inputs ready, and writes a tensor of the
same shape. Chains fuse repeatedly. ML Drift first fuses element-wise ops with each other
(`merge_elementwise_nodes`).

Sources: tensorflow/lite/delegates/gpu/common/gpu_model.cc MergeNodes (TFLite 2.9 era; the same
loop is google-ai-edge/LiteRT tflite/delegates/gpu/common/gpu_model.cc @ 14906c95) and
google-ai-edge/ml-drift ml_drift/common/merge_nodes.cc @ 393e0e9b (LinkNodes,
MergeElementwiseNodes).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from itertools import chain, repeat
from operator import attrgetter
from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class GpuNode:
    """One delegate kernel while fusion runs (mutable working state, never returned).

    `inputs`/`outputs` are runtime tensor ids (negative ids are the delegate's own intermediate
    tensors); `ops` lists graph op indices, the deciding op first. Tuples, replaced as nodes
    fuse: a node is made per op and candidate, and most never change.
    """

    type: str
    ops: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    out_shape: tuple[int, ...]
    linkable: bool
    rule: str
    part: str = ""


def merge_nodes(nodes: list[GpuNode], blocked: set[int], first_output: bool = False
                ) -> list[GpuNode]:
    """MergeNodes / LinkNodes: link each node's single consumer into it while the rules allow.

    `blocked` holds tensors that must stay materialised (read outside the delegate or graph
    outputs): a node writing one is not merged (LiteRT gpu_model.cc: "Don't merge node if it has
    multiple outputs or a graph output"). With `first_output` (ML Drift), a node with several
    outputs links through its first one (ml_drift/common/merge_nodes.cc @ 48cfed7e, LinkNodes:
    `out_index = 0`, no check on the output count), so a SPLIT takes in the element-wise op
    that reads its first part.

    Nodes are visited in order and only later, live nodes are linked, so each tensor's consumers
    are listed once: a consumer merged into an earlier node is never looked at again. Only the
    linkable ones are listed: a node is linked when exactly one later, live node reads its
    output, and that one is linkable, so a later reader that is not (such nodes are never
    linked, so always live) ends the chain; for those the last one's index is enough.
    """
    consumers: dict[int, list[tuple[int, int]]] = {}   # of linkable nodes
    for i, node in enumerate(nodes):
        if node.linkable:
            for k, t in enumerate(node.inputs):
                users = consumers.get(t)
                if users is None:
                    consumers[t] = [(i, k)]
                else:
                    users.append((i, k))
    read_last = {t: i for i, n in enumerate(nodes) if not n.linkable for t in n.inputs}
    producer = {t: i for i, n in enumerate(nodes) for t in n.outputs}
    alive = [True] * len(nodes)
    for i, node in enumerate(nodes):
        if not alive[i]:
            continue
        while (first_output or len(node.outputs) == 1) and node.outputs[0] not in blocked:
            if read_last.get(node.outputs[0], -1) > i:   # a later reader that is not linkable
                break
            users = consumers.get(node.outputs[0], ())
            if len(users) != 1:   # the common case, one consumer, without a list
                users = [c for c in users if c[0] > i and alive[c[0]]]
                if len(users) != 1:
                    break
            j, k = users[0]
            if k != 0 or j <= i or not alive[j]:
                break
            nxt = nodes[j]
            if not (nxt.linkable and len(nxt.outputs) == 1 and nxt.out_shape == node.out_shape
                    and max(map(producer.get, nxt.inputs, repeat(-1))) <= i):  # all ready
                break
            _absorb(node, nxt)
            producer[nxt.outputs[0]] = i
            alive[j] = False
    return [n for n, a in zip(nodes, alive) if a]


def _absorb(node: GpuNode, nxt: GpuNode) -> None:
    node.ops += nxt.ops
    node.inputs += nxt.inputs[1:]
    node.outputs = nxt.outputs + node.outputs[1:]  # the first output is the one linked
    node.out_shape = nxt.out_shape


def merge_elementwise_nodes(nodes: list[GpuNode], blocked: set[int]) -> list[GpuNode]:
    """ML Drift's MergeElementwiseNodes: fuse element-wise ops with element-wise ops first.

    TYPE_0: elem0 -> root. TYPE_1/2: a two-input root reading a tensor and a linkable op of that
    same tensor (x and sigmoid(x) for swish). TYPE_3: a two-input root of two linkable ops of one
    tensor. The fused node keeps the position of its first member, and the scan goes on after it.

    Fused-away nodes are marked dead rather than deleted, and a fusion updates the use counts
    and producers it changes rather than recounting every node after each fusion.
    """
    alive = [True] * len(nodes)
    uses = Counter(chain.from_iterable(map(attrgetter("inputs"), nodes)))
    for t in blocked:
        uses[t] += 1  # read outside the delegate: it must survive
    firsts = [n.outputs[0] if n.outputs else None for n in nodes]
    # tensor -> the last live node whose first output it is; the list of them all (`writers`)
    # is made at the first fusion, from the nodes as they were (most graphs have none).
    producer = {t: i for i, t in enumerate(firsts) if t is not None}
    writers: dict[int, list[int]] | None = None
    # The nodes that can be roots, and the simple ones (linkable, one input, one output), one
    # of which every pattern fuses into its root: neither changes as nodes fuse (a kept node is
    # simple and stays so), so a root fed by no simple node is passed over.
    roots = [r for r, n in enumerate(nodes)
             if r and n.linkable and len(n.outputs) == 1 and len(n.inputs) in (1, 2)]
    simple = [n.linkable and len(n.inputs) == 1 and len(n.outputs) == 1 for n in nodes]
    at = 0
    while at < len(roots):
        r = roots[at]
        at += 1
        root = nodes[r]
        p, q = producer.get(root.inputs[0]), producer.get(root.inputs[-1])
        if not (alive[r] and ((p is not None and simple[p]) or (q is not None and simple[q]))):
            continue
        prev = [p] if len(root.inputs) == 1 else [p, q]
        fused = _fuse_pattern(nodes, r, prev, uses, producer)
        if fused is None:
            continue
        keep, drop = fused
        if writers is None:
            writers = {}
            for i, t in enumerate(firsts):
                if t is not None:
                    writers.setdefault(t, []).append(i)
        # The kept node wrote the root input it fed; it now writes the root's output.
        _rewrite(writers, producer, keep, (root.inputs[prev.index(keep)],), root.outputs)
        for d in drop:
            alive[d] = False
            for t in nodes[d].inputs:
                uses[t] -= 1
            _rewrite(writers, producer, d, nodes[d].outputs[:1], ())
        at = bisect_left(roots, keep + 1)   # the scan goes on after the kept node
    return nodes if writers is None else [n for n, a in zip(nodes, alive) if a]


def _rewrite(writers: dict[int, list[int]], producer: dict[int, int], i: int,
             old: tuple[int, ...], new: tuple[int, ...]) -> None:
    """Node `i`'s first output is now `new` instead of `old` (each empty or one tensor)."""
    for t in old:
        writers[t].remove(i)
    for t in new:
        insort(writers.setdefault(t, []), i)
    for t in (*old, *new):
        if writers[t]:
            producer[t] = writers[t][-1]
        else:
            del producer[t]


def _simple(node: GpuNode) -> bool:
    return node.linkable and len(node.inputs) == 1 and len(node.outputs) == 1


def _fuse_pattern(nodes: list[GpuNode], r: int, prev: list[int | None],
                  uses: Counter, producer: dict[int, int]) -> tuple[int, list[int]] | None:
    """Apply the first matching TYPE_0..3 pattern to root `r` in place; (kept index, dropped
    indices)."""
    root = nodes[r]
    if len(root.inputs) == 1:
        p = prev[0]
        if p is None or not _simple(nodes[p]) or uses[root.inputs[0]] != 1:
            return None
        _chain(nodes[p], root)
        return p, [r]
    if None in prev or prev[0] == prev[1]:
        return None
    a, b = nodes[prev[0]], nodes[prev[1]]
    parent = {i: producer.get(nodes[i].inputs[0]) if nodes[i].inputs else None for i in prev}
    if _simple(a) and not b.linkable and len(b.outputs) == 1 and parent[prev[0]] == prev[1] \
            and uses[root.inputs[0]] == 1:  # TYPE_1
        _chain(a, root)
        return prev[0], [r]
    if not a.linkable and _simple(b) and len(a.outputs) == 1 and parent[prev[1]] == prev[0] \
            and uses[root.inputs[1]] == 1:  # TYPE_2
        _chain(b, root)
        return prev[1], [r]
    if _simple(a) and _simple(b) and parent[prev[0]] is not None \
            and parent[prev[0]] == parent[prev[1]] \
            and uses[root.inputs[0]] == 1 and uses[root.inputs[1]] == 1:  # TYPE_3
        first, second = sorted(prev)
        keep = nodes[first]
        other = nodes[second]
        keep.ops += other.ops
        _chain(keep, root)
        return first, [second, r]
    return None


def _chain(first: GpuNode, root: GpuNode) -> None:
    """`first` now also computes `root`: it reads first's input and writes root's output."""
    first.ops += root.ops
    if root.type != first.type:
        first.type = "elementwise"  # an activation fused with arithmetic is plain element-wise
    first.outputs = root.outputs
    first.out_shape = root.out_shape
