"""The GPU delegate's parts as flat arrays, for the compiled plan (`gpu_compiled`).

Memory-aware NAS plans every candidate: in Python, the plan's passes over the fused nodes
(thin chains, ValueIds, usage, boundary) cost ~0.3 ms a graph, a third of the latency
prediction. Here each graph's delegated parts (`latpred.deduce.gpu.delegated_nodes`, after
`wide_chains`) become arrays in one Python walk over their nodes, and all parts
of a batch are planned in one numba call. `gpu_delegate.plan_delegate` plans one graph through
the same arrays, so the rules exist once.

Tensor sizes and constness come from the latency batch's interned tensors where there is one
(`FeatureBatch.tensor_ids`), else from the graphs' tensors (`held_bytes`).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import lru_cache
from itertools import chain, repeat
from math import prod
from operator import attrgetter, itemgetter
from typing import Any, Sequence

import numpy as np

from latpred.deduce.fusion import GpuNode
from latpred.deduce.gpu import delegated_nodes
from latpred.deduce.optypes import bhwc, conv_groups
from latpred.graph import _ITEMSIZE, Graph
from latpred.memory.arena import align_up
from latpred.memory import gpu_compiled as gc
from latpred.memory.flat_arrays import _ptr, interned_ids, model_bytes, op_offsets
from latpred.memory.gpu_thin import THIN_TYPES, thin_step
from latpred.memory.gpu_weights import ELEMENT_BYTES, weight_bytes

_INPUTS, _OUTPUTS = attrgetter("inputs"), attrgetter("outputs")
_TENSORS, _TYPE, _CONST = attrgetter("tensors"), attrgetter("type"), attrgetter("is_constant")
_PART = attrgetter("part")
_WIDE_TYPES = frozenset({"concat", "split"})     # what `wide_chains` can break up
_CODE = {"conv2d": gc.CONV, "dwconv2d": gc.DWCONV}


@lru_cache(maxsize=1 << 14)
def tensor_bytes(shape, precision: str) -> int:
    """A tensor's bytes as the delegate stores it (BUFFER): B x H x W x ceil(C/4) x 4 elements
    of the precision's type; 0 for five or more dimensions, which no delegated op has
    (`deduce.gpu_support` refuses them), so no plan reads."""
    if len(shape) > 4:
        return 0
    b, h, w, c = bhwc(shape)
    return b * h * w * align_up(c, 4) * ELEMENT_BYTES[precision]


def wide_chains(graph: Graph, nodes: list[GpuNode], shapes: dict, late: list, gpu
                ) -> list[GpuNode]:
    """ML Drift's GPU model builder binds every tensor of a kernel as a storage buffer or
    texture, so it breaks a concatenation or split wider than the device's limits into a chain
    (google-ai-edge/ml-drift ml_drift/common/gpu_model_builder.cc @ 48cfed7e):
    - GpuModelBuilder::Concat: at most max(2, min(storage textures, storage buffers) - 4) inputs
      a node; node g > 0 reads the previous node's partial result and the next inputs;
    - GpuModelBuilder::Split: a node has at most `storage buffers - 2` outputs and a rest tensor
      ("S -> [D0, D1, D2, DRest] and DRest --> [D3, ..., DK]") while more than
      `storage buffers - 1` outputs remain.
    The partial results and rests are new tensors, made when the GPU model is built: `shapes`
    gets them, and `late` in the order made (their ValueIds come after every other value). The
    split's nodes come where the split was, the concatenation's where it was. The latency
    lowering keeps one kernel each."""
    buffers, textures = gpu.storage_buffers_per_stage, gpu.storage_textures_per_stage
    if buffers is None or textures is None or _WIDE_TYPES.isdisjoint(map(_TYPE, nodes)):
        return nodes
    max_inputs = max(2, min(textures, buffers) - 4)
    max_outputs = buffers - 1
    # a node joins at most its own inputs (`_concat_sources`): the common case is settled by
    # two C-level passes over the nodes
    if (max(map(len, map(_INPUTS, nodes))) <= max_inputs
            and max(map(len, map(_OUTPUTS, nodes))) <= max_outputs):
        return nodes
    if not any(len(n.outputs) > max_outputs if n.type == "split" else
               _concat_sources(graph, n, max_inputs) > max_inputs
               for n in nodes if n.type in _WIDE_TYPES):
        return nodes
    # below every delegate tensor of the graph (`shapes` holds them all, of every part)
    fresh = itertools.count(min([0, *shapes, *(t for n in nodes for t in n.outputs)]) - 1, -1)

    def new_tensor(like: int, channels: int) -> int:
        t = next(fresh)
        b, h, w, _ = bhwc(shapes[like] if like < 0 else graph.tensors[like].shape)
        shapes[t] = (b, h, w, channels)
        late.append(t)
        return t

    def channels(ts) -> int:
        return sum(bhwc(shapes[t] if t < 0 else graph.tensors[t].shape)[3] for t in ts)

    out: list[GpuNode] = []
    for n in nodes:
        k = _concat_sources(graph, n, max_inputs) if n.type == "concat" else 0
        if k > max_inputs:
            # the inputs after the sources are read by ops linked in, which run in the last node
            ins, linked, acc = list(n.inputs[:k]), n.inputs[k:], []
            while ins:
                srcs, ins = acc + ins[:max_inputs], ins[max_inputs:]
                dst = new_tensor(srcs[-1], channels(srcs)) if ins else n.outputs[0]
                out.append(replace(n, inputs=tuple(srcs) if ins else (*srcs, *linked),
                                   outputs=(dst,), ops=n.ops[:1] if ins else n.ops))
                acc = [dst]
        elif n.type == "split" and len(n.outputs) > max_outputs:
            src, outs = n.inputs, list(n.outputs)
            while len(outs) > max_outputs:
                head, outs = outs[:buffers - 2], outs[buffers - 2:]
                rest = new_tensor(outs[0], channels(outs))
                out.append(replace(n, inputs=src, outputs=(*head, rest), ops=n.ops[:1]))
                src = (rest,)
            out.append(replace(n, inputs=src, outputs=tuple(outs)))
        else:
            out.append(n)
    return out


def _concat_sources(graph: Graph, node: GpuNode, at_most: int) -> int:
    """How many of a concatenation node's inputs it joins (the others are read by linked ops):
    a resolved grouped convolution's groups, or the CONCATENATION's non-constant inputs (its
    input count where that is `at_most` or fewer: then so are the sources)."""
    op = graph.ops[node.ops[0]]
    if node.part == "group_concat":
        return conv_groups(graph, op)
    if len(op.inputs) <= at_most:
        return len(op.inputs)
    return sum(1 for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant)


def output_shapes(graph: Graph, node: GpuNode, shapes: dict) -> list[tuple[int, ...]]:
    """The shape of each tensor a node writes. A grouped convolution's split writes one slice
    of its input per group (`out_shape` is the convolution's output there)."""
    if node.part != "group_split":
        return [node.out_shape] * len(node.outputs)
    src = node.inputs[0]
    b, h, w, c = bhwc(shapes[src] if src < 0 else graph.tensors[src].shape)
    return [(b, h, w, c // len(node.outputs))] * len(node.outputs)


class FlatParts:
    """All delegated parts of a batch of graphs in a row (`gpu_compiled.part_intermediates`'
    arguments), and each graph's weights the kernels hold (`packed`) and constants
    (`constant`)."""

    def __init__(self, target: Any, precision: str) -> None:
        self.target, self.precision, self.gpu = target, precision, target.device.gpu
        self.ntype: list[int] = []
        # sparse, (node, value): most nodes are in no grouped convolution and no thin chain
        self.group: list[tuple[int, int]] = []
        self.thin_first: list[tuple[int, int]] = []
        self.thin_next: list[tuple[int, int]] = []
        self.n_in: list[int] = []
        self.ins: list[int] = []
        self.n_out: list[int] = []
        self.outs: list[int] = []
        self.part_nodes, self.part_graph = [0], []
        self.neg_size: list[int] = []
        self.neg_late: list[bool] = []
        self.g_neg = [0]
        self.outside: list[tuple[int, int]] = []     # (graph, tensor) read outside its part
        self.packed: list[int] = []
        self.constant: list[int] = []
        self.parts: list[list[tuple]] = []           # per graph: (ops, nodes) of each part

    def add(self, graph: Graph) -> None:
        """Flatten one graph's delegated parts."""
        g = len(self.packed)
        parts = delegated_nodes(graph, self.target)
        shapes: dict[int, tuple] = {}        # the delegate's own tensors
        for _, nodes in parts:
            if min(chain.from_iterable(map(_OUTPUTS, nodes)), default=0) >= 0:
                continue
            for n in nodes:
                if n.outputs and min(n.outputs) < 0:  # Winograd's tensors, a split's groups
                    for t, shape in zip(n.outputs, output_shapes(graph, n, shapes)):
                        if t < 0:
                            shapes[t] = shape
        late: list[int] = []
        parts = [(ops, wide_chains(graph, nodes, shapes, late, self.gpu))
                 for ops, nodes in parts]
        packed = constant = 0
        for ops, nodes in parts:
            self._add_nodes(graph, nodes)
            self.part_nodes.append(len(self.ntype))
            self.part_graph.append(g)
            if len(ops) != len(graph.ops):          # another part or the CPU reads some
                self._add_outside(graph, g, ops, nodes)
            kernel_args, constants = weight_bytes(graph, nodes, self.precision, self.gpu)
            packed += kernel_args
            constant += constants
        n_neg = -min(shapes, default=0)
        late_set = set(late)
        self.neg_size += [tensor_bytes(shapes[-k], self.precision) if -k in shapes else 0
                          for k in range(1, n_neg + 1)]
        self.neg_late += [-k in late_set for k in range(1, n_neg + 1)]
        self.g_neg.append(len(self.neg_size))
        self.packed.append(packed)
        self.constant.append(constant)
        self.parts.append(parts)

    def _add_nodes(self, graph: Graph, nodes: list[GpuNode]) -> None:
        base = len(self.ntype)
        types = list(map(_TYPE, nodes))
        self.ntype += map(_CODE.get, types, repeat(0))
        parts = list(map(_PART, nodes))      # "" but in a resolved grouped convolution
        if any(parts):
            self.group += [(base + k, gc.group_code(p)) for k, p in enumerate(parts) if p]
        # thin chain steps only where a chain can start or go on: a convolution or depthwise
        # node followed by a convolution node, the latter only after a first or later step
        # (thin_chains reads no other)
        later = -1
        for k in [k for k, (a, b) in enumerate(zip(types, types[1:]))
                  if b == "conv2d" and a in THIN_TYPES]:
            first = thin_step(graph, nodes[k], True, self.precision)
            if first is not None:
                self.thin_first.append((base + k, first))
            if first is not None or later == k:
                step = thin_step(graph, nodes[k + 1], False, self.precision)
                if step is not None:
                    self.thin_next.append((base + k + 1, step))
                    later = k + 1
        self.n_in += map(len, map(_INPUTS, nodes))
        self.ins += chain.from_iterable(map(_INPUTS, nodes))
        self.n_out += map(len, map(_OUTPUTS, nodes))
        self.outs += chain.from_iterable(map(_OUTPUTS, nodes))

    def _add_outside(self, graph: Graph, g: int, ops, nodes: list[GpuNode]) -> None:
        """The part's tensors an op outside it reads (the part's outputs besides the graph's)."""
        opset, consumers = set(ops), graph.consumers
        for t in {t for n in nodes for t in n.outputs if t >= 0}:
            if any(c not in opset for c in consumers.get(t, ())):
                self.outside.append((g, t))

    def arrays(self, graphs: Sequence[Graph], size: np.ndarray, const: np.ndarray,
               g_tens: np.ndarray) -> tuple[np.ndarray, ...]:
        """`gpu_compiled.part_intermediates`' arguments (`size`, `const`, `g_tens`:
        `held_bytes`)."""
        graph_out = np.zeros(len(size), np.bool_)
        graph_out[np.fromiter(chain.from_iterable(
            (g_tens[g] + t for t in graph.outputs) for g, graph in enumerate(graphs)),
            np.int64)] = True
        outside = np.zeros(len(size), np.bool_)
        for g, t in self.outside:
            outside[g_tens[g] + t] = True
        i64 = np.int64
        n = len(self.ntype)
        return (np.array(self.part_nodes, i64), np.array(self.part_graph, i64), g_tens,
                np.array(self.g_neg, i64), np.array(self.ntype, i64),
                _dense(self.group, n, 0), _dense(self.thin_first, n, -1),
                _dense(self.thin_next, n, -1),
                _ptr(self.n_in), np.array(self.ins, i64), _ptr(self.n_out),
                np.array(self.outs, i64), size, const, graph_out, outside,
                np.array(self.neg_size, i64), np.array(self.neg_late, np.bool_))


def _dense(pairs: list[tuple[int, int]], n: int, fill: int) -> np.ndarray:
    """(index, value) pairs as an array of n, `fill` elsewhere."""
    out = np.full(n, fill, np.int64)
    if pairs:
        at, values = zip(*pairs)
        out[list(at)] = values
    return out


def held_bytes(graphs: Sequence[Graph], batch: Any, precision: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each tensor's bytes where it is held, constness, and each graph's first tensor (all
    graphs in a row): a constant's bytes in the model (`model_bytes` reads only those), the
    others' on the GPU (the plan reads only those). From the batch's interned tensors where
    there is one."""
    def held(shape, dtype, const) -> int:
        return prod(shape) * _ITEMSIZE[dtype] if const else tensor_bytes(shape, precision)

    if batch is not None and batch.tensor_ids:
        keys = batch.tensor_keys        # (shape, dtype, is_constant, value, quantized)
        key_size = np.fromiter((held(*k[:3]) for k in keys), np.int64, len(keys))
        key_const = np.fromiter(map(itemgetter(2), keys), np.bool_, len(keys))
        ids, g_tens = interned_ids(batch)
        return key_size[ids], key_const[ids], g_tens
    tensors = list(chain.from_iterable(map(_TENSORS, graphs)))
    size = np.fromiter((held(t.shape, t.dtype, t.is_constant) for t in tensors), np.int64,
                       len(tensors))
    const = np.fromiter(map(_CONST, tensors), np.bool_, len(tensors))
    return size, const, _ptr(map(len, map(_TENSORS, graphs)))


def delegate_totals(graphs: Sequence[Graph], target: Any, batch: Any = None) -> np.ndarray:
    """`gpu_delegate.predict_gpu_delegate(graph, target).total` of each graph, without the
    per-op rows (`memory_totals`; `batch`: the latency batch's `FeatureBatch`, whose interned
    tensors give the tensor sizes)."""
    flat = FlatParts(target, target.precision)
    for g in graphs:
        flat.add(g)
    size, const, g_tens = held_bytes(graphs, batch, target.precision)
    per_part = gc.part_intermediates(*flat.arrays(graphs, size, const, g_tens))
    intermediate = np.zeros(len(graphs), np.int64)
    np.add.at(intermediate, np.array(flat.part_graph, np.int64), per_part)
    return (model_bytes(size, const, g_tens, op_offsets(graphs)) + intermediate
            + np.array(flat.packed, np.int64) + np.array(flat.constant, np.int64))
