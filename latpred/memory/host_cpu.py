"""The host CPU runtime (LiteRT 2.3 via ai-edge-litert, XNNPACK or TFLite's built-in kernels):
peak memory as the sum of what the runtime allocates before the first run and holds.

- The model buffer: `Interpreter(model_content=...)` keeps the caller's bytes (no copy);
  constant tensors point into it (kTfLiteMmapRo).
- The TFLite arena (`litert_plan.plan`), over the built-in nodes or, with XNNPACK, over the
  execution plan the delegate leaves (one node per partition, `xnnpack.delegated_input`).
- XNNPACK: packed weights, indirection buffers, the shared workspace (`xnnpack.py`).
- `overhead` and `transient`: the only fitted numbers (`OVERHEAD_*`, `*_REGROWTH_RESIDENT`,
  fitted on every other model of `datasets/host-cpu-memory`, see docs/memory.md).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import compress

from latpred.deduce.xnnpack_int8 import EIGHT_BIT_TYPES
from latpred.errors import UnsupportedModelError
from latpred.graph import Graph
from latpred.memory.litert_builtin import builtin_input, tensor_table
from latpred.memory.litert_plan import ArenaPlan, PlanInput, plan
from latpred.memory.prediction import MemoryPrediction, OpMemory
from latpred.memory import xnnpack
from latpred.memory import xnnpack_operators as xnn_ops
from latpred.memory.xnnpack_configs import QS8_AMX, qs8_config

KERNELS = ("xnnpack", "builtin")
# Fitted on every other model of datasets/host-cpu-memory (scripts/memory_eval.py --fit) and
# scored on the rest: what the runtime holds beyond its buffers (the model-independent part
# above the trivial baseline model, per-tensor structures) and how much of a buffer the
# runtime outgrew (the arena growing at Invoke, the XNNPACK workspace growing partition by
# partition: AlignedRealloc / xnn_reallocate copy, then free the old one) stays resident.
OVERHEAD_FIXED = 659_232
OVERHEAD_PER_TENSOR = 1533
ARENA_REGROWTH_RESIDENT = 0.7131
WORKSPACE_REGROWTH_RESIDENT = 0.0419
# A model whose XNNPACK operators have 8-bit weights holds this much more than the fp32 fit
# says (the qs8 kernels' code and tables, the tensors' quantization parameters): the median
# residual of the same 88 int8 models on two CPUs, by the qs8 level XNNPACK picks there
# (`xnnpack_configs`): AMX on the Intel VM (datasets/host-cpu-memory-int8), AVX-512 VNNI on
# the fourth VM (datasets/host-cpu-memory-int8-vm4, an AMD Zen 5). Fitted on either half, the
# other half reads 100% / 97.7% within 5% on each CPU (docs/memory.md). The other levels
# were not measured and take the figure of the one CPU without AMX.
OVERHEAD_EIGHT_BIT_AMX = 479_162
OVERHEAD_EIGHT_BIT_FIXED = 263_911


def eight_bit_fixed() -> int:
    """The fitted bytes of 8-bit operators on the qs8 level in force."""
    return OVERHEAD_EIGHT_BIT_AMX if qs8_config() == QS8_AMX else OVERHEAD_EIGHT_BIT_FIXED


def overhead(n_tensors: int, eight_bit: bool = False) -> int:
    """The fitted runtime structures (bytes); `eight_bit`: XNNPACK runs 8-bit operators."""
    return int(OVERHEAD_FIXED + OVERHEAD_PER_TENSOR * n_tensors +
               (eight_bit_fixed() if eight_bit else 0))


def for_precision(graph: Graph, precision: str) -> Graph:
    """The graph LiteRT would run for a target of `precision`: a float graph (a NAS candidate
    not yet written) on an int8 target becomes the int8 model latpred's writer makes of it
    (`tflite.quantize.int8_layout`: the same ops and data types, no calibration), as the
    latency deduction treats it as quantized. Any other graph is returned as it is."""
    if precision != "int8":
        return graph
    from latpred.tflite.quantize import int8_layout

    try:
        return int8_layout(graph)
    except UnsupportedModelError:   # already 8-bit or quantized, or no float graph it writes
        return graph


def eight_bit_operators(graph: Graph, delegated) -> bool:
    """Whether any delegated op (indices) has 8-bit weights (XNNPACK's qs8 operators)."""
    tensors = graph.tensors
    for i in delegated:
        op = graph.ops[i]
        if op.type in xnn_ops._WITH_BUFFERS and len(op.inputs) > 1 and op.inputs[1] >= 0 \
                and tensors[op.inputs[1]].dtype in EIGHT_BIT_TYPES:
            return True
    return False


def transient(arena_marks: tuple[int, ...], workspace_regrowth: int) -> int:
    """Resident leftovers of outgrown buffers: the largest arena size that a later chunk
    outgrew (tflite/simple_memory_arena.cc `ResizableAlignedBuffer::Resize` reallocates)
    and the workspace sizes outgrown, each times its fitted resident fraction."""
    outgrown = max((a for a, b in zip(arena_marks, arena_marks[1:]) if b > a), default=0)
    return int(ARENA_REGROWTH_RESIDENT * outgrown + WORKSPACE_REGROWTH_RESIDENT *
               workspace_regrowth)


# Estimated flatbuffer bytes around the weights when the file itself is not given: each
# buffer 16-aligned plus its table, ~100 bytes per tensor table (shape, name, quantization),
# ~60 per operator, ~1 KB of model tables and metadata.
_FB_PER_TENSOR, _FB_PER_OP, _FB_FIXED = 100, 60, 1024


def estimate_model_bytes(graph: Graph, sizes: dict[int, int] | None = None) -> int:
    """The .tflite file's size estimated from the graph (`sizes`: tensor bytes by index, when
    already computed)."""
    table_sizes, constant = tensor_table(graph)
    consts = list(compress(table_sizes if sizes is None else
                           [sizes[i] for i in range(len(constant))], constant))
    # each buffer 16-aligned: (n + 15) // 16 * 16 is align_up(n, 16) without a call per buffer
    return (sum((n + 15) // 16 * 16 for n in consts) + 16 * len(consts) + _FB_PER_TENSOR *
            len(graph.tensors) + _FB_PER_OP * len(graph.ops) + _FB_FIXED)


def arena_plan(graph: Graph, kernels: str = "xnnpack") -> tuple[ArenaPlan, PlanInput]:
    """TFLite's arena plan for `graph` with XNNPACK or with the built-in kernels only."""
    if kernels == "builtin":
        p = builtin_input(graph)
    elif kernels == "xnnpack":
        p = xnnpack.delegated_input(graph).plan_input
    else:
        raise UnsupportedModelError(f"Unknown CPU kernels {kernels!r}; use one of {KERNELS}.")
    return plan(p), p


def predict_host_cpu(graph: Graph, target: str, kernels: str = "xnnpack",
                     model_bytes: int | None = None) -> MemoryPrediction:
    """Peak memory of `graph` on the host CPU with `kernels` ("xnnpack" or "builtin")."""
    if kernels not in KERNELS:
        raise UnsupportedModelError(f"Unknown CPU kernels {kernels!r}; use one of {KERNELS}.")
    layout = xnnpack.delegated_input(graph) if kernels == "xnnpack" else None
    p = layout.plan_input if layout else builtin_input(graph)
    ap = plan(p)
    delegated = layout.delegated_ops if layout else frozenset()
    workspace, ws_extent, ws_regrowth = (xnnpack.workspace_plan(graph, layout) if layout
                                         else (0, {}, 0))
    node_of = {i: k for k, node in enumerate(p.nodes) for i in node.ops}
    temp_bytes = {k: sum(p.sizes[t] for t in node.temporaries) for k, node in enumerate(p.nodes)}
    rows, packed_total, ind_total = [], 0, 0
    for i, op in enumerate(graph.ops):
        on_xnn = i in delegated
        packed, ind = xnn_ops.operator_buffers(graph, op) if on_xnn else (0, 0)
        packed_total += packed
        ind_total += ind
        k = node_of[i]
        rows.append(OpMemory(
            i, op.type, "xnnpack" if on_xnn else "builtin",
            sum(graph.tensors[t].nbytes for t in op.outputs if t >= 0),
            sum(graph.tensors[t].nbytes for t in op.inputs if t >= 0 and
                graph.tensors[t].is_constant),
            ap.node_live[k], ap.node_extent[k], packed, ind,
            temp_bytes[k] if not on_xnn else 0, ws_extent.get(i, 0)))
    activ = [r.arena_extent + r.workspace_extent for r in rows]
    peak_op = activ.index(max(activ)) if activ and max(activ) > 0 else -1
    if peak_op >= 0:
        rows[peak_op] = replace(rows[peak_op], sets_peak=True)
    stored = sum(t.nbytes for t in graph.tensors if t.is_constant)
    extra = overhead(len(graph.tensors), eight_bit_operators(graph, delegated))
    leftovers = transient(ap.marks, ws_regrowth)
    return MemoryPrediction(
        target=target, kernels=kernels, weights_stored=stored,
        model_bytes=model_bytes if model_bytes is not None else estimate_model_bytes(graph),
        weights_packed=packed_total, arena=ap.arena_bytes,
        persistent_arena=ap.persistent_bytes, workspace=workspace, indirection=ind_total,
        overhead=extra, transient=leftovers, peak_op=peak_op, ops=tuple(rows))
