"""Which graph op (and which kernel) each operator LiteRT's profiler reports belongs to.

`litert_profiler.profile_ops` reports operators as the runtime ran them: XNNPACK operators by
name ("Convolution (NHWC, F32) IGEMM") and ops TFLite ran itself by node index. This module maps
them onto a `Graph`'s ops (`attribute_to_graph`) and sums them per deduced kernel
(`kernel_timings`), which is how the profile loop turns one in-context profile into per-kernel
latencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from latpred.errors import MeasurementError

if TYPE_CHECKING:
    from latpred.deduce.kernel import Kernel
    from latpred.graph import Graph
    from latpred.profile.litert_profiler import OpProfile, OpTiming

# XNNPACK operator names (the part before " (") -> TFLite op types it can stand for. 1x1
# convolutions run as GEMMs; CONCATENATION/SPLIT run as copies; reshapes it needs internally
# (e.g. after MEAN without keep_dims) show up as extra "Static Reshape" operators.
_XNNPACK_OPS: dict[str, frozenset[str]] = {name: frozenset(types.split()) for name, types in {
    "Convolution": "CONV_2D DEPTHWISE_CONV_2D", "Deconvolution": "TRANSPOSE_CONV",
    "Fully Connected": "FULLY_CONNECTED CONV_2D BATCH_MATMUL",
    "Batch Matrix Multiply": "BATCH_MATMUL FULLY_CONNECTED",
    "Max Pooling": "MAX_POOL_2D", "Average Pooling": "AVERAGE_POOL_2D",
    "Global Average Pooling": "MEAN AVERAGE_POOL_2D", "Mean": "MEAN", "Sum": "SUM",
    "Max": "REDUCE_MAX", "Min": "REDUCE_MIN", "Add": "ADD", "Subtract": "SUB",
    "Multiply": "MUL", "Divide": "DIV", "Maximum": "MAXIMUM", "Minimum": "MINIMUM",
    "Squared Difference": "SQUARED_DIFFERENCE", "Clamp": "RELU RELU6 RELU_N1_TO_1 RELU_0_TO_1",
    "Sigmoid": "LOGISTIC", "TanH": "TANH", "HardSwish": "HARD_SWISH", "Leaky ReLU": "LEAKY_RELU",
    "ELU": "ELU", "GELU": "GELU", "Softmax": "SOFTMAX", "Constant Pad": "PAD PADV2",
    "Copy": "CONCATENATION SPLIT SPLIT_V RESHAPE SQUEEZE EXPAND_DIMS",
    "Static Reshape": "RESHAPE SQUEEZE EXPAND_DIMS", "Transpose": "TRANSPOSE",
    "Slice": "SLICE STRIDED_SLICE SPLIT SPLIT_V", "Convert": "QUANTIZE DEQUANTIZE",
    "Resize Bilinear": "RESIZE_BILINEAR", "Depth To Space": "DEPTH_TO_SPACE",
    "Space To Depth": "SPACE_TO_DEPTH", "Square Root": "SQRT", "Negate": "NEG",
    "Absolute Value": "ABS", "Square": "SQUARE",
    # an 8-bit element-wise chain run as one table lookup (deduce.xnnpack_int8.lut_chains):
    # it matches one of the chain's ops, the others match nothing (one kernel holds them all)
    "Invalid Unary Op": "LOGISTIC TANH ELU LEAKY_RELU QUANTIZE ADD SUB MUL"}.items()}


@dataclass(frozen=True)
class GraphOpTiming:
    """One op of the Graph with its in-context time.

    `mean_us`: summed mean time of the profiled operators attributed to it (0.0 when the
    runtime dropped it, e.g. a 1x1 stride-1 pool); `iqr_us`, `min_us`: their summed IQRs and
    minimums; `events`: their indices in `OpProfile.ops`.
    """

    op_index: int
    op_type: str
    mean_us: float
    events: tuple[int, ...]
    iqr_us: float = 0.0
    min_us: float = 0.0


def _fits(graph_type: str, op: OpTiming) -> bool:
    """Whether profiled operator `op` can stand for an op of `graph_type`."""
    if op.source != "xnnpack":
        return op.name == graph_type  # TFLite's kernels report the builtin op's name
    return graph_type in _XNNPACK_OPS.get(op.name.split(" (")[0], frozenset())


def attribute_to_graph(graph, profile: OpProfile) -> tuple[GraphOpTiming, ...]:
    """Map profiled operators onto `graph.ops`.

    An op TFLite's own kernel ran is known by its node index. The rest run in delegate
    partitions, which TFLite may schedule out of file order around those ops (a partition runs
    once all its inputs are ready), but each partition keeps file order and partitions come in
    order of their first op; so the remaining ops, in file order, are aligned with the
    delegate's operators, in the order reported, by edit distance: an operator matches an op it
    can stand for; an op with no operator was dropped by the runtime (a 1x1 stride-1 pool); an
    operator left over (an internal reshape, an unknown name) goes to the op of the operator
    before it. Both cost 1, so the alignment keeps as many matches as it can.
    """
    types, ops = [op.type for op in graph.ops], profile.ops
    owner: list[int | None] = [None] * len(ops)
    for j, op in enumerate(ops):
        if op.source == "tflite" and 0 <= op.index < len(types) and _fits(types[op.index], op):
            owner[j] = op.index
    pinned = set(o for o in owner if o is not None)
    rest_g = [i for i in range(len(types)) if i not in pinned]
    rest_x = [j for j in range(len(ops)) if owner[j] is None]
    for j, i in zip(rest_x, _align([types[i] for i in rest_g], [ops[j] for j in rest_x])):
        owner[j] = None if i is None else rest_g[i]
    last = next((o for o in owner if o is not None), 0)  # left-overs first: the first op's
    members: list[list[int]] = [[] for _ in types]
    for j, o in enumerate(owner):
        last = last if o is None else o
        members[last].append(j)
    return tuple(_graph_op(i, types[i], [ops[j] for j in members[i]], members[i])
                 for i in range(len(types)))


def _graph_op(index: int, op_type: str, events: list[OpTiming], members: list[int]
              ) -> GraphOpTiming:
    return GraphOpTiming(index, op_type, float(sum(e.mean_us for e in events)), tuple(members),
                         iqr_us=float(sum(e.iqr_us for e in events)),
                         min_us=float(sum(e.min_us for e in events)))


def _align(types: list[str], ops: list[OpTiming]) -> list[int | None]:
    """Per operator, the index in `types` it matches, or None (a left-over)."""
    n, m = len(types), len(ops)
    cost = np.zeros((n + 1, m + 1))
    cost[0, :], cost[:, 0] = np.arange(m + 1), np.arange(n + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            match = cost[i - 1, j - 1] if _fits(types[i - 1], ops[j - 1]) else np.inf
            cost[i, j] = min(match, cost[i - 1, j] + 1, cost[i, j - 1] + 1)
    i, j, owner = n, m, [None] * m
    while j > 0:
        if i > 0 and cost[i, j] == cost[i - 1, j - 1] and _fits(types[i - 1], ops[j - 1]):
            owner[j - 1], i, j = i - 1, i - 1, j - 1
        elif i > 0 and cost[i, j] == cost[i - 1, j] + 1:
            i -= 1  # a dropped op
        else:
            j -= 1  # a left-over operator
    return owner


@dataclass(frozen=True)
class KernelTiming:
    """One kernel's in-context time: the sums over its ops' `GraphOpTiming`s, in microseconds.

    `mean_us` is the kernel's latency. `iqr_us` is an upper bound of the IQR of the kernel's
    per-run time (IQRs are subadditive only for comonotone readings; summing them assumes the
    worst case), and `min_us` a lower bound of its fastest run (the ops' fastest runs need not
    coincide). `n_runs`: the profiled runs the figures come from.
    """

    mean_us: float
    iqr_us: float
    min_us: float
    n_runs: int


def kernel_timings(attributed: Sequence[GraphOpTiming], kernels: Sequence[Kernel],
                   n_runs: int) -> tuple[KernelTiming, ...]:
    """Per kernel, the summed in-context times of its ops (`attribute_to_graph`'s output)."""
    return tuple(KernelTiming(mean_us=float(sum(a.mean_us for a in members)),
                              iqr_us=float(sum(a.iqr_us for a in members)),
                              min_us=float(sum(a.min_us for a in members)), n_runs=n_runs)
                 for members in kernel_members(attributed, kernels))


def kernel_members(attributed: Sequence, kernels: Sequence[Kernel]) -> list[list]:
    """Per kernel, the `attribute_to_graph` entries of its ops; a MeasurementError names a
    kernel with an op the profile does not cover."""
    by_op = {a.op_index: a for a in attributed}
    out = []
    for kernel in kernels:
        missing = [i for i in kernel.ops if i not in by_op]
        if missing:
            raise MeasurementError(f"Kernel {kernel.type} reads ops {missing} that the profile "
                                   "does not cover.")
        out.append([by_op[i] for i in kernel.ops])
    return out


# -- dataset columns from one in-context profile --------------------------------------------------
def model_stats(profile: OpProfile) -> dict:
    """A models.parquet row's status/latency columns: the runs made with the profiler stopped
    (recording events costs 0.1-0.25 ms a run, which the ops' times do not include)."""
    return {"status": "ok", "latency_ms": profile.plain_e2e_median_us / 1000.0,
            "latency_iqr_ms": profile.plain_e2e_iqr_us / 1000.0,
            "latency_min_ms": profile.plain_e2e_min_us / 1000.0,
            "n_runs": int(profile.plain_n_runs)}


def kernel_stats(graph: Graph, kernels: Sequence[Kernel], profile: OpProfile) -> list[dict]:
    """Per kernel, a kernels.parquet row's status/latency columns from `profile` of `graph`
    (see `KernelTiming` for what the IQR and minimum bound). Raises `MeasurementError` when the
    profile cannot be attributed to the graph's ops."""
    try:
        attributed = attribute_to_graph(graph, profile)
    except (ValueError, IndexError) as err:  # an event list the alignment cannot place
        raise MeasurementError(f"The profile does not map onto the model's ops ({err}).") from None
    return [{"status": "ok", "latency_ms": t.mean_us / 1000.0,
             "latency_iqr_ms": t.iqr_us / 1000.0, "latency_min_ms": t.min_us / 1000.0,
             "n_runs": t.n_runs}
            for t in kernel_timings(attributed, kernels, profile.n_runs)]
