"""Which kernel type an operation runs as when it is its own kernel (CPU, or GPU before fusion)."""

from __future__ import annotations

from latpred.graph import Graph, Op

from latpred.deduce.gpu_support import ACTIVATION_OPS

_KERNEL_OF = {
    "CONV_2D": "conv2d", "DEPTHWISE_CONV_2D": "dwconv2d", "FULLY_CONNECTED": "fc",
    "BATCH_MATMUL": "batch_matmul", "AVERAGE_POOL_2D": "pool", "MAX_POOL_2D": "pool",
    "L2_POOL_2D": "pool", "MEAN": "mean", "SUM": "mean", "REDUCE_MAX": "mean",
    "REDUCE_MIN": "mean", "REDUCE_PROD": "mean", "CONCATENATION": "concat", "PACK": "concat",
    "SPLIT": "split", "SPLIT_V": "split", "UNPACK": "split", "PAD": "pad", "PADV2": "pad",
    "MIRROR_PAD": "pad", "SOFTMAX": "softmax", "LOG_SOFTMAX": "softmax", "RESHAPE": "reshape",
    "SQUEEZE": "reshape", "EXPAND_DIMS": "reshape", "TRANSPOSE": "transpose",
    "STRIDED_SLICE": "strided_slice", "SLICE": "strided_slice", "QUANTIZE": "quantize",
    "DEQUANTIZE": "quantize",
    # SHAPE reads only a tensor's dimensions: a fixed per-call cost, unlike any other kernel
    # (TFLiteConverter writes one per dynamic-batch Reshape of a Keras model).
    "SHAPE": "shape",
    # GATHER picks entries by index (the converter gathers dimensions of a SHAPE to flatten a
    # Dense's input); TFLite's builtin kernel, never XNNPACK.
    "GATHER": "gather",
}

# Element-wise arithmetic and math: one kernel type for all of them.
ELEMENTWISE_OPS = frozenset({
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE", "EXP", "LOG",
    "SQRT", "RSQRT", "SQUARE", "ABS", "NEG", "SIN", "COS", "EQUAL", "NOT_EQUAL", "GREATER",
    "GREATER_EQUAL", "LESS", "LESS_EQUAL", "FLOOR", "CEIL", "ROUND", "SIGN", "FLOOR_DIV",
    "FLOOR_MOD", "ATAN2", "ADD_N", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT", "SELECT",
    "SELECT_V2", "CAST",
})


# The op types whose `kernel_type` depends on their tensors, not on the op type alone.
TENSOR_DEPENDENT = frozenset({"CONV_2D"})


def kernel_type(graph: Graph, op: Op) -> str:
    """The kernel type of `op` run as a single kernel; a grouped CONV_2D is `grouped_conv2d`."""
    if op.type == "CONV_2D" and conv_groups(graph, op) > 1:
        return "grouped_conv2d"
    if op.type in ACTIVATION_OPS:
        return "activation"
    if op.type in ELEMENTWISE_OPS:
        return "elementwise"
    return _KERNEL_OF.get(op.type, "other")


def channelwise(graph: Graph, op: Op) -> bool:
    """A grouped CONV_2D whose every group reads one channel and writes one (a depthwise
    convolution written as CONV_2D with groups = channels)."""
    return graph.tensors[op.inputs[1]].shape[-1] == 1 and \
        graph.tensors[op.inputs[1]].shape[0] == conv_groups(graph, op)


def conv_groups(graph: Graph, op: Op) -> int:
    """A CONV_2D's group count: its `groups` attribute, else input channels / the filter's."""
    # A throwaway dict, not `op.attr`: caching one on each of 100,000 NAS candidates' convolutions
    # costs more (memory, and the garbage collections those objects trigger) than it saves.
    groups = dict(op.attrs).get("groups")
    if groups:
        return groups
    cin = graph.tensors[op.inputs[0]].shape[-1]
    fin = graph.tensors[op.inputs[1]].shape[-1]
    return max(1, cin // max(1, fin))


def bhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape as the GPU delegate sees it (ExtractTensorShape, model_builder_helper.cc)."""
    if len(shape) == 4:
        return shape
    if len(shape) == 3:
        return (shape[0], 1, shape[1], shape[2])
    if len(shape) == 2:
        return (shape[0], 1, 1, shape[1])
    if len(shape) == 1:
        return (shape[0], 1, 1, 1)
    return shape if shape else (1, 1, 1, 1)


def spatial_zero_pad(graph: Graph, op: Op) -> bool:
    """A PAD of zeros over height and width only (PADV2 with a constant value is not merged)."""
    if op.type == "PADV2" or len(op.inputs) < 2 or len(graph.tensors[op.inputs[0]].shape) != 4:
        return False
    paddings = graph.tensors[op.inputs[1]].value
    if paddings is None or len(paddings) != 8:
        return False
    return paddings[0] == paddings[1] == paddings[6] == paddings[7] == 0
