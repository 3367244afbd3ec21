"""Features of one operation: Table 3 of the operation-wise paper, plus FLOPs and bytes.

`op_features(graph, op_index)` returns a flat dict of numbers. Every op gets the generic
features; ops of a known category add theirs. Definitions (elements are tensor elements, not
bytes; shapes are NHWC):

Generic, for every op
- `input_h`, `input_w`, `input_c`: the main (first non-constant) input seen as NHWC: rank 4 or
  more -> the last three dims; rank 3 [N, S, C] -> (1, S, C); rank 2 [N, C] -> (1, 1, C);
  rank 1 -> (1, 1, C); a scalar -> (1, 1, 1). `output_h`, `output_w`, `output_c`: output 0 alike.
- `input_size`: elements of all non-constant inputs; `output_size`: elements of all outputs.
- `n_inputs` (non-constant inputs), `n_outputs`.
- `param_bytes`: bytes of constant inputs that are parameters (weights, biases, constant
  operands of element-wise ops) - constants whose data is not kept (`Tensor.value is None`);
  shape-like int operands (axes, paddings, shapes) are metadata and not counted.
- `bytes_read` = bytes of the non-constant inputs + `param_bytes`; `bytes_written` = bytes of
  all outputs. `precision` ("fp16"/"int8") counts float tensors at that element size.
- `flops`: 0 for pure data movement (reshape, transpose, concat, split, pad, slices, ...).
- `op_code`: the op's TFLite builtin operator code (-1 for an op TFLite has no code for).
  Kernel types that gather different ops (`activation`: RELU at ~0.09 ns per element on the
  host CPU, LOGISTIC 0.38, GELU 0.44; `elementwise`, `pool`, ...) need it: every other column
  of a LOGISTIC and a RELU of one shape is the same.

FLOPs follow nn-Meter's convention: one multiply-add is 2 FLOPs, a bias add is 1 FLOP per
output element (nn-Meter's FC: (2*I + 1) * O). Fused activations are not counted.

Convolution (CONV_2D, grouped CONV_2D, DEPTHWISE_CONV_2D; Table 3 rows Conv2D, Winograd,
DepthwiseConv2D, GroupedConv2D)
- `stride_h/w`, `kernel_h/w`, `dilation_h/w`, `filters` (output channels),
  `kernel_size` = filter elements (O*kh*kw*C/groups; depthwise kh*kw*C*mult),
  `groups` (CONV_2D; 1 when not grouped), `depth_multiplier` (depthwise),
  `flops` = 2 * N*Ho*Wo*O*kh*kw*C/groups (+ N*Ho*Wo*O with bias); depthwise C/groups = 1.
FullyConnected
- `input_c` = I (the weights' input features), `filters` = O, `rows` = input elements / I,
  `kernel_size` = O*I, `param_size` = O*I (+ O with bias), `flops` = 2*rows*I*O (+ rows*O).
BatchMatMul: `batch`, `m`, `k`, `n`; `flops` = 2*batch*m*k*n.
Pooling (AVERAGE/MAX/L2_POOL_2D): `stride_h/w`, `kernel_h/w`; `flops` = output_size*kh*kw
  (one add or compare per window element).
Mean and other reductions: `kernel_h`, `kernel_w` = extents of the reduced NHWC-view H and W
  axes (1 where not reduced), `reduction_size` = input elements per output element,
  `flops` = input_size (one add per input element).
Concat / Split: `output_c` and `n_inputs`/`n_outputs`. Table 3 also lists "kernel height
  (width)" for these, which has no meaning for a copy; the input and part counts replace it.
Padding (PAD, PADV2, MIRROR_PAD): `pad_h`, `pad_w`, `pad_c` = before + after on the NHWC-view
  axes, `padding_size` = output_size - input_size (elements added).
Element-wise and activations (ADD, MUL, RELU, LOGISTIC, SOFTMAX, QUANTIZE, ...): `broadcast`
  (1 when the inputs' shapes differ), `flops` = output_size (one operation per element).
"""

from __future__ import annotations

from functools import lru_cache
from math import prod
from typing import Callable

from latpred.graph import Graph, Op, Tensor
from latpred.shapes import BINARY, REDUCE, UNARY

Features = dict[str, float]
_ONES = (1, 1)

_BASE_ITEMSIZE = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
                  "int64": 8, "bool": 1, "string": 1}
# Element sizes under a target precision: float tensors take the precision's size.
ITEMSIZE = {
    None: _BASE_ITEMSIZE, "fp32": _BASE_ITEMSIZE,
    "fp16": {**_BASE_ITEMSIZE, "float32": 2, "float16": 2},
    "int8": {**_BASE_ITEMSIZE, "float32": 1, "float16": 1},
}


def hwc(shape: tuple[int, ...], fill: int = 1) -> tuple[int, int, int]:
    """The (H, W, C) of a shape seen as NHWC; missing axes are `fill` (see the docstring)."""
    r = len(shape)
    if r > 3:
        return shape[-3], shape[-2], shape[-1]
    if r == 3:
        return fill, shape[1], shape[2]
    return (fill, fill, shape[-1]) if r else (fill, fill, fill)


def op_features(graph: Graph, op_index: int, precision: str | None = None) -> Features:
    """The features of `graph.ops[op_index]` as a dict of numbers (see the module docstring)."""
    # Hot path of a NAS loop (~300k ops/s): one pass over the op's tensors, no helper calls
    # for the common rank-4 case.
    op = graph.ops[op_index]
    tensors = graph.tensors
    isz = _BASE_ITEMSIZE if precision is None else ITEMSIZE.get(precision, _BASE_ITEMSIZE)
    main = None
    n_in = in_elems = in_bytes = params = 0
    for t in op.inputs:
        if t < 0:
            continue
        ten = tensors[t]
        n = prod(ten.shape)
        if ten.is_constant:
            if ten.value is None:
                params += n * isz[ten.dtype]
        else:
            n_in += 1
            in_elems += n
            in_bytes += n * isz[ten.dtype]
            if main is None:
                main = ten
    out_elems = out_bytes = 0
    for t in op.outputs:
        ten = tensors[t]
        n = prod(ten.shape)
        out_elems += n
        out_bytes += n * isz[ten.dtype]
    if main is None:
        ih = iw = ic = 0
    else:
        s = main.shape
        ih, iw, ic = (s[1], s[2], s[3]) if len(s) == 4 else hwc(s)
    if op.outputs:
        s = tensors[op.outputs[0]].shape
        oh, ow, oc = (s[1], s[2], s[3]) if len(s) == 4 else hwc(s)
    else:
        oh = ow = oc = 0
    f = {"input_h": ih, "input_w": iw, "input_c": ic, "output_h": oh, "output_w": ow,
         "output_c": oc, "input_size": in_elems, "output_size": out_elems, "n_inputs": n_in,
         "n_outputs": len(op.outputs), "flops": 0, "bytes_read": in_bytes + params,
         "bytes_written": out_bytes, "param_bytes": params,
         "op_code": op_code(op.type)}
    extra = _CATEGORY.get(op.type)
    if extra is not None:
        extra(tensors, op, f, main)
    return f


def op_code(op_type: str) -> int:
    """The `op_code` feature: the op's TFLite builtin code, -1 for an op without one."""
    return _op_codes().get(op_type, -1)


@lru_cache(maxsize=1)
def _op_codes() -> dict[str, int]:
    # LiteRT's BuiltinOperator codes, kept as data (tflite_op_codes.json, checked against the
    # installed schema by a test) so that machines without LiteRT (the CUDA device machine)
    # can still sample, deduce and measure.
    import json
    from importlib.resources import files

    return json.loads(files("latpred.features").joinpath("tflite_op_codes.json").read_text())[
        "codes"]


# -- categories (each adds to the generic dict in place) ---------------------------------------
def _conv(tensors: tuple[Tensor, ...], op: Op, f: Features, main: Tensor | None) -> None:
    attrs = op.attr_dict
    w = tensors[op.inputs[1]].shape
    f["stride_h"], f["stride_w"] = attrs.get("stride", _ONES)
    f["kernel_h"], f["kernel_w"] = w[1], w[2]
    f["dilation_h"], f["dilation_w"] = attrs.get("dilation", _ONES)
    c = f["input_c"]
    if op.type == "DEPTHWISE_CONV_2D":
        f["filters"] = w[3]
        macs = w[1] * w[2]                      # per output element
        f["depth_multiplier"] = w[3] // c if c else 0
    else:
        f["filters"] = w[0]
        macs = w[1] * w[2] * w[3]
        f["groups"] = c // w[3] if w[3] else 1
        if w[3] == 1 and f["groups"] > 1:  # groups of one channel: a depthwise convolution
            f["depth_multiplier"] = w[0] // c if c else 0
    f["kernel_size"] = prod(w)
    out = f["output_size"]
    f["flops"] = 2 * out * macs + (out if len(op.inputs) > 2 and op.inputs[2] >= 0 else 0)


def _fully_connected(tensors: tuple[Tensor, ...], op: Op, f: Features,
                     main: Tensor | None) -> None:
    o, i = tensors[op.inputs[1]].shape
    rows = f["input_size"] // i if i else 0
    has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
    f.update(input_c=i, filters=o, rows=rows, kernel_size=o * i,
             param_size=o * i + (o if has_bias else 0),
             flops=2 * rows * i * o + (rows * o if has_bias else 0))


def _batch_matmul(tensors: tuple[Tensor, ...], op: Op, f: Features,
                  main: Tensor | None) -> None:
    attrs = op.attr_dict
    a, b = tensors[op.inputs[0]].shape, tensors[op.inputs[1]].shape
    m, k = (a[-1], a[-2]) if attrs.get("adj_x", False) else (a[-2], a[-1])
    n = b[-2] if attrs.get("adj_y", False) else b[-1]
    out = tensors[op.outputs[0]].shape
    batch = prod(out[:-2])
    f.update(batch=batch, m=m, k=k, n=n, flops=2 * batch * m * k * n)


def _pool(tensors: tuple[Tensor, ...], op: Op, f: Features, main: Tensor | None) -> None:
    attrs = op.attr_dict
    sh, sw = attrs.get("stride", (1, 1))
    kh, kw = attrs.get("filter", (1, 1))
    f.update(stride_h=sh, stride_w=sw, kernel_h=kh, kernel_w=kw,
             flops=f["output_size"] * kh * kw)


def _reduce(tensors: tuple[Tensor, ...], op: Op, f: Features, main: Tensor | None) -> None:
    shape = main.shape if main is not None else ()
    rank = len(shape)
    axes = tensors[op.inputs[1]].value if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    reduced = {a % rank for a in axes} if axes and rank else set()
    # NHWC-view position of each axis: H is axis rank-3 (rank >= 4), W is axis rank-2 (rank >= 3).
    h_axis, w_axis = (rank - 3 if rank >= 4 else -1), (rank - 2 if rank >= 3 else -1)
    out = f["output_size"]
    f.update(kernel_h=shape[h_axis] if h_axis in reduced else 1,
             kernel_w=shape[w_axis] if w_axis in reduced else 1,
             reduction_size=f["input_size"] // out if out else 0, flops=f["input_size"])


def _pad(tensors: tuple[Tensor, ...], op: Op, f: Features, main: Tensor | None) -> None:
    pads = tensors[op.inputs[1]].value if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    rank = len(main.shape) if main is not None else 0
    sums = tuple(pads[2 * i] + pads[2 * i + 1] for i in range(rank)) if pads else (0,) * rank
    view = hwc(sums, fill=0)
    f.update(pad_h=view[0], pad_w=view[1], pad_c=view[2],
             padding_size=f["output_size"] - f["input_size"])


def _elementwise(tensors: tuple[Tensor, ...], op: Op, f: Features,
                 main: Tensor | None) -> None:
    shapes = {tensors[t].shape for t in op.inputs if t >= 0}
    f["broadcast"] = 1 if len(shapes) > 1 else 0
    f["flops"] = f["output_size"]


_Category = Callable[[tuple[Tensor, ...], Op, Features, "Tensor | None"], None]
_CATEGORY: dict[str, _Category] = {
    "CONV_2D": _conv, "DEPTHWISE_CONV_2D": _conv, "FULLY_CONNECTED": _fully_connected,
    "BATCH_MATMUL": _batch_matmul, "AVERAGE_POOL_2D": _pool, "MAX_POOL_2D": _pool,
    "L2_POOL_2D": _pool, "PAD": _pad, "PADV2": _pad, "MIRROR_PAD": _pad,
    **{t: _reduce for t in REDUCE}, **{t: _elementwise for t in (*BINARY, *UNARY)},
}
