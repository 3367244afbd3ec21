"""Which operations a GPU delegate accepts, and which it can link into the previous kernel.

Both lists change across runtime versions; each set cites the source it was read from. An op the
delegate rejects runs on the CPU (see `latpred.deduce.gpu` for how the graph is partitioned).
"""

from __future__ import annotations

from latpred.graph import Graph, Op

# TFLite 2.9-era GPU delegate: the builtin operators with a parser in NewOperationParser,
# tensorflow/tensorflow tensorflow/lite/delegates/gpu/common/model_builder.cc (the stored version
# with allow_quant_ops, BatchMatmul/Pack/SplitV parsers, 2021-22). SPLIT is added because a
# SplitOperationParser exists in the same file from the CheckGpuDelegateCompatibility era
# (TF 2.10+) and the operation-wise paper measured split blocks on all six GPUs with TFLite 2.9.
TFLITE_29_OPS = frozenset({
    "ABS", "ADD", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CONCATENATION", "CONV_2D", "COS",
    "DEPTHWISE_CONV_2D", "DEQUANTIZE", "DIV", "ELU", "EXP", "FULLY_CONNECTED", "HARD_SWISH",
    "LOGISTIC", "LOG", "LSTM", "MAXIMUM", "MAX_POOL_2D", "MEAN", "MINIMUM", "MIRROR_PAD", "MUL",
    "NEG", "PACK", "PAD", "POW", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "QUANTIZE", "RELU",
    "RELU6", "LEAKY_RELU", "PRELU", "RESHAPE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
    "RSQRT", "SIN", "SLICE", "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "SPLIT_V", "SQRT", "SQUARE",
    "SQUARED_DIFFERENCE", "STRIDED_SLICE", "SUB", "SUM", "TANH", "TRANSPOSE", "TRANSPOSE_CONV",
})

# LiteRT 2.x GPU accelerator (ML Drift): NewOperationParser in google-ai-edge/LiteRT
# ml_drift_delegate/tflite/model_builder.cc @ 8f02221e05e4c5e8c6df30f8a47724b8f91d3422.
MLDRIFT_OPS = TFLITE_29_OPS | frozenset({
    "ADD_N", "ARG_MAX", "ATAN2", "BITCAST", "CAST", "CEIL", "CUMSUM", "DEPTH_TO_SPACE",
    "DYNAMIC_UPDATE_SLICE", "EQUAL", "EMBEDDING_LOOKUP", "FLOOR", "FLOOR_DIV", "FLOOR_MOD",
    "GATHER", "GELU", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "LOGICAL_AND",
    "LOGICAL_NOT", "LOGICAL_OR", "NOT_EQUAL", "ONE_HOT", "PADV2", "REDUCE_ALL", "REDUCE_ANY",
    "RELU_0_TO_1", "RELU_N1_TO_1", "REVERSE_V2", "ROUND", "SELECT", "SELECT_V2", "RIGHT_SHIFT",
    "SIGN", "TILE", "TOPK_V2", "UNPACK",
})

# Activations as TFLite operators (the "ACTIVATION" entry of Algorithm 3.1).
ACTIVATION_OPS = frozenset({"RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU",
                            "PRELU", "LOGISTIC", "TANH", "HARD_SWISH", "ELU", "GELU"})

# Algorithm 3.1's ISLINKABLE list (operation-wise paper, read from the TFLite 2.9 delegate), plus
# the other one- and two-input element-wise ops the same delegate builds with
# CreateElementwiseOneInput/TwoInput (RSQRT, SIN, COS, SQUARED_DIFFERENCE), which are linkable
# GPUOperations too (tensorflow/lite/delegates/gpu/common/selectors/operation_selector.cc).
TFLITE_29_LINKABLE = ACTIVATION_OPS - {"GELU", "RELU_0_TO_1"} | frozenset({
    "ADD", "SUB", "MUL", "DIV", "EXP", "LOG", "SQRT", "SQUARE", "ABS", "NEG", "POW", "EQUAL",
    "GREATER", "LESS", "MAXIMUM", "MINIMUM", "RSQRT", "SIN", "COS", "SQUARED_DIFFERENCE",
})

# ML Drift links every element-wise kernel (google-ai-edge/ml-drift
# ml_drift/common/selectors/operation_selector.cc, GPUOperationFromNode element-wise cases).
MLDRIFT_LINKABLE = TFLITE_29_LINKABLE | ACTIVATION_OPS | frozenset({
    "CEIL", "FLOOR", "ROUND", "SIGN", "GREATER_EQUAL", "LESS_EQUAL", "NOT_EQUAL", "FLOOR_DIV",
    "FLOOR_MOD", "ATAN2", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT",
})

_FLOAT = ("float32", "float16")


def unsupported_reason(graph: Graph, op: Op, supported: frozenset[str],
                       spatial_mean_only: bool) -> str | None:
    """Why the delegate rejects `op` (one short phrase), or None when it accepts it."""
    if op.type not in supported:
        return f"{op.type} has no GPU kernel in this delegate version"
    if op.type == "RESHAPE" and _runtime_inputs(graph, op) > 1:
        # TFLiteConverter's dynamic-batch idiom (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE) feeds
        # the new shape at run time. ReshapeOperationParser::IsSupported demands one runtime input
        # (CheckInputsOutputs(runtime_inputs=1), tensorflow/lite/delegates/gpu/common/
        # model_builder.cc @ v2.9.0; the same check in tensorflow/lite/tools/versioning/
        # gpu_compatibility.cc, kTfLiteBuiltinReshape, which later delegates call).
        return "RESHAPE takes its new shape at run time (the GPU accepts one runtime input)"
    for t in (*op.inputs, *op.outputs):
        if t < 0 or graph.tensors[t].is_constant:
            continue
        tensor = graph.tensors[t]
        # Both delegates map tensors to BHWC; five or more dimensions cannot be represented
        # (ExtractTensorShape in model_builder_helper.cc; ML Drift's IsAllAllowedTensors).
        if len(tensor.shape) > 4:
            return f"{op.type} uses a {len(tensor.shape)}-D tensor (the GPU supports up to 4-D)"
        if tensor.dtype not in _FLOAT and op.type not in ("QUANTIZE", "DEQUANTIZE"):
            return f"{op.type} uses a {tensor.dtype} tensor (the GPU computes in float)"
    if spatial_mean_only and op.type == "MEAN":
        axes = _axes(graph, op)
        rank = len(graph.tensors[op.inputs[0]].shape)
        if axes is None or not set(a % rank for a in axes) <= {1, 2} or rank != 4:
            # MeanOperationParser accepts only height/width axes in TFLite 2.9.
            return "MEAN over axes other than height and width"
    return None


def _runtime_inputs(graph: Graph, op: Op) -> int:
    return sum(1 for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant)


def _axes(graph: Graph, op: Op) -> tuple[int, ...] | None:
    if len(op.inputs) < 2 or op.inputs[1] < 0:
        return None
    return graph.tensors[op.inputs[1]].value
