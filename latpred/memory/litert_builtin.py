"""What TFLite's built-in kernels add to the plan: allocation types set in Prepare and
temporaries. LiteRT tag v2.2.0 (= f67457790), tflite/kernels/:

- Allocation types after Prepare: `latpred.deduce.prepare` (the GPU path needs them too).
- Temporaries (float32 / int8, non-hybrid): CONV_2D allocates an im2col buffer
  [N, OH, OW, KH*KW*Cin/groups] of the input type when the convolution is not 1x1 stride 1
  without dilation (conv.cc `IsIm2ColRequired`, kGenericOptimized; with the multithreaded
  Eigen kernel and threads != 1 it would use a persistent HWCN copy of the filter instead,
  conv.cc:471). MEAN/SUM (reduce.cc `InitializeTemporaries`, `PrepareMeanOrSum`): int32
  [rank(input)], int32 [number of axes], an accumulator of the output's element count
  (float32 for float32, int32 for 8/16-bit, int64 for int32 inputs); the normalized-dims
  temporary is dynamic for a non-constant input. Other reductions get the first two.
  DEPTHWISE_CONV_2D and FULLY_CONNECTED allocate temporaries only in hybrid mode.
"""

from __future__ import annotations

from math import prod

from latpred.deduce import prepare
from latpred.deduce.prepare import ARENA, DYNAMIC, MMAP, PERSISTENT_RO, REDUCE, reduce_noop
from latpred.graph import _ITEMSIZE, Graph, Op
from latpred.memory.litert_plan import INPLACE, PlanInput, PlanNode

_ACCUM = {"float32": ("float32", 4), "int8": ("int32", 4), "uint8": ("int32", 4),
          "int16": ("int32", 4), "int32": ("int64", 8), "int64": ("int64", 8),
          "bool": ("bool", 1)}


def tensor_table(graph: Graph) -> tuple[list[int], list[bool]]:
    """Each tensor's byte size (`Tensor.nbytes`) and whether the model stores it, by index.
    Computed once per graph and kept with its derived views: the XNNPACK layout, the
    allocation types and the model-size estimate all read them (the item sizes are looked up
    directly rather than through the `itemsize` property, which a NAS loop would call a
    million times)."""
    table = graph._cache.get("memory.tensor_table")
    if table is None:
        tensors = graph.tensors
        table = ([prod(t.shape) * _ITEMSIZE[t.dtype] for t in tensors],
                 [t.is_constant for t in tensors])
        graph._cache["memory.tensor_table"] = table
    return table


def set_tensor_table(graph: Graph, nbytes: list[int], constant: list[bool]) -> None:
    """Give `graph` the table `tensor_table` would compute, found elsewhere (`configs`: from
    the latency path's interned tensors)."""
    graph._cache.setdefault("memory.tensor_table", (nbytes, constant))


def tensor_bytes(graph: Graph) -> dict[int, int]:
    """Each tensor's byte size by index (`Tensor.nbytes`)."""
    return dict(enumerate(tensor_table(graph)[0]))


def tensor_kinds(graph: Graph) -> tuple[dict[int, str], set[int], bool]:
    """`deduce.prepare.tensor_kinds` on the graph's cached constant flags: each tensor's
    allocation type after Prepare, the ops that end a prepared chunk, whether a type changed."""
    return prepare.tensor_kinds(graph, tensor_table(graph)[1])


def temporaries(graph: Graph, op: Op, kinds: dict[int, str] | None = None
                ) -> tuple[list[tuple[str, int, str]], int]:
    """The temporaries a built-in kernel's Prepare adds, (name, bytes, allocation type) in
    `node->temporaries` order, and how many tensor ids its Prepare takes with `AddTensors`
    (FULLY_CONNECTED takes 6 it leaves unused unless hybrid, fully_connected.cc:729)."""
    if op.type == "CONV_2D":
        x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        out = graph.tensors[op.outputs[0]]
        if w.dtype in ("int8", "uint8") and x.dtype == "float32":
            return [], 0     # hybrid: not modelled (latpred writes no hybrid models)
        stride, dilation = op.attr("stride", (1, 1)), op.attr("dilation", (1, 1))
        if tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and w.shape[1:3] == (1, 1):
            return [], 0
        n, oh, ow = out.shape[0], out.shape[1], out.shape[2]
        depth = w.shape[1] * w.shape[2] * w.shape[3]
        return [("im2col", n * oh * ow * depth * x.itemsize, ARENA)], 1
    if op.type == "FULLY_CONNECTED":
        return [], 6
    if op.type in REDUCE:
        x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        axes = graph.tensors[op.inputs[1]]
        kinds = kinds or {}
        folded = kinds.get(op.inputs[0], MMAP if x.is_constant else ARENA) in \
            (MMAP, PERSISTENT_RO)
        rank = 4 * len(x.shape)
        if reduce_noop(graph, op, lambda t: kinds.get(t) in (MMAP, PERSISTENT_RO)):
            return [("reduce_index", rank, ARENA), ("reduce_resolved_axis", 0, DYNAMIC),
                    ("reduce_accum", 0, DYNAMIC), ("reduce_normalized_dims", 0, DYNAMIC)], 4
        temps = [("reduce_index", rank, ARENA),
                 ("reduce_resolved_axis", 4 * axes.size, ARENA)]
        if op.type in ("MEAN", "SUM", "REDUCE_PROD"):
            _, item = _ACCUM.get(x.dtype, ("float32", 4))
            temps.append(("reduce_accum", out.size * item, ARENA))
        else:
            temps.append(("reduce_accum", 0, ARENA))
        temps.append(("reduce_normalized_dims", rank, ARENA) if folded else
                     ("reduce_normalized_dims", 0, DYNAMIC))
        return temps, 4
    return [], 0


def add_temporaries(graph: Graph, i: int, next_id: int, sizes: dict[int, int],
                    kinds: dict[int, str], names: dict[int, str]) -> tuple[tuple[int, ...], int]:
    """Give op `i`'s temporaries the tensor ids LiteRT gives them (ids are handed out in
    Prepare order from the graph's tensor count on); returns them and the next free id."""
    temps, used = temporaries(graph, graph.ops[i], kinds)
    ids = []
    for k, (name, nbytes, kind) in enumerate(temps):
        t = next_id + k
        sizes[t], kinds[t], names[t] = nbytes, kind, f"{graph.ops[i].type}:{name}"
        ids.append(t)
    return tuple(ids), next_id + used


def builtin_input(graph: Graph) -> PlanInput:
    """The planner's input when every op runs on TFLite's built-in kernels (no delegate)."""
    kinds, stops, _ = tensor_kinds(graph)
    sizes = tensor_bytes(graph)
    names: dict[int, str] = {}
    nodes = []
    next_id = len(graph.tensors)
    for i, op in enumerate(graph.ops):
        temps, next_id = add_temporaries(graph, i, next_id, sizes, kinds, names)
        nodes.append(PlanNode(op.inputs, op.outputs, (i,), op.type, temps,
                              INPLACE.get(op.type, 0), i in stops))
    return PlanInput(tuple(nodes), sizes, kinds, plan_kinds(kinds, nodes, stops), graph.inputs,
                     graph.outputs, names)


def plan_kinds(kinds: dict[int, str], nodes: list[PlanNode], stops: set[int]) -> dict[int, str]:
    """Allocation types when `PlanAllocations` runs: after the first chunk only was prepared,
    later nodes' outputs still have the reader's default (kTfLiteArenaRw)."""
    first_stop = min((k for k, n in enumerate(nodes) if n.ends_chunk), default=len(nodes))
    out = dict(kinds)
    for node in nodes[first_stop + 1:]:
        for t in node.outputs:
            if out.get(t) != MMAP:
                out[t] = ARENA
    return out
