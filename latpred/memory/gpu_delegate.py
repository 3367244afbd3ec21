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
kernel that matters on this GPU, the thin pointwise chain (`gpu_thin`), joins short chains
of small convolutions into one kernel whose inner tensors are never allocated, and concatenations
and splits wider than the device's binding limits become chains (`wide_chains`).

The plan itself (thin chains, ValueId order, usage intervals, shared buffers) is compiled
(`gpu_compiled.plan_part`) over the parts' flat arrays (`gpu_flat`): one graph here, a whole
batch in `delegate_totals` (memory-aware NAS).
"""

from __future__ import annotations

from dataclasses import dataclass

from latpred.graph import Graph
from latpred.memory import gpu_compiled
from latpred.memory.gpu_flat import FlatParts, held_bytes, tensor_bytes  # noqa: F401
from latpred.memory.gpu_thin import joined
from latpred.memory.prediction import MemoryPrediction, OpMemory


@dataclass(frozen=True)
class GpuDelegatePlan:
    """The delegate's intermediate buffers: `buffers` (sizes), `tensors` (id -> bytes),
    `intervals` (id -> (first, last) node), `nodes` (the fused nodes of the delegated parts, in
    order); `constant`: its constant tensors' bytes; `packed`: the weights its kernels hold as
    arguments (`gpu_weights.weight_bytes`)."""

    intermediate: int
    buffers: tuple[int, ...]
    tensors: dict
    intervals: dict
    nodes: tuple
    constant: int
    packed: int


def plan_delegate(graph: Graph, target, precision: str) -> GpuDelegatePlan:
    """The intermediate buffers of the delegated parts of `graph` on `target`, planned by
    `gpu_compiled.plan_part` over the parts' flat arrays (`gpu_flat`)."""
    flat = FlatParts(target, precision)
    flat.add(graph)
    arrays = flat.arrays([graph], *held_bytes([graph], None, precision))
    n_graph = len(graph.tensors)
    tensors, intervals, all_nodes, buffers = {}, {}, [], []
    for p, (_, nodes) in enumerate(flat.parts[0]):
        starts, order, sizes, first, last, bufs = gpu_compiled.plan_part(
            *gpu_compiled.part_arguments(p, *arrays))
        ends = [*starts[1:].tolist(), len(nodes)]
        all_nodes += [joined(nodes[s:e]) for s, e in zip(starts.tolist(), ends)]
        for t, nbytes, f, l in zip(order.tolist(), sizes.tolist(), first.tolist(), last.tolist()):
            t = t if t < n_graph else n_graph - 1 - t     # the runtime's id (`_local`)
            tensors[t], intervals[t] = nbytes, (f, l)
        buffers += bufs.tolist()
    return GpuDelegatePlan(sum(buffers), tuple(buffers), tensors, intervals, tuple(all_nodes),
                           flat.constant[0], flat.packed[0])


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
    packed = plan.packed
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
