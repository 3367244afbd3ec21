"""Memory of a model on the GPU delegate (LiteRT's GPU accelerator, ML Drift).

The delegate's memory manager (google-ai-edge/ml-drift ml_drift/webgpu/memory_manager.cc @
48cfed7e, MemoryManager::AllocateMemory) holds:
- **intermediate**: every non-constant tensor of the delegated graph, graph inputs and outputs
  included, stored as BUFFER on this GPU: B x H x W x ceil(C/4) x 4 elements of the precision's
  type (TensorDescriptor::GetMemorySizeInBytes); the usage interval of each is [first, last]
  node index that reads or writes it, inputs from 0, outputs to the node count
  (CollectUsageInformation); tensors share buffers as `gpu_assign.best_sizes` packs them
  (AllocateMemoryForBuffers: MemoryStrategy::GREEDY_BEST);
- **constant**: tensors the graph keeps constant on the GPU (AllocateMemoryForConstTensors):
  fully-connected weights and biases and a Winograd convolution's transformed weights
  (`gpu_weights.constant_bytes`). Measured: the rest of the weights (convolutions, depthwise)
  and the scalar and per-channel constant operands of element-wise ops travel as the kernels'
  own arguments, which the accelerator does not report.

The nodes are the delegate's fused kernels as `latpred.deduce.gpu` lowers them (a Winograd
convolution is three, with two tensors of its own: 36 x tiles x channels), after the special
kernel that matters on this GPU, the thin pointwise chain (`thin_pointwise`), joins short chains
of small convolutions into one kernel whose inner tensors are never allocated, and concatenations
and splits wider than the device's binding limits become chains (`wide_chains`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import lru_cache

from latpred.deduce.fusion import GpuNode
from latpred.deduce.gpu import delegated_nodes
from latpred.deduce.optypes import bhwc
from latpred.graph import Graph
from latpred.memory.gpu_assign import best_sizes, record_arrays
from latpred.memory.arena import align_up
from latpred.memory.gpu_weights import (CONSTANT_TYPES, ELEMENT_BYTES, KERNEL_WEIGHT_TYPES,
                                       constant_bytes, kernel_weight_bytes)
from latpred.memory.prediction import MemoryPrediction, OpMemory


@dataclass(frozen=True)
class GpuDelegatePlan:
    """The delegate's intermediate buffers: `buffers` (sizes), `tensors` (id -> bytes),
    `intervals` (id -> (first, last) node), `nodes` (the fused nodes of the delegated parts, in
    order); `constant`: its constant tensors' bytes."""

    intermediate: int
    buffers: tuple[int, ...]
    tensors: dict
    intervals: dict
    nodes: tuple
    constant: int


@lru_cache(maxsize=1 << 14)
def tensor_bytes(shape, precision: str) -> int:
    b, h, w, c = bhwc(shape)
    return b * h * w * align_up(c, 4) * ELEMENT_BYTES[precision]


def plan_delegate(graph: Graph, target, precision: str) -> GpuDelegatePlan:
    """The intermediate buffers of the delegated parts of `graph` on `target`."""
    records, ids, intervals, shapes, all_nodes = [], [], {}, {}, []
    buffers: list[int] = []
    for part_ops, part_nodes in delegated_nodes(graph, target):
        nodes = thin_pointwise(graph, part_nodes, precision)
        for n in nodes:
            if n.outputs and min(n.outputs) < 0:   # a tensor of its own (Winograd's, a split's)
                for t, shape in zip(n.outputs, _output_shapes(graph, n, shapes)):
                    if t < 0:
                        shapes[t] = shape
        rank = _value_ids(nodes)
        nodes = wide_chains(graph, nodes, shapes, rank, target.device.gpu)
        part_inputs, part_outputs = _boundary(graph, part_ops, nodes)
        first_last = _usage(graph, nodes, part_inputs, part_outputs)
        order = sorted(first_last, key=rank.__getitem__)
        recs = []
        for t in order:
            shape = shapes[t] if t < 0 else graph.tensors[t].shape
            size = tensor_bytes(shape, precision)
            recs.append((size, *first_last[t]))
            intervals[t] = tuple(first_last[t])
            ids.append(t)
        records += recs
        buffers += best_sizes(*record_arrays(recs)).tolist()
        all_nodes += nodes
    tensors = {t: r[0] for t, r in zip(ids, records)}
    return GpuDelegatePlan(sum(buffers), tuple(buffers), tensors, intervals, tuple(all_nodes),
                           sum(constant_bytes(graph, n, precision, target.device.gpu)
                               for n in all_nodes if n.type in CONSTANT_TYPES))


def _usage(graph: Graph, nodes: list[GpuNode], part_inputs, part_outputs
           ) -> dict[int, list[int]]:
    """Each non-constant tensor's [first, last] node (CollectUsageInformation): the part's
    inputs are used at node 0, its outputs at one past the last node."""
    tensors = graph.tensors
    first_last: dict[int, list[int]] = {}
    get = first_last.get
    uses = [(t, 0) for t in part_inputs]
    uses += [(t, k) for k, n in enumerate(nodes) for t in (*n.inputs, *n.outputs)]
    uses += [(t, len(nodes)) for t in part_outputs]
    for t, k in uses:
        if t >= 0 and tensors[t].is_constant:
            continue
        fl = get(t)
        if fl is None:
            first_last[t] = [k, k]
        else:
            fl[1] = k
    return first_last


def _value_ids(nodes: list[GpuNode]) -> dict[int, int]:
    """The order of the delegate's ValueIds, which is the order of its usage records (a
    std::map<ValueId, ...>, and the greedy assignments break ties by record order): the
    graph's tensors by index, then the values a grouped convolution's resolution adds, each
    group's input and output in turn (LiteRT tflite/delegates/gpu/common/model_builder.cc,
    ResolveGroupedConvolution: conv_src[i], conv_dst[i]), then the kernels' own tensors
    (Winograd's), made when the GPU model is built. Tried: the graph's tensors in the order the
    builder first reads them; one seed-0 and one seed-1 synthetic model fewer come out exact."""
    graph_ids = sorted({t for n in nodes for t in (*n.inputs, *n.outputs) if t >= 0})
    rank = {t: k for k, t in enumerate(graph_ids)}
    by_input = {n.inputs[0]: n for n in nodes  # each group's convolution, by its input
                if n.part.startswith("group") and n.part not in ("group_split", "group_concat")}
    for n in nodes:
        if n.part == "group_split":
            for t in n.outputs:
                rank.setdefault(t, len(rank))
                for u in by_input[t].outputs if t in by_input else ():
                    rank.setdefault(u, len(rank))
    for n in nodes:
        for t in n.outputs:
            rank.setdefault(t, len(rank))
    return rank


def wide_chains(graph: Graph, nodes: list[GpuNode], shapes: dict, rank: dict, gpu
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
    and `rank` (usage-record order, after the graph's values) get them. The split's nodes come
    where the split was, the concatenation's where it was. The latency lowering keeps one
    kernel each."""
    buffers, textures = gpu.storage_buffers_per_stage, gpu.storage_textures_per_stage
    if buffers is None or textures is None:
        return nodes
    max_inputs = max(2, min(textures, buffers) - 4)
    max_outputs = buffers - 1
    if all(n.type != "concat" or _concat_sources(graph, n) <= max_inputs for n in nodes) and \
            all(n.type != "split" or len(n.outputs) <= max_outputs for n in nodes):
        return nodes
    fresh = itertools.count(min([0, *(t for n in nodes for t in n.outputs)]) - 1, -1)

    def new_tensor(like: int, channels: int) -> int:
        t = next(fresh)
        b, h, w, _ = bhwc(shapes[like] if like < 0 else graph.tensors[like].shape)
        shapes[t], rank[t] = (b, h, w, channels), len(rank)
        return t

    def channels(ts) -> int:
        return sum(bhwc(shapes[t] if t < 0 else graph.tensors[t].shape)[3] for t in ts)

    out: list[GpuNode] = []
    for n in nodes:
        k = _concat_sources(graph, n) if n.type == "concat" else 0
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


def _concat_sources(graph: Graph, node: GpuNode) -> int:
    """How many of a concatenation node's inputs it joins (the others are read by linked ops):
    a resolved grouped convolution's groups, or the CONCATENATION's non-constant inputs."""
    op = graph.ops[node.ops[0]]
    if node.part == "group_concat":
        return graph.tensors[op.inputs[0]].shape[-1] // graph.tensors[op.inputs[1]].shape[-1]
    return sum(1 for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant)


def _output_shapes(graph: Graph, node: GpuNode, shapes: dict) -> list[tuple[int, ...]]:
    """The shape of each tensor a node writes. A grouped convolution's split writes one slice
    of its input per group (`out_shape` is the convolution's output there)."""
    if node.part != "group_split":
        return [node.out_shape] * len(node.outputs)
    src = node.inputs[0]
    b, h, w, c = bhwc(shapes[src] if src < 0 else graph.tensors[src].shape)
    return [(b, h, w, c // len(node.outputs))] * len(node.outputs)


def _boundary(graph: Graph, ops, nodes) -> tuple[list[int], list[int]]:
    """The part's inputs (read, not written inside) and outputs (graph outputs, or read by an
    op outside the part), non-constant."""
    opset = set(ops)
    written = {t for n in nodes for t in n.outputs}
    inputs = sorted({t for n in nodes for t in n.inputs
                     if t >= 0 and t not in written and not graph.tensors[t].is_constant})
    outs = set(graph.outputs)
    if len(opset) == len(graph.ops):     # the whole graph (the usual part): no reader outside
        return inputs, sorted(t for t in written if t >= 0 and t in outs)
    consumers = graph.consumers
    outputs = sorted(t for t in written if t >= 0 and (
        t in outs or any(c not in opset for c in consumers.get(t, ()))))
    return inputs, outputs


# ThinPointwiseFuser (google-ai-edge/ml-drift ml_drift/common/kernels/special/
# thin_pointwise_fuser.cc @ 3220ff1; on for LiteRT's accelerator: its delegate_kernel.cc adds
# ModelHints::kAllowSpecialKernels), the limits of its branch for NVIDIA and other desktop GPUs.
# "F16" is the fp16 target (the builder's precision exactly F16); fp32 takes the other limits.
_THIN = {  # precision -> (dw max channels, dw max C*kh*kw, conv max C_in*kh*kw*C_out)
    "fp16": (32, 3 * 3 * 32, 32 * 32),
    "fp32": (16, 3 * 3 * 16, 16 * 32),
}
_THIN_MAX_OUT = 32           # a conv's output channels
_THIN_TYPES = frozenset({"dwconv2d", "conv2d"})   # what a chain's steps can be
_THIN_MAX_CONVS = 3          # max_convs_count
_THIN_MAX_BUFFER = 1024 * 3  # max_buffer_size, bytes of weights and biases together


def _thin_step(graph: Graph, node: GpuNode, first: bool, precision: str) -> int | None:
    """The weight bytes the fuser counts for `node` as a step of a chain, or None if it cannot
    be one (a depthwise only first; later convolutions only 1x1, stride 1)."""
    op = graph.ops[node.ops[0]]
    if node.type not in ("dwconv2d", "conv2d") or len(op.inputs) < 2:
        return None
    dw_c, dw_taps, conv_size = _THIN[precision]
    size = ELEMENT_BYTES[precision]
    w = graph.tensors[op.inputs[1]].shape
    if node.type == "dwconv2d" and op.type == "DEPTHWISE_CONV_2D" and first:
        c, kh, kw = w[3], w[1], w[2]
        if op.attr("depth_multiplier", 1) != 1 or c > dw_c or c * kh * kw > dw_taps:
            return None
        return (align_up(c, 4) + align_up(c, 4) * kh * kw) * size
    if node.type != "conv2d" or op.type != "CONV_2D" or op.attr("groups", 1) != 1:
        return None
    o, kh, kw, i = w
    if not first and (kh, kw) != (1, 1) or not first and tuple(op.attr("stride", (1, 1))) != (1, 1):
        return None
    if o > _THIN_MAX_OUT or i * kh * kw * o > conv_size:
        return None
    return (align_up(o, 4) + align_up(i, 4) * align_up(o, 4) * kh * kw) * size


def thin_pointwise(graph: Graph, nodes: list[GpuNode], precision: str) -> list[GpuNode]:
    """Join each chain TryThinPointwiseFuser takes into one node (its inner tensors vanish): a
    depthwise or any convolution, then 1x1 convolutions, each reading the one output of the
    step before as its only reader; at most 3 convolutions and 3 KiB of weights, at least 2."""
    # A chain's second step is a 1x1 convolution: where no conv2d node follows a convolution
    # or depthwise node, no chain starts (most nodes of most graphs), and the nodes stay.
    if not any(a.type in _THIN_TYPES and b.type == "conv2d" for a, b in zip(nodes, nodes[1:])):
        return nodes
    readers: dict[int, int] = {}
    for n in nodes:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    outs = set(graph.outputs)
    out: list[GpuNode] = []
    k = 0
    while k < len(nodes):
        if k + 1 >= len(nodes) or nodes[k + 1].type != "conv2d" or \
                nodes[k].type not in _THIN_TYPES:
            out.append(nodes[k])
            k += 1
            continue
        chain, total = [], 0
        j = k
        while j < len(nodes) and len(chain) < _THIN_MAX_CONVS:
            n = nodes[j]
            if chain:
                prev = chain[-1].outputs
                if len(prev) != 1 or n.inputs[:1] != prev or readers.get(prev[0]) != 1 \
                        or prev[0] in outs:
                    break
            step = _thin_step(graph, n, not chain, precision) \
                if n.type in _THIN_TYPES else None
            if step is None or total + step > _THIN_MAX_BUFFER:
                break
            chain.append(n)
            total += step
            j += 1
        if len(chain) < 2:
            out.append(nodes[k])
            k += 1
            continue
        inner = {t for n in chain[:-1] for t in n.outputs}
        ins = tuple(dict.fromkeys(t for n in chain for t in n.inputs if t not in inner))
        out.append(GpuNode("thin_pointwise", tuple(i for n in chain for i in n.ops), ins,
                           chain[-1].outputs, chain[-1].out_shape, False, "ThinPointwiseFuser"))
        k = j
    return out


def gpu_delegate_total(graph: Graph, target) -> int:
    """`predict_gpu_delegate(graph, target).total` without the per-op rows (`memory_totals`)."""
    from latpred.memory.host_cpu import estimate_model_bytes

    plan = plan_delegate(graph, target, target.precision)
    e = ELEMENT_BYTES[target.precision]
    return (estimate_model_bytes(graph) + _packed(graph, plan.nodes, e) + plan.intermediate
            + plan.constant)


def _packed(graph: Graph, nodes, e: int) -> int:
    """The weights the nodes' kernels hold as arguments (`kernel_weight_bytes`)."""
    return sum(kernel_weight_bytes(graph, n, e) for n in nodes if n.type in KERNEL_WEIGHT_TYPES)


def predict_gpu_delegate(graph: Graph, target, model_bytes: int | None = None
                         ) -> MemoryPrediction:
    """`predict_memory` on a GPU target LiteRT's accelerator (ML Drift) runs: `arena` is the
    delegate's intermediate buffers (the accelerator's gpu_intermediate_memory_bytes),
    `persistent_arena` its constant tensors (gpu_constant_memory_bytes), `weights_packed` the
    other weights as the GPU holds them, estimated (each at the target precision, channels
    aligned to 4; the accelerator reports no figure for them), `model_bytes` the model buffer
    the host keeps. A model the accelerator would not run raises `DelegateRefusedError`
    (`latpred.deduce.gpu`)."""
    from latpred.memory.host_cpu import estimate_model_bytes

    precision = target.precision
    plan = plan_delegate(graph, target, precision)
    e = ELEMENT_BYTES[precision]
    packed = _packed(graph, plan.nodes, e)
    live = _live_per_node(plan)
    peak_node = max(range(len(live)), key=live.__getitem__) if live else 0
    rows, node_of = [], {}
    for k, n in enumerate(plan.nodes):
        for i in n.ops:
            node_of.setdefault(i, k)
    for i, op in enumerate(graph.ops):
        k = node_of.get(i)
        rows.append(OpMemory(
            index=i, type=op.type, runs_on="gpu" if k is not None else "cpu",
            output_bytes=sum(plan.tensors.get(t, 0) for t in op.outputs),
            weight_bytes=sum(graph.tensors[t].nbytes for t in op.inputs
                             if t >= 0 and graph.tensors[t].is_constant),
            arena_live=live[k] if k is not None else 0,
            arena_extent=plan.intermediate if k is not None else 0,
            sets_peak=k == peak_node and node_of.get(i) == k and
            plan.nodes[k].ops[0] == i))
    peak_op = plan.nodes[peak_node].ops[0] if plan.nodes else 0
    return MemoryPrediction(
        target=str(target), kernels="ml-drift",
        weights_stored=sum(t.nbytes for t in graph.tensors if t.is_constant),
        model_bytes=model_bytes if model_bytes is not None else estimate_model_bytes(graph),
        weights_packed=packed, arena=plan.intermediate, persistent_arena=plan.constant,
        workspace=0, indirection=0, overhead=0, transient=0, peak_op=peak_op,
        ops=tuple(rows))


def _live_per_node(plan: GpuDelegatePlan) -> list[int]:
    """Bytes of the tensors alive at each node (their own sizes, before sharing)."""
    live = [0] * (len(plan.nodes) + 1)
    for t, (first, last) in plan.intervals.items():
        for k in range(first, min(last, len(plan.nodes) - 1) + 1):
            live[k] += plan.tensors[t]
    return live[:len(plan.nodes)]
