"""Which 8-bit quantized ops LiteRT's XNNPACK delegate leaves to TFLite's builtin kernels.

Read from google-ai-edge/LiteRT `tflite/delegates/xnnpack/xnnpack_delegate.cc` at 19a1585ff
("Bump LiteRT SDK versions to 2.3.0", the ai-edge-litert 2.3.0 release; the repository has no
v2.3.0 tag, and the file's changes since tag v2.2.0 touch only fp16 FULLY_CONNECTED and
BATCH_MATMUL). The wheel's delegate takes signed and unsigned 8-bit ops: BUILD's defaults
`tflite_with_xnnpack_qs8_default` / `_qu8_default` define XNNPACK_DELEGATE_ENABLE_QS8 / QU8,
which `TfLiteXNNPackDelegateOptionsDefault` turns into TFLITE_XNNPACK_DELEGATE_FLAG_QS8 / QU8
(checked against the runtime: tests/test_deduce_int8_litert.py).

An op is quantized when its output is an int8/uint8 tensor, or, for a float graph deduced for
an int8 target (a NAS candidate before it is written), when `latpred.tflite.quantize` would
make it int8. Scale checks need the quantized graph's scales; a float graph is assumed to pass
them (calibrated scales rarely leave XNNPACK's range).
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter

from latpred.graph import Graph, Op
from latpred.tflite.quantize import INT8_KERNELS

_EIGHT_BIT = ("int8", "uint8")
EIGHT_BIT_TYPES = frozenset(_EIGHT_BIT)   # also what latpred.memory calls 8-bit
_dtype = attrgetter("dtype")


# VisitNode's switch (:3153): the builtin ops the delegate has a Visit* function for at all.
# Any other op (SPLIT_V, PACK, UNPACK, GATHER, ...) always stays with TFLite.
_VISITED = frozenset({
    "ABS", "CEIL", "COS", "DEQUANTIZE", "ELU", "EXP", "FLOOR", "GELU", "HARD_SWISH",
    "LEAKY_RELU", "LOGISTIC", "LOG", "NEG", "QUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "ROUND",
    "RSQRT", "SIN", "SQRT", "SQUARE", "TANH", "ADD", "DIV", "MAXIMUM", "MINIMUM", "MUL", "PRELU",
    "SQUARED_DIFFERENCE", "SUB", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CONCATENATION", "CONV_2D",
    "DEPTHWISE_CONV_2D", "DEPTH_TO_SPACE", "EXPAND_DIMS", "FULLY_CONNECTED", "MAX_POOL_2D",
    "REDUCE_MIN", "REDUCE_MAX", "SUM", "MEAN", "PAD", "RESHAPE", "RESIZE_BILINEAR", "SLICE",
    "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "STRIDED_SLICE", "TRANSPOSE", "TRANSPOSE_CONV",
})
# Ops whose data tensors pass only CheckTensorFloatType (float32/float16): VisitUnaryNode
# (:4587, the case list before DEQUANTIZE), VisitBinaryNode (:4388, DIV/MAXIMUM/MINIMUM/PRELU/
# SQUARED_DIFFERENCE), VisitAveragePool2DNode (:3505), VisitSoftmaxNode (:6021). In int8 these
# are TFLite's reference/optimized integer kernels.
_FLOAT_ONLY = frozenset({
    "ABS", "CEIL", "COS", "EXP", "FLOOR", "GELU", "HARD_SWISH", "LOG", "NEG", "RELU_N1_TO_1",
    "RELU", "RELU6", "ROUND", "RSQRT", "SIN", "SQRT", "SQUARE", "DIV", "MAXIMUM", "MINIMUM",
    "PRELU", "SQUARED_DIFFERENCE", "AVERAGE_POOL_2D", "SOFTMAX",
})
# ConvertActivationToOutputRange (:1885) declines these fused activations.
_BAD_FUSED = frozenset({"TANH", "SIGN_BIT", "SIGMOID"})


def quantized(graph: Graph, op: Op, precision: str | None) -> bool:
    """Whether `op` runs on 8-bit tensors (see the module docstring)."""
    out = graph.tensors[op.outputs[0]] if op.outputs else None
    if out is not None and out.dtype in _EIGHT_BIT:
        return True
    floating = out is not None and out.dtype == "float32"
    return precision == "int8" and floating and op.type in INT8_KERNELS


def may_quantize(graph: Graph, precision: str | None) -> bool:
    """False when `quantized` is False for every op of `graph` (no 8-bit tensor, a float
    target): checked once per graph instead of per op."""
    return precision == "int8" or not EIGHT_BIT_TYPES.isdisjoint(map(_dtype, graph.tensors))


def declined(graph: Graph, op: Op) -> str:
    """Why the delegate leaves quantized `op` to TFLite ("" when XNNPACK takes it)."""
    why = op_declines(op)
    if why or graph.tensors[op.outputs[0]].quantization is None:   # a float graph: no scales
        return why
    if any(graph.tensors[t].quantization.per_channel for t in (*op.inputs, *op.outputs)
           if t >= 0 and not graph.tensors[t].is_constant and graph.tensors[t].quantization):
        # Check*Type (:2284-:2440): 8-bit activations must be quantized per tensor
        return "a per-channel quantized activation (Check*Type wants one scale)"
    if op.type == "FULLY_CONNECTED":
        return _fc_zero_point(graph, op)
    if op.type in ("ADD", "SUB"):
        # VisitBinaryNode: each input scale / output scale in [1/1024, 256)
        return _scale_range(graph, op, [op.inputs[0]], 1 / 1024, 256) or \
            _scale_range(graph, op, [op.inputs[1]], 1 / 1024, 256)
    if op.type == "MUL":
        # VisitBinaryNode: input1 scale * input2 scale / output scale in [1/65536, 256)
        return _scale_range(graph, op, list(op.inputs[:2]), 1 / 65536, 256)
    return ""


@lru_cache(maxsize=1 << 14)
def op_declines(op: Op) -> str:
    """The checks that read the op alone (cached: NAS candidates share their ops)."""
    if op.type not in _VISITED:
        return f"XNNPACK has no {op.type} (VisitNode)"
    if op.type in _FLOAT_ONLY:
        return f"XNNPACK's {op.type} takes float tensors only (CheckTensorFloatType)"
    if op.activation in _BAD_FUSED:
        return f"fused {op.activation} (ConvertActivationToOutputRange)"
    if op.type == "MAX_POOL_2D":
        return _pooling(op)
    if op.type == "SPLIT" and not 2 <= len(op.outputs) <= 4:
        return f"SPLIT into {len(op.outputs)} outputs (VisitSplitNode: 2 to 4)"
    if op.type == "CONCATENATION" and not 2 <= len(op.inputs) <= 5:
        return f"CONCATENATION of {len(op.inputs)} inputs (VisitConcatenationNode: 2 to 5)"
    return ""


def _pooling(op: Op) -> str:
    """CheckPoolingParams (:2113): a stride above the filter, or a 1x1 filter with a stride."""
    (sh, sw), (fh, fw) = op.attr("stride", (1, 1)), op.attr("filter", (1, 1))
    if sh > fh or sw > fw or (fh == fw == 1 and max(sh, sw) > 1):
        return f"pooling stride {sh}x{sw} over a {fh}x{fw} filter (CheckPoolingParams)"
    return ""


def _fc_zero_point(graph: Graph, op: Op) -> str:
    """VisitFullyConnectedNode (:4932): int8 weights need zero point 0."""
    q = graph.tensors[op.inputs[1]].quantization if len(op.inputs) > 1 else None
    if q is not None and graph.tensors[op.inputs[1]].dtype == "int8" and q.zero_point[0] != 0:
        return "FULLY_CONNECTED weights with a non-zero zero point"
    return ""


def _scale_range(graph: Graph, op: Op, inputs: list[int], low: float, high: float) -> str:
    """CheckTensorsInputOutputScale / InputProductOutputScale (:3088, :3116): the product of
    the inputs' scales over the output's, when all are 8-bit tensors of one type."""
    tensors = [graph.tensors[t] for t in (*inputs, op.outputs[0])]
    if any(t.quantization is None for t in tensors) or len({t.dtype for t in tensors}) != 1:
        return ""
    ratio = 1.0
    for t in tensors[:-1]:
        ratio *= t.quantization.scale[0]
    ratio /= tensors[-1].quantization.scale[0]
    if not low <= ratio < high:
        return f"{op.type} input-to-output scale {ratio:.3g} outside [{low:.3g}, {high:g})"
    return ""


# XNNPACK's `xnn_subgraph_fuse_unary_quantized_into_lut` (google/XNNPACK src/subgraph.c at
# 75db3c0, 2026-08-21; run by `xnn_subgraph_optimize` right after `xnn_subgraph_fusion`) turns
# a chain of "pure unary" element-wise nodes that starts on an 8-bit value and ends on one into
# one 256-entry table lookup (a unary node of type `xnn_unary_invalid`, which the profiler
# names "Invalid Unary Op"). Pure unary (`is_pure_unary_elementwise`): a unary node, a binary
# node whose other operand is a static scalar (x + 3, x * 1/6), or a binary node whose two
# operands both come from the chain (x * sigmoid(x)). A node joins while the one before it has
# exactly one consumer; the chain ends on its last 8-bit output. So EfficientNet's int8 swish
# (LOGISTIC, MUL) and the hard sigmoid x + 3 -> RELU6 -> * 1/6 (ADD, MUL) are one LUT each;
# the squeeze-and-excite gate's LOGISTIC, whose MUL takes the features, stays a sigmoid.
# Checked against LiteRT 2.3.0's profiler: tests/test_deduce_int8_litert.py.
# The TFLite ops the delegate defines as XNNPACK unary nodes on 8-bit tensors (the others of
# VisitUnaryNode are float only, _FLOAT_ONLY) and its 8-bit binary nodes. Every link here
# writes an 8-bit value (`in_xnnpack` holds for 8-bit ops only), so a chain through a float
# intermediate (DEQUANTIZE ... QUANTIZE), which XNNPACK would also fuse, is not followed.
_LUT_UNARY = frozenset({"LOGISTIC", "TANH", "ELU", "LEAKY_RELU", "QUANTIZE"})
_LUT_BINARY = frozenset({"ADD", "SUB", "MUL"})


def lut_chains(graph: Graph, in_xnnpack: list[bool]) -> list[tuple[int, ...]]:
    """The op chains XNNPACK runs as one 8-bit table lookup (see above), each in execution
    order; `in_xnnpack[i]`: whether XNNPACK runs op `i` and it writes an 8-bit tensor."""
    chains, taken = [], set()
    for start, op in enumerate(graph.ops):
        source = None if start in taken or not in_xnnpack[start] else _pure_unary(graph, op, ())
        if source is None:
            continue
        chain, values = [start], {source}
        while True:
            out = graph.ops[chain[-1]].outputs[0]
            values.add(out)
            readers = graph.consumers_of(out)
            if len(readers) != 1 or out in graph.outputs or not in_xnnpack[readers[0]] \
                    or _pure_unary(graph, graph.ops[readers[0]], values) is None:
                break
            chain.append(readers[0])
        if len(chain) > 1:
            chains.append(tuple(chain))
            taken.update(chain)
    return chains


def _pure_unary(graph: Graph, op: Op, chain_values) -> int | None:
    """`is_pure_unary_elementwise`: the tensor `op` is a unary function of, or None."""
    if op.type in _LUT_UNARY and len(op.outputs) == 1:
        return op.inputs[0]
    if op.type not in _LUT_BINARY or len(op.inputs) != 2:
        return None
    a, b = (graph.tensors[t] for t in op.inputs)
    # `is_broadcasted_static`: the other operand a constant of one element
    if b.is_constant and b.size == 1 and not a.is_constant:
        return op.inputs[0]
    if a.is_constant and a.size == 1 and not b.is_constant:
        return op.inputs[1]
    return op.inputs[0] if set(op.inputs) <= set(chain_values) else None
