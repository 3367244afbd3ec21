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
convolution is three, with two tensors of its own: 36 x tiles x channels).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        nodes = part.nodes
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
