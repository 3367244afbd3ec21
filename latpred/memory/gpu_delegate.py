"""Memory of a model on the GPU delegate (LiteRT's GPU accelerator, ML Drift).

The delegate's memory manager (google-ai-edge/ml-drift ml_drift/webgpu/memory_manager.cc @
48cfed7e, MemoryManager::AllocateMemory) holds:
- **intermediate**: every non-constant tensor of the delegated graph, graph inputs and outputs
  included, stored as BUFFER on this GPU: B x H x W x ceil(C/4) x 4 elements of the precision's
  type (TensorDescriptor::GetMemorySizeInBytes); the usage interval of each is [first, last]
  node index that reads or writes it, inputs from 0, outputs to the node count
  (CollectUsageInformation); tensors share buffers as `gpu_assign.greedy_best` packs them
  (AllocateMemoryForBuffers: MemoryStrategy::GREEDY_BEST);
- **constant**: tensors the graph keeps constant on the GPU (AllocateMemoryForConstTensors).

The nodes are the delegate's fused kernels as `latpred.deduce.gpu` lowers them (a Winograd
convolution is three, with two tensors of its own: 36 x tiles x channels), after the special
kernel that matters on this GPU, the thin pointwise chain (`thin_pointwise`), joins short chains
of small convolutions into one kernel whose inner tensors are never allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from latpred.deduce.fusion import GpuNode
from latpred.deduce.gpu import gpu_parts
from latpred.graph import Graph
from latpred.memory.gpu_assign import greedy_best

_ELEMENT_BYTES = {"fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class GpuDelegatePlan:
    """The delegate's intermediate buffers: `buffers` (sizes), `tensors` (id -> bytes),
    `intervals` (id -> (first, last) node), `nodes` (count)."""

    intermediate: int
    buffers: tuple[int, ...]
    tensors: dict
    intervals: dict
    nodes: int


def _bhwc(shape) -> tuple[int, int, int, int]:
    """The delegate's BHWC view of a tensor shape (TFLite's rank 1-4)."""
    s = tuple(int(x) for x in shape) or (1,)
    if len(s) == 4:
        return s
    if len(s) == 3:
        return (s[0], 1, s[1], s[2])
    if len(s) == 2:
        return (s[0], 1, 1, s[1])
    return (1, 1, 1, s[0])


def tensor_bytes(shape, precision: str) -> int:
    b, h, w, c = _bhwc(shape)
    return b * h * w * -(-c // 4) * 4 * _ELEMENT_BYTES[precision]


def plan_delegate(graph: Graph, target, precision: str) -> GpuDelegatePlan:
    """The intermediate buffers of the delegated parts of `graph` on `target`."""
    records, ids, intervals, shapes, total_nodes = [], [], {}, {}, 0
    buffers: list[int] = []
    for part in gpu_parts(graph, target):
        if not part.delegated:
            continue
        nodes = thin_pointwise(graph, part.nodes, precision)
        first_last: dict[int, list[int]] = {}

        def use(t: int, k: int) -> None:
            if t >= 0 and graph.tensors[t].is_constant:
                return
            fl = first_last.get(t)
            if fl is None:
                first_last[t] = [k, k]
            else:
                fl[1] = k

        part_inputs, part_outputs = _boundary(graph, part.ops, nodes)
        for t in part_inputs:
            use(t, 0)
        for k, n in enumerate(nodes):
            for t in (*n.inputs, *n.outputs):
                use(t, k)
            for t in n.outputs:
                if t < 0:
                    shapes[t] = n.out_shape
        for t in part_outputs:
            use(t, len(nodes))
        # std::map<ValueId, ...>: graph tensors in id order, then the delegate's own.
        order = sorted(first_last, key=lambda t: (t < 0, abs(t)))
        recs = []
        for t in order:
            shape = shapes[t] if t < 0 else graph.tensors[t].shape
            size = tensor_bytes(shape, precision)
            recs.append((size, *first_last[t]))
            intervals[t] = tuple(first_last[t])
            ids.append(t)
        records += recs
        buffers += greedy_best(recs)[1]
        total_nodes += len(nodes)
    tensors = {t: r[0] for t, r in zip(ids, records)}
    return GpuDelegatePlan(sum(buffers), tuple(buffers), tensors, intervals, total_nodes)


def _boundary(graph: Graph, ops, nodes) -> tuple[list[int], list[int]]:
    """The part's inputs (read, not written inside) and outputs (graph outputs, or read by an
    op outside the part), non-constant."""
    opset = set(ops)
    written = {t for n in nodes for t in n.outputs}
    inputs = sorted({t for n in nodes for t in n.inputs
                     if t >= 0 and t not in written and not graph.tensors[t].is_constant})
    outs = set(graph.outputs)
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
_THIN_MAX_CONVS = 3          # max_convs_count
_THIN_MAX_BUFFER = 1024 * 3  # max_buffer_size, bytes of weights and biases together


def _align4(x: int) -> int:
    return -(-x // 4) * 4


def _thin_step(graph: Graph, node: GpuNode, first: bool, precision: str) -> int | None:
    """The weight bytes the fuser counts for `node` as a step of a chain, or None if it cannot
    be one (a depthwise only first; later convolutions only 1x1, stride 1)."""
    op = graph.ops[node.ops[0]]
    if node.type not in ("dwconv2d", "conv2d") or len(op.inputs) < 2:
        return None
    dw_c, dw_taps, conv_size = _THIN[precision]
    size = _ELEMENT_BYTES[precision]
    w = graph.tensors[op.inputs[1]].shape
    if node.type == "dwconv2d" and op.type == "DEPTHWISE_CONV_2D" and first:
        c, kh, kw = w[3], w[1], w[2]
        if op.attr("depth_multiplier", 1) != 1 or c > dw_c or c * kh * kw > dw_taps:
            return None
        return (_align4(c) + _align4(c) * kh * kw) * size
    if node.type != "conv2d" or op.type != "CONV_2D" or op.attr("groups", 1) != 1:
        return None
    o, kh, kw, i = w
    if not first and (kh, kw) != (1, 1) or not first and tuple(op.attr("stride", (1, 1))) != (1, 1):
        return None
    if o > _THIN_MAX_OUT or i * kh * kw * o > conv_size:
        return None
    return (_align4(o) + _align4(i) * _align4(o) * kh * kw) * size


def thin_pointwise(graph: Graph, nodes: list[GpuNode], precision: str) -> list[GpuNode]:
    """Join each chain TryThinPointwiseFuser takes into one node (its inner tensors vanish): a
    depthwise or any convolution, then 1x1 convolutions, each reading the one output of the
    step before as its only reader; at most 3 convolutions and 3 KiB of weights, at least 2."""
    readers: dict[int, int] = {}
    for n in nodes:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    outs = set(graph.outputs)
    out: list[GpuNode] = []
    k = 0
    while k < len(nodes):
        chain, total = [], 0
        j = k
        while j < len(nodes) and len(chain) < _THIN_MAX_CONVS:
            n = nodes[j]
            if chain:
                prev = chain[-1].outputs
                if len(prev) != 1 or n.inputs[:1] != prev or readers.get(prev[0]) != 1 \
                        or prev[0] in outs:
                    break
            step = _thin_step(graph, n, not chain, precision)
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
