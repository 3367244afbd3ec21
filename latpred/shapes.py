"""Shape inference per operation type.

`infer_shapes(op_type, inputs, attrs)` computes the output shapes an operation produces from its
input tensors and attributes, with TFLite's own formulas (SAME/VALID padding with dilation,
NumPy broadcasting for element-wise ops, the masks of STRIDED_SLICE, ...). The builder uses it to
make output tensors; `latpred.graph_checks.validate_graph` uses it to check a graph read from a
file. Both raise `ShapeError` with one sentence when shapes do not fit.

An op type without a rule here, or an op whose shape operands are not constant (so the output
shape is only known at run time), is not checked: `infer_shapes` returns None for it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from latpred.errors import ShapeError
from latpred.graph import Tensor
from latpred.windows import out_size, pair

Shape = tuple[int, ...]
Inputs = Sequence[Tensor | None]   # None stands for an absent optional input (-1)
Rule = Callable[[Inputs, Mapping], "list[Shape] | None"]


# -- helpers ---------------------------------------------------------------------------------
def _rank(t: Tensor, rank: int, what: str) -> None:
    if len(t.shape) != rank:
        raise ShapeError(f"{what} needs a rank-{rank} input, got shape {t.shape}.")


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} axis {axis} is out of range for a rank-{rank} tensor.")
    return axis % rank if rank else 0


def _window(x: Tensor, kh: int, kw: int, attrs: Mapping, what: str) -> tuple[int, int]:
    sh, sw = pair(attrs.get("stride", (1, 1)), f"{what} stride")
    dh, dw = pair(attrs.get("dilation", (1, 1)), f"{what} dilation")
    padding = attrs.get("padding", "SAME")
    ho = out_size(x.shape[1], kh, sh, dh, padding)
    wo = out_size(x.shape[2], kw, sw, dw, padding)
    if ho < 1 or wo < 1:
        raise ShapeError(f"{what} window {kh}x{kw} (dilation {dh}x{dw}) with {padding} padding "
                         f"does not fit the {x.shape[1]}x{x.shape[2]} input.")
    return ho, wo


def broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two shapes, as TFLite's element-wise kernels do."""
    if a == b:
        return a
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"Shapes {a} and {b} cannot be broadcast together.")
        out.append(y if x == 1 else x)
    return tuple(out)


# -- rules -----------------------------------------------------------------------------------
def _conv2d(ins: Inputs, attrs: Mapping) -> list[Shape]:
    x, w = ins[0], ins[1]
    _rank(x, 4, "CONV_2D")
    _rank(w, 4, "CONV_2D filter")
    o, kh, kw, ci = w.shape
    c = x.shape[3]
    if ci < 1 or c % ci:
        raise ShapeError(f"CONV_2D input has {c} channels, which the filter's {ci} input "
                         "channels per group do not divide.")
    groups = c // ci
    if attrs.get("groups", groups) != groups:
        raise ShapeError(f"CONV_2D groups={attrs['groups']} does not match {c} input channels "
                         f"and {ci} filter input channels.")
    if o % groups:
        raise ShapeError(f"CONV_2D has {o} filters, not divisible by its {groups} groups.")
    _bias(ins, o, "CONV_2D")
    ho, wo = _window(x, kh, kw, attrs, "CONV_2D")
    return [(x.shape[0], ho, wo, o)]


def _depthwise(ins: Inputs, attrs: Mapping) -> list[Shape]:
    x, w = ins[0], ins[1]
    _rank(x, 4, "DEPTHWISE_CONV_2D")
    _rank(w, 4, "DEPTHWISE_CONV_2D filter")
    one, kh, kw, o = w.shape
    c = x.shape[3]
    if one != 1 or c < 1 or o % c:
        raise ShapeError(f"DEPTHWISE_CONV_2D filter {w.shape} does not fit an input with {c} "
                         "channels (expected [1, kh, kw, channels * multiplier]).")
    _bias(ins, o, "DEPTHWISE_CONV_2D")
    ho, wo = _window(x, kh, kw, attrs, "DEPTHWISE_CONV_2D")
    return [(x.shape[0], ho, wo, o)]


def _bias(ins: Inputs, o: int, what: str) -> None:
    if len(ins) > 2 and ins[2] is not None and ins[2].shape != (o,):
        raise ShapeError(f"{what} bias has shape {ins[2].shape}, expected ({o},).")


def _fully_connected(ins: Inputs, attrs: Mapping) -> list[Shape]:
    x, w = ins[0], ins[1]
    _rank(w, 2, "FULLY_CONNECTED weights")
    o, i = w.shape
    _bias(ins, o, "FULLY_CONNECTED")
    if attrs.get("keep_num_dims", False):
        if not x.shape or x.shape[-1] != i:
            raise ShapeError(f"FULLY_CONNECTED input {x.shape} does not end in the weights' "
                             f"{i} input features.")
        return [x.shape[:-1] + (o,)]
    if i < 1 or x.size % i:
        raise ShapeError(f"FULLY_CONNECTED input {x.shape} has {x.size} elements, not a "
                         f"multiple of the weights' {i} input features.")
    return [(x.size // i, o)]


def _pool(ins: Inputs, attrs: Mapping) -> list[Shape]:
    x = ins[0]
    _rank(x, 4, "Pooling")
    fh, fw = pair(attrs.get("filter", (1, 1)), "Pooling filter")
    ho, wo = _window(x, fh, fw, {**attrs, "dilation": (1, 1)}, "Pooling")
    return [(x.shape[0], ho, wo, x.shape[3])]


def _reduce(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x = ins[0]
    axes = ins[1].value
    if axes is None:
        return None
    rank = len(x.shape)
    reduced = {_axis(a, rank, "Reduction") for a in axes}
    if attrs.get("keep_dims", False):
        return [tuple(1 if i in reduced else d for i, d in enumerate(x.shape))]
    return [tuple(d for i, d in enumerate(x.shape) if i not in reduced)]


def _binary(ins: Inputs, attrs: Mapping) -> list[Shape]:
    return [broadcast(ins[0].shape, ins[1].shape)]


def _unary(ins: Inputs, attrs: Mapping) -> list[Shape]:
    return [ins[0].shape]


def _concat(ins: Inputs, attrs: Mapping) -> list[Shape]:
    if any(t is None for t in ins):
        raise ShapeError("CONCATENATION has an absent input.")
    first = ins[0].shape
    axis = _axis(attrs.get("axis", 0), len(first), "CONCATENATION")
    total = 0
    for t in ins:
        s = t.shape
        if len(s) != len(first) or s[:axis] != first[:axis] or s[axis + 1:] != first[axis + 1:]:
            raise ShapeError(f"CONCATENATION along axis {axis} needs matching shapes elsewhere, "
                             f"got {first} and {s}.")
        total += s[axis]
    return [first[:axis] + (total,) + first[axis + 1:]]


def _split(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    axis_v, x = ins[0].value, ins[1]
    if axis_v is None:
        return None
    axis = _axis(axis_v[0], len(x.shape), "SPLIT")
    n = attrs.get("num_splits", 1)
    if n < 1 or x.shape[axis] % n:
        raise ShapeError(f"SPLIT cannot cut dimension {axis} of {x.shape} into {n} equal parts.")
    part = x.shape[:axis] + (x.shape[axis] // n,) + x.shape[axis + 1:]
    return [part] * n


def _split_v(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x = ins[0]
    sizes, axis_v = ins[1].value, ins[2].value
    if sizes is None or axis_v is None:
        return None
    axis = _axis(axis_v[0], len(x.shape), "SPLIT_V")
    sizes = resolve_sizes(sizes, x.shape[axis], f"SPLIT_V of dimension {axis} of {x.shape}")
    return [x.shape[:axis] + (s,) + x.shape[axis + 1:] for s in sizes]


def resolve_sizes(sizes: Sequence[int], total: int, what: str) -> tuple[int, ...]:
    """Sizes with at most one -1 (the remainder) that must add up to `total`."""
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in sizes):
        raise ShapeError(f"{what}: sizes {tuple(sizes)} may hold one -1 and no other negative.")
    known = sum(s for s in sizes if s != -1)
    sizes = list(sizes)
    if unknown:
        sizes[unknown[0]] = total - known
    if sum(sizes) != total or any(s < 0 for s in sizes):
        raise ShapeError(f"{what}: sizes {tuple(sizes)} do not add up to {total}.")
    return tuple(sizes)


def reshape_target(in_size: int, shape: Sequence[int]) -> Shape:
    """A reshape's output shape, resolving one -1, checking the element count."""
    shape = tuple(shape)
    known = 1
    for d in shape:
        if d != -1:
            known *= d
    unknown = shape.count(-1)
    if unknown > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"RESHAPE to {shape} may hold one -1 and no other negative size.")
    if unknown:
        if known == 0 or in_size % known:
            raise ShapeError(f"RESHAPE cannot fit {in_size} elements into {shape}.")
        shape = tuple(in_size // known if d == -1 else d for d in shape)
    elif known != in_size:
        raise ShapeError(f"RESHAPE cannot fit {in_size} elements into {shape}.")
    return shape


def _reshape(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x = ins[0]
    shape = ins[1].value if len(ins) > 1 and ins[1] is not None else None
    if shape is None:
        shape = attrs.get("new_shape") or None
    if shape is None:
        return None
    return [reshape_target(x.size, shape)]


def _transpose(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x, perm = ins[0], ins[1].value
    if perm is None:
        return None
    if sorted(p % len(x.shape) if x.shape else p for p in perm) != list(range(len(x.shape))):
        raise ShapeError(f"TRANSPOSE permutation {tuple(perm)} is not a permutation of the "
                         f"{len(x.shape)} axes of {x.shape}.")
    return [tuple(x.shape[p] for p in perm)]


def _pad(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x, pads = ins[0], ins[1].value
    if pads is None:
        return None
    if len(pads) != 2 * len(x.shape) or min(pads, default=0) < 0:
        raise ShapeError(f"PAD paddings {tuple(pads)} do not give non-negative (before, after) "
                         f"pairs for each of the {len(x.shape)} axes of {x.shape}.")
    return [tuple(d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape))]


def _strided_slice(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x = ins[0]
    begin, end, strides = (t.value for t in ins[1:4])
    if begin is None or end is None or strides is None:
        return None
    if attrs.get("ellipsis_mask", 0) or attrs.get("new_axis_mask", 0):
        return None  # rare in converted CNNs/ViTs; not checked
    bmask, emask = attrs.get("begin_mask", 0), attrs.get("end_mask", 0)
    shrink, offset = attrs.get("shrink_axis_mask", 0), attrs.get("offset", False)
    out = []
    for i, dim in enumerate(x.shape):
        if i >= len(begin):
            out.append(dim)
            continue
        s = strides[i]
        if s == 0:
            raise ShapeError("STRIDED_SLICE strides must not be zero.")
        b = begin[i]
        if shrink >> i & 1:
            if not -dim <= b < dim:
                raise ShapeError(f"STRIDED_SLICE index {b} is out of range for axis {i} of "
                                 f"{x.shape}.")
            continue
        e = b + end[i] if offset else end[i]
        lo, hi = (0, dim) if s > 0 else (-1, dim - 1)
        start = (lo if s > 0 else hi) if bmask >> i & 1 else min(max(b + dim if b < 0 else b, lo), hi)
        stop = (hi if s > 0 else lo) if emask >> i & 1 else min(max(e + dim if e < 0 else e, lo), hi)
        out.append(max(0, -(-(stop - start) // s)))
    return [tuple(out)]


def _batch_matmul(ins: Inputs, attrs: Mapping) -> list[Shape]:
    a, b = ins[0].shape, ins[1].shape
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"BATCH_MATMUL needs rank >= 2 operands, got {a} and {b}.")
    m, k = (a[-1], a[-2]) if attrs.get("adj_x", False) else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if attrs.get("adj_y", False) else (b[-2], b[-1])
    if k != k2:
        raise ShapeError(f"BATCH_MATMUL inner dimensions differ: {a} and {b}.")
    return [broadcast(a[:-2], b[:-2]) + (m, n)]


def _transpose_conv(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    shape = ins[0].value
    return None if shape is None else [tuple(shape)]


def _resize(ins: Inputs, attrs: Mapping) -> list[Shape] | None:
    x, size = ins[0], ins[1].value
    _rank(x, 4, "Resize")
    return None if size is None else [(x.shape[0], size[0], size[1], x.shape[3])]


BINARY = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
          "FLOOR_DIV", "FLOOR_MOD", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL",
          "NOT_EQUAL", "LOGICAL_AND", "LOGICAL_OR")
UNARY = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LOGISTIC", "TANH", "HARD_SWISH",
         "GELU", "LEAKY_RELU", "PRELU", "ELU", "QUANTIZE", "DEQUANTIZE", "EXP", "LOG", "SQRT",
         "RSQRT", "ABS", "NEG", "SQUARE", "CAST", "FLOOR", "CEIL", "ROUND", "SIN", "COS",
         "LOGICAL_NOT", "SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION",
         "LOCAL_RESPONSE_NORMALIZATION", "ZEROS_LIKE", "ONES_LIKE", "SIGN")
REDUCE = ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL")

RULES: Mapping[str, Rule] = {
    "CONV_2D": _conv2d, "DEPTHWISE_CONV_2D": _depthwise, "FULLY_CONNECTED": _fully_connected,
    "AVERAGE_POOL_2D": _pool, "MAX_POOL_2D": _pool, "L2_POOL_2D": _pool,
    "CONCATENATION": _concat, "SPLIT": _split, "SPLIT_V": _split_v, "RESHAPE": _reshape,
    "TRANSPOSE": _transpose, "PAD": _pad, "PADV2": _pad, "MIRROR_PAD": _pad,
    "STRIDED_SLICE": _strided_slice, "BATCH_MATMUL": _batch_matmul,
    "TRANSPOSE_CONV": _transpose_conv, "RESIZE_BILINEAR": _resize,
    "RESIZE_NEAREST_NEIGHBOR": _resize,
    **{t: _binary for t in BINARY}, **{t: _unary for t in UNARY}, **{t: _reduce for t in REDUCE},
}

# Inputs each rule reads; fewer present means a malformed op.
_MIN_INPUTS = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 2, "SPLIT": 2,
               "SPLIT_V": 3, "TRANSPOSE": 2, "PAD": 2, "PADV2": 2, "MIRROR_PAD": 2,
               "STRIDED_SLICE": 4, "BATCH_MATMUL": 2, "RESIZE_BILINEAR": 2,
               "RESIZE_NEAREST_NEIGHBOR": 2, "TRANSPOSE_CONV": 3,
               **{t: 2 for t in BINARY}, **{t: 2 for t in REDUCE}}


def infer_shapes(op_type: str, inputs: Inputs, attrs: Mapping) -> list[Shape] | None:
    """Output shapes of an `op_type` op on `inputs`, or None when there is no rule for it.

    Raises ShapeError when the inputs and attributes do not fit the operation.
    """
    rule = RULES.get(op_type)
    if rule is None:
        return None
    need = _MIN_INPUTS.get(op_type, 1)
    present = [t for t in inputs[:need] if t is not None]
    if len(inputs) < need or len(present) < need:
        raise ShapeError(f"{op_type} needs {need} inputs, got {len(present)}.")
    try:
        return rule(inputs, attrs)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        # Malformed operands from a damaged file (empty axis tensor, wrong attribute type).
        raise ShapeError(f"{op_type} has malformed operands or attributes.") from None
