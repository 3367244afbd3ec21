"""Make graphs in code, with the ops and attributes the TFLite converter would emit.

    b = GraphBuilder("tiny")
    x = b.input((1, 32, 32, 3))
    y = b.conv2d(x, 16, 3, stride=2, activation="RELU6")
    y = b.squeeze_excite(b.depthwise_conv2d(y, 3), ratio=0.25)
    b.output(b.softmax(b.fully_connected(b.reshape(b.mean(y), (1, 16)), 10)))
    graph = b.build()

Every method returns the id of its output tensor (a list for split/split_v). Ids are only
meaningful inside this builder: `build()` drops what the converter would drop and renumbers.

What the converter does and the builder mirrors:
- weights are constant float32 tensors without data (filter [O, kh, kw, I/groups], depthwise
  filter [1, kh, kw, C*multiplier], FC weights [O, I], bias [O]); shape operands (mean axes,
  pad paddings, reshape shape, transpose permutation, split axis/sizes) are constant int32
  tensors whose `value` holds their data;
- a standalone RELU, RELU6 or RELU_N1_TO_1 that reads the only use of a CONV_2D,
  DEPTHWISE_CONV_2D, FULLY_CONNECTED, pooling, ADD, SUB, MUL or DIV output with no fused
  activation is folded into that op's `activation` at `build()`, as the MLIR converter's
  optimize patterns do (no other activation is fused; `fuse_activations=False` keeps them all);
- swish is LOGISTIC then MUL(x, sigmoid); hard-sigmoid (in squeeze-excite) is ADD(x, 3) with a
  fused RELU6 then MUL(1/6); operations whose results reach no output are dropped.
"""

from __future__ import annotations

import operator
from typing import Iterable, Sequence

from latpred.build_passes import _finish
from latpred.errors import ShapeError
from latpred.graph import ACTIVATIONS, Graph, Op, Tensor
from latpred.shapes import infer_shapes, reshape_target, resolve_sizes
from latpred.windows import pair


class GraphBuilder:
    """Accumulates tensors and ops; `build()` returns the frozen `Graph`."""

    def __init__(self, name: str = "", fuse_activations: bool = True) -> None:
        self.name = name
        self.fuse_activations = fuse_activations
        self._tensors: list[Tensor] = []
        self._ops: list[Op] = []
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._taken: set[str] = set()      # tensor names in use
        self._prefixes: set[str] = set()   # name prefixes handed out by _base
        self._counts: dict[str, int] = {}  # next suffix to try per requested name

    # -- tensors -------------------------------------------------------------------------------
    def shape(self, x: int) -> tuple[int, ...]:
        """The shape of tensor `x`."""
        return self._get(x).shape

    def input(self, shape: Sequence[int], name: str | None = None,
              dtype: str = "float32") -> int:
        """A graph input of a fixed shape (NHWC for images)."""
        shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in shape):
            raise ShapeError(f"Input shape {shape} must have positive dimensions.")
        t = self._tensor(self._base(name, "input"), shape, dtype)
        self._inputs.append(t)
        return t

    def constant(self, shape: Sequence[int], dtype: str = "float32",
                 value: Sequence[int] | None = None, name: str | None = None) -> int:
        """A constant tensor; `value` (flattened ints) only for shape-like int operands."""
        return self._tensor(name or self._base(None, "const"), tuple(shape), dtype, constant=True,
                            value=None if value is None else tuple(int(v) for v in value))

    def output(self, *ids: int) -> None:
        """Mark graph outputs (default at build: every tensor no op reads)."""
        for t in ids:
            self._get(t)
            if t not in self._outputs:
                self._outputs.append(t)

    # -- convolutions and dense layers ---------------------------------------------------------
    def conv2d(self, x: int, filters: int, kernel, stride=1, padding: str = "SAME", dilation=1,
               groups: int = 1, activation: str = "NONE", name: str | None = None) -> int:
        """CONV_2D; groups > 1 gives a grouped conv (filter [O, kh, kw, C/groups]). Always with
        a bias tensor, as TFLiteConverter gives a bias-less convolution a zero bias: LiteRT's
        CONV_2D does not run without one (tflite/kernels/conv.cc Prepare,
        TF_LITE_ENSURE(context, has_bias); LiteRT f67457790), on the CPU or the GPU
        accelerator (`datasets/h100-gpu-memory`, run 7: compile status 3)."""
        c = self._channels(x, "conv2d")
        kh, kw = pair(kernel, "conv2d kernel")
        filters, groups = _count(filters, "conv2d filters"), _count(groups, "conv2d groups")
        if groups < 1 or c % groups or filters % groups:
            raise ShapeError(f"conv2d groups={groups} must divide both the {c} input channels "
                             f"and the {filters} filters.")
        base = self._base(name, "conv2d")
        w = self.constant((filters, kh, kw, c // groups), name=f"{base}/filter")
        b = self.constant((filters,), name=f"{base}/bias")
        return self._op("CONV_2D", (x, w, b), base, stride=pair(stride, "conv2d stride"),
                        padding=padding, dilation=pair(dilation, "conv2d dilation"),
                        activation=_activation(activation), groups=groups)[0]

    def depthwise_conv2d(self, x: int, kernel, stride=1, padding: str = "SAME",
                         depth_multiplier: int = 1, dilation=1, activation: str = "NONE",
                         name: str | None = None) -> int:
        """DEPTHWISE_CONV_2D with filter [1, kh, kw, C * depth_multiplier] and, as `conv2d`, a
        bias tensor (LiteRT's kernel reads a third input as a bias and refuses an absent one
        there: tflite/kernels/depthwise_conv.cc Prepare)."""
        c = self._channels(x, "depthwise_conv2d")
        kh, kw = pair(kernel, "depthwise_conv2d kernel")
        depth_multiplier = _count(depth_multiplier, "depthwise_conv2d depth_multiplier")
        o = c * depth_multiplier
        base = self._base(name, "depthwise_conv2d")
        w = self.constant((1, kh, kw, o), name=f"{base}/filter")
        b = self.constant((o,), name=f"{base}/bias")
        return self._op("DEPTHWISE_CONV_2D", (x, w, b), base,
                        stride=pair(stride, "depthwise_conv2d stride"), padding=padding,
                        dilation=pair(dilation, "depthwise_conv2d dilation"),
                        activation=_activation(activation), depth_multiplier=depth_multiplier)[0]

    def fully_connected(self, x: int, units: int, activation: str = "NONE", bias: bool = True,
                        keep_num_dims: bool | None = None, name: str | None = None) -> int:
        """FULLY_CONNECTED with weights [units, I]; keeps leading dims for rank > 2 by default."""
        shape = self.shape(x)
        units = _count(units, "fully_connected units")
        if not shape:
            raise ShapeError("fully_connected needs an input with a feature axis, got a scalar.")
        if keep_num_dims is None:
            keep_num_dims = len(shape) > 2   # what the converter emits for Dense on 3-D input
        base = self._base(name, "fully_connected")
        w = self.constant((units, shape[-1]), name=f"{base}/weights")
        b = self.constant((units,), name=f"{base}/bias") if bias else -1
        return self._op("FULLY_CONNECTED", (x, w, b), base, activation=_activation(activation),
                        keep_num_dims=bool(keep_num_dims))[0]

    # -- pooling and reductions ----------------------------------------------------------------
    def avg_pool(self, x: int, size, stride=None, padding: str = "VALID",
                 activation: str = "NONE", name: str | None = None) -> int:
        """AVERAGE_POOL_2D; stride defaults to the window size."""
        return self._pool("AVERAGE_POOL_2D", "avg_pool", x, size, stride, padding, activation,
                          name)

    def max_pool(self, x: int, size, stride=None, padding: str = "VALID",
                 activation: str = "NONE", name: str | None = None) -> int:
        """MAX_POOL_2D; stride defaults to the window size."""
        return self._pool("MAX_POOL_2D", "max_pool", x, size, stride, padding, activation, name)

    def _pool(self, op_type: str, prefix: str, x: int, size, stride, padding: str,
              activation: str, name: str | None) -> int:
        filt = pair(size, f"{prefix} size")
        stride = filt if stride is None else pair(stride, f"{prefix} stride")
        return self._op(op_type, (x,), self._base(name, prefix), stride=stride, padding=padding,
                        filter=filt, activation=_activation(activation))[0]

    def mean(self, x: int, axes: Sequence[int] = (1, 2), keep_dims: bool = True,
             name: str | None = None) -> int:
        """MEAN over `axes` (a constant int32 input); (1, 2) is global average pooling."""
        base = self._base(name, "mean")
        axes_t = self._int_const((len(axes),), axes, f"{base}/axes")
        return self._op("MEAN", (x, axes_t), base, keep_dims=bool(keep_dims))[0]

    # -- element-wise --------------------------------------------------------------------------
    def add(self, a: int, b: int, activation: str = "NONE", name: str | None = None) -> int:
        return self._binary("ADD", "add", a, b, activation, name)

    def sub(self, a: int, b: int, activation: str = "NONE", name: str | None = None) -> int:
        return self._binary("SUB", "sub", a, b, activation, name)

    def mul(self, a: int, b: int, activation: str = "NONE", name: str | None = None) -> int:
        return self._binary("MUL", "mul", a, b, activation, name)

    def div(self, a: int, b: int, activation: str = "NONE", name: str | None = None) -> int:
        return self._binary("DIV", "div", a, b, activation, name)

    def _binary(self, op_type: str, prefix: str, a: int, b: int, activation: str,
                name: str | None) -> int:
        return self._op(op_type, (a, b), self._base(name, prefix),
                        activation=_activation(activation))[0]

    def relu(self, x: int, name: str | None = None) -> int:
        return self._op("RELU", (x,), self._base(name, "relu"))[0]

    def relu6(self, x: int, name: str | None = None) -> int:
        return self._op("RELU6", (x,), self._base(name, "relu6"))[0]

    def sigmoid(self, x: int, name: str | None = None) -> int:
        return self._op("LOGISTIC", (x,), self._base(name, "sigmoid"))[0]

    def hard_swish(self, x: int, name: str | None = None) -> int:
        return self._op("HARD_SWISH", (x,), self._base(name, "hard_swish"))[0]

    def tanh(self, x: int, name: str | None = None) -> int:
        return self._op("TANH", (x,), self._base(name, "tanh"))[0]

    def gelu(self, x: int, approximate: bool = False, name: str | None = None) -> int:
        return self._op("GELU", (x,), self._base(name, "gelu"), approximate=bool(approximate))[0]

    def swish(self, x: int, name: str | None = None) -> int:
        """x * sigmoid(x) as the converter emits it: LOGISTIC then MUL."""
        base = self._base(name, "swish")
        gate = self.sigmoid(x, name=f"{base}/sigmoid")
        return self._op("MUL", (x, gate), base, activation="NONE")[0]

    def softmax(self, x: int, beta: float = 1.0, name: str | None = None) -> int:
        return self._op("SOFTMAX", (x,), self._base(name, "softmax"), beta=float(beta))[0]

    # -- data movement -------------------------------------------------------------------------
    def pad(self, x: int, paddings, name: str | None = None) -> int:
        """PAD. `paddings`: an int p (p on each side of H and W), ((top, bottom), (left,
        right)) for a rank-4 input, or one (before, after) pair per axis."""
        pads = _paddings(paddings, self.shape(x))
        base = self._base(name, "pad")
        flat = tuple(v for p in pads for v in p)
        return self._op("PAD", (x, self._int_const((len(pads), 2), flat, f"{base}/paddings")),
                        base)[0]

    def concat(self, xs: Iterable[int], axis: int = -1, activation: str = "NONE",
               name: str | None = None) -> int:
        """CONCATENATION along `axis` (stored non-negative)."""
        xs = tuple(xs)
        if not xs:
            raise ShapeError("concat needs at least one input.")
        rank = len(self.shape(xs[0]))
        return self._op("CONCATENATION", xs, self._base(name, "concat"),
                        axis=_norm_axis(axis, rank, "concat"),
                        activation=_activation(activation))[0]

    def split(self, x: int, n: int, axis: int = -1, name: str | None = None) -> list[int]:
        """SPLIT into `n` equal parts; the axis is a constant int32 input 0."""
        base = self._base(name, "split")
        axis_t = self._int_const((), (_norm_axis(axis, len(self.shape(x)), "split"),),
                                 f"{base}/axis")
        return self._op("SPLIT", (axis_t, x), base, num_splits=_count(n, "split parts"))

    def split_v(self, x: int, sizes: Sequence[int], axis: int = -1,
                name: str | None = None) -> list[int]:
        """SPLIT_V into parts of `sizes` (one may be -1) along `axis`: inputs (x, sizes, axis)."""
        shape = self.shape(x)
        axis = _norm_axis(axis, len(shape), "split_v")
        sizes = resolve_sizes(tuple(int(s) for s in sizes), shape[axis],
                              f"split_v of dimension {axis} of {shape}")
        base = self._base(name, "split_v")
        sizes_t = self._int_const((len(sizes),), sizes, f"{base}/sizes")
        axis_t = self._int_const((), (axis,), f"{base}/axis")
        return self._op("SPLIT_V", (x, sizes_t, axis_t), base, num_splits=len(sizes))

    def reshape(self, x: int, shape: Sequence[int], name: str | None = None) -> int:
        """RESHAPE to `shape` (one -1 allowed; stored resolved, as the converter folds it)."""
        target = reshape_target(self._get(x).size, tuple(int(d) for d in shape))
        base = self._base(name, "reshape")
        return self._op("RESHAPE", (x, self._int_const((len(target),), target, f"{base}/shape")),
                        base)[0]

    def dynamic_reshape(self, x: int, shape: Sequence[int], name: str | None = None) -> int:
        """RESHAPE to `shape` as TFLiteConverter writes a Keras Reshape with a dynamic batch
        (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE; see `latpred.idioms`)."""
        from latpred.idioms import dynamic_reshape

        return dynamic_reshape(self, x, shape, name)

    def transpose(self, x: int, perm: Sequence[int], name: str | None = None) -> int:
        """TRANSPOSE with a constant int32 permutation."""
        base = self._base(name, "transpose")
        perm = tuple(int(p) for p in perm)
        return self._op("TRANSPOSE", (x, self._int_const((len(perm),), perm, f"{base}/perm")),
                        base)[0]

    # -- blocks --------------------------------------------------------------------------------
    def squeeze_excite(self, x: int, ratio: float = 0.25, gate: str = "sigmoid",
                       reduced: int | None = None, keep_dims: bool = True,
                       name: str | None = None) -> int:
        """Squeeze-and-excite: MEAN(keep_dims) -> 1x1 CONV_2D (RELU) -> 1x1 CONV_2D -> gate ->
        MUL(x, gate). `gate` "sigmoid" is LOGISTIC; "hard_sigmoid" is ADD(3, RELU6) then
        MUL(1/6), as MobileNetV3 converts. `reduced` channels default to max(1, round(C*ratio)).
        `keep_dims=False` squeezes as Keras's EfficientNet converts: MEAN without keep_dims,
        then `dynamic_reshape` back to (1, 1, 1, C)."""
        c = self._channels(x, "squeeze_excite")
        mid = reduced if reduced is not None else max(1, round(c * ratio))
        base = self._base(name, "squeeze_excite")
        if keep_dims:
            s = self.mean(x, (1, 2), keep_dims=True, name=f"{base}/squeeze")
        else:
            s = self.mean(x, (1, 2), keep_dims=False, name=f"{base}/squeeze")
            s = self.dynamic_reshape(s, (1, 1, 1, c), name=f"{base}/reshape")
        s = self.conv2d(s, mid, 1, activation="RELU", name=f"{base}/reduce")
        s = self.conv2d(s, c, 1, name=f"{base}/expand")
        if gate == "sigmoid":
            s = self.sigmoid(s, name=f"{base}/gate")
        elif gate == "hard_sigmoid":
            s = self.add(s, self.constant((), name=f"{base}/three"), activation="RELU6",
                         name=f"{base}/gate_add")
            s = self.mul(s, self.constant((), name=f"{base}/one_sixth"), name=f"{base}/gate")
        else:
            raise ShapeError(f"squeeze_excite gate must be 'sigmoid' or 'hard_sigmoid', "
                             f"got {gate!r}.")
        return self._op("MUL", (x, s), base, activation="NONE")[0]

    # -- build ---------------------------------------------------------------------------------
    def build(self) -> Graph:
        """The frozen Graph: activations fused, dead ops dropped, tensors renumbered."""
        return _finish(self._tensors, self._ops, self._inputs, self._outputs, self.name,
                      self.fuse_activations)

    # -- internals -----------------------------------------------------------------------------
    def _get(self, x: int) -> Tensor:
        if not isinstance(x, int) or not 0 <= x < len(self._tensors):
            raise ShapeError(f"{x!r} is not a tensor id of this builder.")
        return self._tensors[x]

    def _channels(self, x: int, what: str) -> int:
        shape = self.shape(x)
        if len(shape) != 4:
            raise ShapeError(f"{what} needs a rank-4 NHWC input, got shape {shape}.")
        return shape[3]

    def _base(self, name: str | None, prefix: str) -> str:
        """A unique readable name for an op's tensors: 'conv2d', 'conv2d_1', ... ."""
        root = name or prefix
        k = self._counts.get(root, 0)
        cand = root if k == 0 else f"{root}_{k}"
        while cand in self._prefixes or cand in self._taken:
            k += 1
            cand = f"{root}_{k}"
        self._counts[root] = k + 1
        self._prefixes.add(cand)
        return cand

    def _tensor(self, name: str, shape: tuple[int, ...], dtype: str, constant: bool = False,
                value: tuple[int, ...] | None = None) -> int:
        unique, k = name, 0
        while unique in self._taken:
            k += 1
            unique = f"{name}_{k}"
        self._taken.add(unique)
        self._tensors.append(Tensor(unique, shape, dtype, None, constant, value))
        return len(self._tensors) - 1

    def _int_const(self, shape: tuple[int, ...], value: Sequence[int], name: str) -> int:
        return self.constant(shape, "int32", value, name)

    def _op(self, op_type: str, inputs: Sequence[int], base: str, **attrs) -> list[int]:
        ins = [self._get(t) if t != -1 else None for t in inputs]
        shapes = infer_shapes(op_type, ins, attrs)
        dtype = ins[0].dtype if op_type not in ("SPLIT",) else ins[1].dtype
        outs = [self._tensor(base if len(shapes) == 1 else f"{base}:{k}", s, dtype)
                for k, s in enumerate(shapes)]
        # Attribute values here are already ints, strs and tuples: no freezing needed.
        self._ops.append(Op(op_type, tuple(inputs), tuple(outs), tuple(sorted(attrs.items()))))
        return outs


    def _raw(self, op_type: str, inputs: Sequence[int], outs: Sequence[tuple[tuple, str]],
             base: str, **attrs) -> list[int]:
        """An op whose output shapes the caller knows (no rule infers them from runtime values)."""
        for t in inputs:
            self._get(t)
        ids = [self._tensor(base if len(outs) == 1 else f"{base}:{k}", shape, dtype)
               for k, (shape, dtype) in enumerate(outs)]
        self._ops.append(Op(op_type, tuple(inputs), tuple(ids), tuple(sorted(attrs.items()))))
        return ids


def _count(v, what: str) -> int:
    """A positive int (numpy ints accepted, stored as Python ints)."""
    try:
        v = operator.index(v)
    except TypeError:
        raise ShapeError(f"{what} must be an int, got {v!r}.") from None
    if v < 1:
        raise ShapeError(f"{what} must be positive, got {v}.")
    return v


def _activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ShapeError(f"Unknown fused activation {name!r}; expected one of {ACTIVATIONS}.")
    return name


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} axis {axis} is out of range for a rank-{rank} tensor.")
    return axis % rank


def _paddings(paddings, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Normalise the accepted spellings to one (before, after) pair per axis."""
    if isinstance(paddings, int):
        paddings = ((paddings, paddings), (paddings, paddings))
    pads = tuple(tuple(int(v) for v in p) for p in paddings)
    if len(pads) == 2 and len(shape) == 4:
        pads = ((0, 0), *pads, (0, 0))
    if len(pads) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ShapeError(f"pad paddings {paddings!r} must give non-negative (before, after) "
                         f"pairs for the {len(shape)} axes of {shape}.")
    return pads
