"""Features of one dispatched kernel, the fixed column order per kernel type, feature matrices.

`kernel_features(graph, kernel, target)` starts from the main op's `op_features` and adds:

Fused ops (the GPU delegate links element-wise ops and activations into the kernel)
- `n_fused_ops`: ops linked into the kernel after the main op.
- `n_fused_elementwise`: how many of those are element-wise ops with two or more inputs
  (ADD, SUB, MUL, DIV, MAXIMUM, ...).
- `fused_activation`: 1 when the main op has a fused activation or an activation op (RELU,
  LOGISTIC, HARD_SWISH, ...) is linked in, else 0. (Unary math such as RSQRT or EXP counts in
  `n_fused_ops` only.)
- `fused_bytes_read`: bytes the linked ops read from outside the kernel (the other operand of a
  residual ADD, a constant scale); added to `bytes_read`. `bytes_written` becomes the bytes of
  the last linked op's outputs, which is what the kernel writes. For Winograd, the linked ops
  run in output_transform: the other stages report 0 here and keep their own bytes.

Winograd stages (kernel types `winograd_*`, TFLite's F(4x4, 3x3): 6x6 input tiles)
- `tiles` = ceil(H_out/4) * ceil(W_out/4) (the paper's total_tiles, per image);
  `src_depth` = ceil(C/4), `dst_depth` = ceil(O/4) (4-channel slices, as Algorithm 3.2).
- input_transform: reads the input, writes 36*tiles*C values (per image);
  flops = 864 per tile and input channel (B^T d B with dense 6x6 matrices: 2 * 2 * 6^3).
- matmul: 36 independent products [tiles x C] x [C x O]: flops = 2*36*tiles*C*O; reads the
  transformed input and 36*C*O transformed weights (its `param_bytes`), writes 36*tiles*O.
- output_transform: reads 36*tiles*O values and the bias, writes the conv output;
  flops = 480 per tile and output channel (A^T m A: 2 * (4*6*6 + 4*6*4)) + one bias add per
  output element. Linked ops only change this stage's bytes.
  The stage's flops/bytes replace the conv's; its other conv features are kept for context.

Grouped convolutions the delegate splits (`part` "group_split", "group<k>...", "group_concat")
- "group<k>" kernels (and "group<k>_<winograd stage>") are one group's convolution: channels,
  filters, sizes, flops and bytes divided by the group count, `groups` = 1.
- "group_split" is a split kernel of the conv input into `groups` slices; "group_concat" a
  concat kernel of the `groups` per-group outputs; neither computes nor reads weights.

Graph context (`context_bytes`; conv2d, grouped_conv2d, dwconv2d and fc kernels)
- the bytes all kernels of the graph read and write in one inference (the sum of their
  `bytes_read` + `bytes_written`): what passes through the caches between two runs of this
  kernel. Small models keep their weights in cache from one inference to the next: on the host
  CPU a FULLY_CONNECTED reads its weights at 0.10 us per 1,000 parameters in models that run
  under 1 ms, 0.16 at 1-2 ms and 0.22 above 3 ms (host-cpu-synthetic, -converter, -scaled,
  -large). It is rounded to 1/8 of a power of two (`context_bytes`), which blurs nothing the
  cache sizes resolve and lets one NAS batch's candidates share kernel predictions. It depends
  on the whole graph, so `kernel_features` leaves it out; training
  (`predictors.training.with_graph_columns`) and `predict_many` (`predictors.batch`) sum it
  from the kernels' features.

Grouped convolutions (`grouped_conv2d`) also get their per-group shape, `GROUP_COLUMNS`
(`group_columns`): datasets featurized before these columns get them at loading
(`predictors.training.with_graph_columns`).

Rewritten convolutions and ops outside the usual category get the missing columns of their
kernel type: a 1x1 CONV_2D run as `fc` gets `rows` = output_size / filters and `param_size` =
weights + bias; a CONV_2D run as `dwconv2d` gets `depth_multiplier` = filters / input_c; a global
AVERAGE_POOL_2D run as `mean` gets `reduction_size` (and `kernel_h/w` = the input's H, W); any
`elementwise` op gets `broadcast`.

With a `target`, float tensors are counted at the target precision's element size.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Iterable, Mapping

import numpy as np

from latpred.deduce.kernel import KERNEL_TYPES, Kernel, base_type
from latpred.errors import UnsupportedOpError
from latpred.features.operation import ITEMSIZE, Features, op_code, op_features
from latpred.graph import Graph, Op
from latpred.shapes import BINARY

_TAIL = ("bytes_read", "bytes_written", "param_bytes", "n_fused_ops", "n_fused_elementwise",
         "fused_activation", "fused_bytes_read")
_CONV = ("input_h", "input_w", "input_c", "output_h", "output_w", "stride_h", "stride_w",
         "kernel_h", "kernel_w", "dilation_h", "dilation_w", "filters", "input_size",
         "output_size", "kernel_size", "flops")
_WINOGRAD = ("input_h", "input_w", "input_c", "output_h", "output_w", "filters", "input_size",
             "output_size", "tiles", "src_depth", "dst_depth", "flops")
_GENERIC = ("input_h", "input_w", "input_c", "output_h", "output_w", "output_c", "input_size",
            "output_size", "n_inputs", "n_outputs", "flops")
_ACTIVATION = ("input_h", "input_w", "input_c", "input_size", "flops")
# Types that gather different ops also see which op a kernel runs (op_features' `op_code`).
_OP = ("op_code",)
# Kernels with weights also see how much data the rest of the graph moves (module docstring).
CONTEXT = "context_bytes"
_CTX = (CONTEXT,)

# A grouped convolution's per-group shape (`group_columns`).
GROUP_COLUMNS = ("group_in_c", "group_out_c", "group_in_align", "group_out_align",
                 "group_gemm_k", "group_flops", "group_param_bytes")

# Column order per kernel type: what a regressor for that type is trained on.
FEATURES: Mapping[str, tuple[str, ...]] = {
    "conv2d": _CONV + _TAIL + _CTX,
    "grouped_conv2d": _CONV + ("groups",) + GROUP_COLUMNS + _TAIL + _CTX,
    "dwconv2d": _CONV + ("depth_multiplier",) + _TAIL + _CTX,
    "winograd_input_transform": _WINOGRAD + _TAIL,
    "winograd_matmul": _WINOGRAD + _TAIL,
    "winograd_output_transform": _WINOGRAD + _TAIL,
    "fc": ("input_c", "filters", "param_size", "rows", "input_size", "output_size",
           "flops") + _TAIL + _CTX,
    "batch_matmul": ("batch", "m", "k", "n", "input_size", "output_size", "flops") + _TAIL,
    "pool": ("input_h", "input_w", "input_c", "output_h", "output_w", "stride_h", "stride_w",
             "kernel_h", "kernel_w", "input_size", "output_size", "flops") + _TAIL + _OP,
    "mean": ("input_h", "input_w", "input_c", "kernel_h", "kernel_w", "reduction_size",
             "input_size", "output_size", "flops") + _TAIL + _OP,
    "concat": ("input_h", "input_w", "input_c", "output_c", "n_inputs", "input_size",
               "output_size") + _TAIL + _OP,
    "split": ("input_h", "input_w", "input_c", "output_c", "n_outputs", "input_size",
              "output_size") + _TAIL + _OP,
    "pad": ("input_h", "input_w", "input_c", "output_h", "output_w", "output_c", "pad_h",
            "pad_w", "pad_c", "padding_size", "output_size") + _TAIL + _OP,
    "elementwise": ("input_h", "input_w", "input_c", "input_size", "output_size", "n_inputs",
                    "broadcast", "flops") + _TAIL + _OP,
    "activation": _ACTIVATION + _TAIL + _OP,
    # TFLite's own 8-bit activations (ops XNNPACK declines) loop over the tensor's flat size
    # (`MatchingFlatSize` in tensorflow/lite/kernels/internal/reference/hard_swish.h HardSwish
    # and reference_ops.h ReluX, as read in TensorFlow's source, not at LiteRT 2.3.0's tag), so
    # their cost is per element whatever the shape (3.0-3.3 ns an element for HARD_SWISH on the
    # third VM's synthetic and zoo models alike); with the shape's dims as terms, regressors
    # fitted on synthetic models of at most 160 channels priced MobileNetV3's 1x1x1280
    # HARD_SWISH up to 28x its time (docs/fewshot.md, session 25).
    "builtin_activation": ("input_size", "flops") + _TAIL + _OP,
    "softmax": _ACTIVATION + _TAIL + _OP,
    "reshape": _GENERIC + _TAIL + _OP,
    "transpose": _GENERIC + _TAIL + _OP,
    "strided_slice": _GENERIC + _TAIL + _OP,
    "quantize": _GENERIC + _TAIL + _OP,
    "shape": _GENERIC + _TAIL + _OP,
    "gather": _GENERIC + _TAIL + _OP,
    "other": _GENERIC + _TAIL + _OP,
}
# A TFLite builtin kernel of a quantized op has its base type's columns (`builtin_pool`: pool's)
# unless it has its own above.
FEATURES = {**FEATURES, **{t: FEATURES[base_type(t)] for t in KERNEL_TYPES if t not in FEATURES}}

_GETTERS = {k: itemgetter(*cols) for k, cols in FEATURES.items()}
_LINKED_ELEMENTWISE = frozenset(BINARY)
_LINKED_ACTIVATION = frozenset({"RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LOGISTIC",
                                "TANH", "HARD_SWISH", "GELU", "LEAKY_RELU", "PRELU", "ELU"})
_STAGES = ("input_transform", "matmul", "output_transform")
_LOOKUP_OP_CODE = op_code("LOGISTIC")
_STAGE_OF_TYPE = {f"winograd_{s}": s for s in _STAGES}


def kernel_features(graph: Graph, kernel: Kernel, target: Any = None) -> Features:
    """The features of `kernel` (see the module docstring); `target` sets the precision.

    The result holds every column of `FEATURES[kernel.type]` but `context_bytes`, which
    depends on the whole graph (module docstring).
    """
    precision = None if target is None else getattr(target, "precision", None)
    isz = ITEMSIZE.get(precision, ITEMSIZE[None])
    ops = kernel.ops
    f = op_features(graph, ops[0], precision)
    if kernel.part.startswith("group"):
        _group_part(f, kernel.part)
    stage = _STAGE_OF_TYPE.get(kernel.type)
    if stage is not None:
        _winograd_stage(graph, kernel, f, stage, isz)
    complete = _COMPLETE.get(base_type(kernel.type))
    if complete is not None:
        complete(graph, graph.ops[ops[0]], f)
    # Every CPU kernel: the fast path (its only extra op is a zero PAD the runtime folds into
    # the convolution's padding, which adds no work: the convolution's own figures stand).
    if len(ops) == 1 or kernel.device == "cpu":
        f["n_fused_ops"] = f["n_fused_elementwise"] = f["fused_bytes_read"] = 0
        f["fused_activation"] = int(graph.ops[ops[0]].attr_dict.get("activation", "NONE")
                                    != "NONE")
        if len(ops) > 1 and kernel.type == "activation":
            _as_lookup(f)
    else:
        _fused_facts(graph, kernel, f, isz, writes=stage in (None, "output_transform"))
    return f


def _as_lookup(f: Features) -> None:
    """An 8-bit element-wise chain XNNPACK runs as one table lookup (deduce.xnnpack_int8
    .lut_chains): the lookup reads its input and writes its output whatever the chain
    computes, as an 8-bit LOGISTIC does (the same lookup kernel), so it is described as one:
    the scalar an ADD or MUL link reads is in the table, not read per element."""
    f["bytes_read"] -= f["param_bytes"]
    f["param_bytes"] = 0
    f["op_code"] = _LOOKUP_OP_CODE


def context_bytes(moved: np.ndarray) -> np.ndarray:
    """The `context_bytes` column from a graph's summed bytes read + written (module docstring)."""
    moved = np.asarray(moved, dtype=np.float64)
    return np.where(moved > 0, np.exp2(np.round(8 * np.log2(np.maximum(moved, 1))) / 8), 0.0)


def _group_part(f: Features, part: str) -> None:
    """A grouped conv the delegate runs as split -> one conv per group -> concat."""
    g = f.get("groups", 1) or 1
    if part == "group_split":         # the conv input cut into g channel slices
        moved = f["bytes_read"] - f["param_bytes"]
        f.update(output_h=f["input_h"], output_w=f["input_w"], output_c=f["input_c"] // g,
                 output_size=f["input_size"], n_outputs=g, flops=0, param_bytes=0,
                 bytes_read=moved, bytes_written=moved)
    elif part == "group_concat":      # the g per-group outputs joined
        moved = f["bytes_written"]
        f.update(input_h=f["output_h"], input_w=f["output_w"], input_c=f["output_c"] // g,
                 input_size=f["output_size"], n_inputs=g, flops=0, param_bytes=0,
                 bytes_read=moved)
    else:                             # "group<k>...": one group's convolution
        for key in _PER_GROUP:
            f[key] //= g
        f["groups"] = 1


def _complete_fc(graph: Graph, op: Op, f: Features) -> None:
    if "rows" not in f:               # a 1x1 CONV_2D run as a fully connected kernel
        o = f["filters"]
        f["rows"] = f["output_size"] // o if o else 0
        f["param_size"] = f["kernel_size"] + (o if _has_bias(op) else 0)


def _complete_dw(graph: Graph, op: Op, f: Features) -> None:
    if "depth_multiplier" not in f:   # a CONV_2D with one input channel per group
        f["depth_multiplier"] = f["filters"] // f["input_c"] if f["input_c"] else 0


def _complete_mean(graph: Graph, op: Op, f: Features) -> None:
    if "reduction_size" not in f:     # a global AVERAGE_POOL_2D run as a reduction
        out = f["output_size"]
        f["reduction_size"] = f["input_size"] // out if out else 0
        f.setdefault("kernel_h", f["input_h"])
        f.setdefault("kernel_w", f["input_w"])


def _complete_elementwise(graph: Graph, op: Op, f: Features) -> None:
    if "broadcast" not in f:
        f["broadcast"] = int(len({graph.tensors[t].shape for t in op.inputs if t >= 0}) > 1)


def _has_bias(op: Op) -> bool:
    return len(op.inputs) > 2 and op.inputs[2] >= 0


# Kernel types whose main op may come from another category than the usual one (the delegate
# rewrites convolutions; ops outside the element-wise lists); these fill the missing columns.
def group_columns(f) -> dict:
    """`GROUP_COLUMNS` from a grouped convolution's features (a dict of ints, or a frame of
    columns without the `f_` prefix): the input and output channels of one group, the largest
    power of two (at most 16) dividing each, and one group's implicit-GEMM K (in-channels x
    kernel taps), FLOPs and weight bytes.

    Which kernels a library runs for a grouped convolution turns on the per-group shape, not
    on totals: cuDNN 9.19 on the H100 runs some as one grouped GEMM and others as a loop over
    groups with layout transforms, and its vectorized fp16 paths need channels in multiples of
    8. A tree cannot form a ratio or a divisibility from its inputs, so they are given
    (grouped-conv per-kernel MAPE on h100-cuda-synthetic, held-out models, LightGBM, three
    splits: 22.6% with totals alone on the first, 14.8% with channels and alignment, ~12.6%
    on average with the GEMM K, FLOPs and weights of one group too)."""
    g = np.maximum(np.asarray(f["groups"], dtype=np.int64), 1)
    gin = np.asarray(f["input_c"], dtype=np.int64) // g
    gout = np.asarray(f["filters"], dtype=np.int64) // g
    align = lambda x: np.minimum(x & -x, 16)  # noqa: E731  lowest set bit; 0 stays 0
    taps = np.asarray(f["kernel_h"], dtype=np.int64) * np.asarray(f["kernel_w"], dtype=np.int64)
    return {"group_in_c": gin, "group_out_c": gout, "group_in_align": align(gin),
            "group_out_align": align(gout), "group_gemm_k": gin * taps,
            "group_flops": np.asarray(f["flops"], dtype=np.int64) // g,
            "group_param_bytes": np.asarray(f["param_bytes"], dtype=np.int64) // g}


def _complete_grouped(graph: Graph, op: Op, f: Features) -> None:
    f.update({k: int(v) for k, v in group_columns({"groups": f.get("groups", 1), **f}).items()})


_COMPLETE = {"fc": _complete_fc, "dwconv2d": _complete_dw, "mean": _complete_mean,
             "elementwise": _complete_elementwise, "grouped_conv2d": _complete_grouped}
_PER_GROUP = ("input_c", "output_c", "filters", "input_size", "output_size", "kernel_size",
              "flops", "param_bytes", "bytes_read", "bytes_written")


def _fused_facts(graph: Graph, kernel: Kernel, f: Features, isz: dict, writes: bool) -> None:
    ops = graph.ops
    tensors = graph.tensors
    activation = ops[kernel.ops[0]].attr_dict.get("activation", "NONE") != "NONE"
    inside = {t for i in kernel.ops for t in ops[i].outputs}
    elementwise = extra = 0
    for i in kernel.ops[1:]:
        op = ops[i]
        elementwise += op.type in _LINKED_ELEMENTWISE
        activation = (activation or op.type in _LINKED_ACTIVATION
                      or op.attr_dict.get("activation", "NONE") != "NONE")
        for t in op.inputs:
            if t >= 0 and t not in inside and tensors[t].value is None:
                ten = tensors[t]
                extra += math.prod(ten.shape) * isz[ten.dtype]
    f.update(n_fused_ops=len(kernel.ops) - 1, n_fused_elementwise=elementwise,
             fused_activation=int(activation), fused_bytes_read=extra if writes else 0)
    if writes:   # the linked ops run in the stage that writes the result
        f["bytes_read"] += extra
        last = ops[kernel.ops[-1]]
        f["bytes_written"] = sum(math.prod(tensors[t].shape) * isz[tensors[t].dtype]
                                 for t in last.outputs)


def _winograd_stage(graph: Graph, kernel: Kernel, f: Features, stage: str, isz: dict) -> None:
    op = graph.ops[kernel.main_op]
    out = graph.tensors[op.outputs[0]]
    n = out.shape[0]
    c, o = f["input_c"], f["filters"]
    tiles = -(-f["output_h"] // 4) * -(-f["output_w"] // 4)
    item = isz[out.dtype]
    bias = graph.tensors[op.inputs[2]] if _has_bias(op) else None
    bias_bytes = o * isz[bias.dtype] if bias is not None else 0   # o: this group's filters
    f.update(tiles=tiles, src_depth=-(-c // 4), dst_depth=-(-o // 4))
    if stage == "input_transform":
        f.update(flops=864 * n * tiles * c, param_bytes=0,
                 bytes_read=f["input_size"] * isz[graph.tensors[op.inputs[0]].dtype],
                 bytes_written=36 * n * tiles * c * item)
    elif stage == "matmul":
        weights = 36 * c * o * item
        f.update(flops=2 * 36 * n * tiles * c * o, param_bytes=weights,
                 bytes_read=36 * n * tiles * c * item + weights,
                 bytes_written=36 * n * tiles * o * item)
    else:
        f.update(flops=480 * n * tiles * o + (f["output_size"] if bias is not None else 0),
                 param_bytes=bias_bytes, bytes_read=36 * n * tiles * o * item + bias_bytes,
                 bytes_written=f["output_size"] * item)


def feature_matrix(rows: Iterable[Mapping[str, float]], kernel_type: str) -> np.ndarray:
    """Rows of features (dicts) as a float64 array in `FEATURES[kernel_type]` column order.

    A feature missing from a row is NaN.
    """
    cols = FEATURES.get(kernel_type)
    if cols is None:
        raise UnsupportedOpError(f"Unknown kernel type {kernel_type!r}; known: "
                                 f"{', '.join(KERNEL_TYPES)}.")
    rows = rows if isinstance(rows, list) else list(rows)
    try:
        data = list(map(_GETTERS[kernel_type], rows))
    except KeyError:
        nan = float("nan")
        data = [[r.get(c, nan) for c in cols] for r in rows]
    return np.array(data, dtype=np.float64).reshape(len(rows), len(cols))
