"""The XNNPACK delegate's share of memory: the TFLite plan it leaves around its partitions
(`xnnpack_partition`: which ops it takes), its workspace, packed weights and indirection
buffers.

Sources: google-ai-edge/LiteRT v2.2.0 tflite/delegates/xnnpack/xnnpack_delegate.cc (the
default delegate: `TfLiteXNNPackDelegateOptionsDefault`, no weights cache, so every operator
packs its own weights; the delegate keeps the model's own buffers); google/XNNPACK at
75db3c093 (the newest snapshot before the 2.3.0 wheel; the wheel's exact pin is not in the
LiteRT tree):

- src/runtime.c `xnn_plan_memory`: values internal to a delegated partition live in one
  workspace, each `xnn_get_rounded_size` = round_up(round_up(bytes, XNN_EXTRA_BYTES=16), 64)
  (src/xnnpack/subgraph.h:566, include/xnnpack.h, src/xnnpack/common.h); the workspace adds
  2 * XNN_EXTRA_BYTES and is shared by all partitions (sized to the largest,
  `initialize_workspace_values`). Unary/binary element-wise, copy, softmax and static reshape
  outputs reuse a one-consumer input of equal size (`optimize_tensor_allocation_for_in_place_
  operations`).
- src/memory-planner.c: sort by size (largest first), place each value at the smallest gap
  between the coalesced blocks of the values whose lifetimes overlap it (the gap before the
  first block counts), else after the last.
- Packed weights and indirection buffers per operator: `xnnpack_operators`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import chain, filterfalse
from operator import attrgetter

from latpred.graph import Graph, Op
from latpred.memory.configs import OpConfigs
from latpred.memory.litert_builtin import add_temporaries, plan_kinds, tensor_bytes, tensor_kinds
from latpred.memory.litert_plan import INPLACE, PlanInput, PlanNode
from latpred.memory.xnnpack_partition import _ELEMENTWISE, _POOLS, _partitions, _read_across

EXTRA_BYTES, ALIGNMENT = 16, 64
_IN_PLACE = _ELEMENTWISE | {"SOFTMAX", "RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
_ELIDABLE = _POOLS | {"PAD", "PADV2"}           # what `_elided_source` may remove
_SPECIAL = _ELIDABLE | _IN_PLACE                # elided, or may run in place


@dataclass(frozen=True)
class XnnpackLayout:
    """The delegated model: the TFLite plan's input, per-partition internal tensors."""

    plan_input: PlanInput
    delegated_ops: frozenset[int]
    internal: tuple[tuple[int, ...], ...]   # per delegated partition: tensors inside it


def delegated_input(graph: Graph, configs: OpConfigs | None = None) -> XnnpackLayout:
    """The TFLite execution plan after the delegate replaced its partitions (one node each).

    The 2.3.0 wheel's default XNNPACK delegate allows dynamic tensors (measured: converter
    files with a RESHAPE to a run-time shape are delegated around it), so
    tflite/core/subgraph.cc `ModifyGraphWithDelegateImpl` (v2.2.0, :2535) does not prepare
    the original ops first: only the ops left to TFLite are prepared, in execution-plan order,
    and only they take tensor ids for their temporaries. Ops with a run-time output shape end
    a prepared chunk as without a delegate. `configs`: facts known per op configuration
    (`configs.batch_configs`).
    """
    kinds, stops, changed = tensor_kinds(graph)
    sizes = tensor_bytes(graph)
    names: dict[int, str] = {}
    nodes: list[PlanNode] = []
    internal: list[tuple[int, ...]] = []
    delegated: set[int] = set()
    subsets, subset_of = _partitions(graph, kinds, None if changed else configs)
    # what a partition's ops write and others read (or the graph returns) leaves it
    leaves = set(graph.outputs)
    if subset_of:
        leaves.update(_read_across(graph, subset_of))
    graph_ops = graph.ops
    next_id = len(graph.tensors)
    for is_xnn, ops in subsets:
        if not is_xnn:
            for i in ops:
                op = graph_ops[i]
                temps, next_id = add_temporaries(graph, i, next_id, sizes, kinds, names)
                nodes.append(PlanNode(op.inputs, op.outputs, (i,), op.type, temps,
                                      INPLACE.get(op.type, 0), i in stops))
            continue
        delegated.update(ops)
        # (map and chain walk the partition's ops in C)
        part = graph_ops if len(ops) == len(graph_ops) else [graph_ops[i] for i in ops]
        produced = list(chain.from_iterable(map(_OUTPUTS, part)))
        read = set(chain.from_iterable(map(_INPUTS, part)))
        read.difference_update(produced)
        leaving = leaves.intersection(produced)
        internal.append(tuple(filterfalse(leaving.__contains__, produced)))
        # Uniquefy: a NodeSubset's input and output lists are sorted (tflite/graph_info.cc:150);
        # absent optional inputs (-1) sort first and are left out
        ins = sorted(read)
        nodes.append(PlanNode(tuple(ins[bisect_left(ins, 0):]), tuple(sorted(leaving)),
                              tuple(ops), "XNNPACK"))
    pk = plan_kinds(kinds, nodes, stops)
    return XnnpackLayout(PlanInput(tuple(nodes), sizes, kinds, pk, graph.inputs, graph.outputs,
                                   names), frozenset(delegated), tuple(internal))


_INPUTS, _OUTPUTS = attrgetter("inputs"), attrgetter("outputs")


def rounded(nbytes: int) -> int:
    """`xnn_get_rounded_size`: round_up(round_up(bytes, 16), 64), which is round_up(bytes, 64)
    since 64 is a multiple of 16."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def workspace_bytes(graph: Graph, layout: XnnpackLayout) -> int:
    """The shared XNNPACK workspace: the largest partition plan + 2 * XNN_EXTRA_BYTES."""
    return workspace_plan(graph, layout, False)[0]


def workspace_plan(graph: Graph, layout: XnnpackLayout,
                   with_extent: bool = True) -> tuple[int, dict[int, int], int]:
    """The workspace size, the workspace extent per delegated op, and the regrowth: the
    runtimes are created partition by partition and each one larger than the workspace so far
    reallocates it (`initialize_workspace_values`), leaving the old buffer behind; the sum
    of the sizes outgrown."""
    best, extent, regrowth = 0, {}, 0
    sizes = layout.plan_input.sizes
    partition_ops = [n.ops for n in layout.plan_input.nodes if n.label == "XNNPACK"]
    for ops, inside in zip(partition_ops, layout.internal):
        if not with_extent and best and \
                sum((sizes[t] + ALIGNMENT - 1) // ALIGNMENT for t in inside) * ALIGNMENT <= best:
            # No block ends above the sum of the blocks placed (each goes into a gap or on
            # top of those it meets), so a partition whose values add up to no more than the
            # workspace so far changes neither its size nor the regrowth: not planned.
            continue
        size, ext = _partition_plan(graph, ops, set(inside), sizes, with_extent)
        if size > best:
            regrowth += best + 2 * EXTRA_BYTES if best else 0
        best = max(best, size)
        extent.update(ext)
    return (best + 2 * EXTRA_BYTES if best else 0), extent, regrowth


def _is_clamp(op: Op) -> bool:
    """A 1x1 pooling (its stride is 1: larger ones are declined) is defined as a clamp
    (LiteRT v2.2.0 tflite/delegates/xnnpack/xnnpack_delegate.cc `VisitAveragePool2DNode` /
    `VisitMaxPool2DNode`: `xnn_define_clamp` when filter_height == filter_width == 1)."""
    return op.type in _POOLS and tuple(op.attr("filter", (0, 0))) == (1, 1)


def _in_place(op: Op) -> bool:
    """Whether XNNPACK may reuse the op's input for its output (unary, binary, copy, softmax,
    static reshape: src/runtime.c `optimize_tensor_allocation_for_in_place_operations`)."""
    return op.type in _IN_PLACE or _is_clamp(op)


def _partition_plan(graph: Graph, ops: tuple[int, ...], inside: set[int], sizes: dict[int, int],
                    with_extent: bool = False) -> tuple[int, dict[int, int]]:
    """XNNPACK's plan of one partition's workspace: its size and, with `with_extent`, the
    highest workspace byte in use while each op runs (graph op index -> bytes)."""
    first, last, consumers, fused, candidates = _lifetimes(graph, ops, inside)
    inside = inside - fused.keys() if fused else inside
    reuse = _reused(graph, candidates, inside, fused, sizes, consumers, last)
    # Values are added in id order (the delegate defines them by tensor index) and sorted by
    # size; ties keep id order (glibc's merge-sort qsort is stable). (-bytes // 64) * 64 is
    # minus `rounded(bytes)`.
    values = sorted(((-sizes[t] // ALIGNMENT) * ALIGNMENT, t) for t in inside
                    if sizes[t] and t not in reuse)
    # Blocks placed so far, listed at every node they are live at: the blocks whose
    # lifetimes meet a value's are those listed at its nodes (a block met at several nodes
    # comes several times, which the gap search ignores).
    live: list[list[tuple[int, int]]] = [[] for _ in ops]
    size = 0
    for minus_need, t in values:
        f, l = first[t], last[t]
        if f == l:
            blocks = live[f]
        else:
            blocks = []
            for n in range(f, l + 1):
                blocks += live[n]
        offset = _find_offset(sorted(blocks), -minus_need) if blocks else 0
        block = (offset, offset - minus_need)
        for n in range(f, l + 1):
            live[n].append(block)
        if block[1] > size:
            size = block[1]
    extent = {ops[n]: max((e for _, e in live[n]), default=0)
              for n in range(len(ops))} if with_extent else {}
    return size, extent


def _lifetimes(graph: Graph, ops: tuple[int, ...], inside: set[int]
               ) -> tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int],
                          list[int]]:
    """One pass over a partition's nodes: each internal value's first and last node, its
    consumer count, the elided values (`_elided_source`: output -> the value it stands for) and the
    ops that may run in place (`_reused` decides once every consumer is counted)."""
    graph_ops = graph.ops
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    consumers: dict[int, int] = {}
    fused: dict[int, int] = {}
    candidates: list[int] = []
    for n, i in enumerate(ops):
        op = graph_ops[i]
        outs = op.outputs
        if op.type in _SPECIAL and outs and outs[0] in inside:
            source = _elided_source(graph, op) if op.type in _ELIDABLE else None
            if source is not None:
                # the node is gone: its readers read its input (already resolved: a producer
                # runs before its readers), and it keeps its input alive, as no consumer
                fused[outs[0]] = fused.get(source, source)
                for t in inside.intersection([fused.get(t, t) for t in op.inputs]):
                    last[t] = n
                continue
            if op.type in _IN_PLACE or op.type in _POOLS:
                candidates.append(i)
        for t in outs:                    # a value's life starts at its producer
            if t in inside:
                first[t] = last[t] = n
        # elided values are never read: their readers read the source. A node reading a
        # value twice (ADD(x, x)) is one consumer (src/subgraph.c
        # `xnn_subgraph_analyze_consumers_and_producers` skips repeated inputs)
        for t in inside.intersection([fused.get(t, t) for t in op.inputs] if fused
                                     else op.inputs):
            last[t] = n
            consumers[t] = consumers.get(t, 0) + 1
    return first, last, consumers, fused, candidates


def _elided_source(graph: Graph, op: Op) -> int | None:
    """The value an elided node's output stands for (its input 0), or None when XNNPACK's
    subgraph rewriting keeps the node (google/XNNPACK 75db3c093 src/subgraph.c):

    - a static zero pad of H and W before a convolution becomes the convolution's padding
      (`xnn_subgraph_fusion`);
    - a clamp to (-inf, +inf), which is what a 1x1 pooling without activation is defined as
      (`optimize_common_subgraphs_spurious_clamps` / `short_circuit`; only internal outputs
      here: an external one renames the producer's output instead)."""
    if op.type in ("PAD", "PADV2"):
        readers = graph.consumers_of(op.outputs[0])
        if len(readers) == 1 and graph.ops[readers[0]].type in ("CONV_2D",
                                                                "DEPTHWISE_CONV_2D"):
            return op.inputs[0]
    elif is_noop_clamp(op):
        return op.inputs[0]
    return None


def is_noop_clamp(op: Op) -> bool:
    """A 1x1 pooling without activation: a clamp to (-inf, +inf)."""
    return _is_clamp(op) and op.attr("activation", "NONE") == "NONE"


def _reused(graph: Graph, candidates: list[int], inside: set[int], fused: dict[int, int],
            sizes: dict[int, int], consumers: dict[int, int],
            last: dict[int, int]) -> dict[int, int]:
    """In-place outputs -> the value whose memory they take (a one-consumer input of equal
    size), extending that value's lifetime `last` to theirs. `candidates`: the partition's
    ops, in order, of a type that may run in place, with an internal output."""
    reuse: dict[int, int] = {}
    for i in candidates:
        op = graph.ops[i]
        out = op.outputs[0]
        if out not in inside or consumers.get(out) != 1 or not _in_place(op):
            continue
        need = sizes[out]
        for t in [fused.get(t, t) for t in op.inputs] if fused else op.inputs:
            if t in inside and consumers.get(t) == 1 and sizes[t] == need:
                root = t
                while root in reuse:
                    root = reuse[root]
                reuse[out] = root
                last[root] = max(last[root], last[out])
                break
    return reuse


def _find_offset(blocks: list[tuple[int, int]], need: int) -> int:
    """memory-planner.c `find_value_alloc_offset` over blocks sorted by start: the smallest
    gap between the coalesced blocks that holds `need` bytes (the gap before the first block
    counts), else the end of the last. One pass: a gap is known once the next block starts
    past the coalesced run so far."""
    if not blocks:
        return 0
    it = iter(blocks)
    start, end = next(it)
    best_gap, offset = (start, 0) if start >= need else (None, 0)
    for s, e in it:
        if s > end:
            gap = s - end
            if gap >= need and (best_gap is None or gap < best_gap):
                best_gap, offset = gap, end
            end = e
        elif e > end:
            end = e
    return offset if best_gap is not None else end
