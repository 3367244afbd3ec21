"""PyTorch implementations of latpred op types, as a NHWC framework runs them on cuDNN.

Every value is kept in the graph's own layout (NHWC, contiguous); a 4-D tensor viewed as NCHW
with `permute(0, 3, 1, 2)` is exactly a `channels_last` tensor, so convolutions and pools take
and return channels_last tensors with no copy, and element-wise, reduction and data-movement ops
act on the NHWC view. Each op is what a PyTorch model would launch for the layer:

- CONV_2D / DEPTHWISE_CONV_2D: `F.conv2d` with bias (cuDNN; groups for grouped and depthwise),
  then the fused activation as its own in-place kernel;
- FULLY_CONNECTED: `F.linear` (cuBLAS GEMM with the bias), then the activation;
- pools: `F.max_pool2d` / `F.avg_pool2d`; MEAN: `torch.mean`;
- RESHAPE of a contiguous tensor is a view (no kernel); TRANSPOSE is materialised
  (`permute().contiguous()`, one copy kernel); SPLIT / SPLIT_V / STRIDED_SLICE / SLICE
  materialise each part that is not contiguous (one copy kernel each);
- SAME padding: symmetric padding that gives TFLite's output size (what a PyTorch model uses;
  the cost is the same), or, with `exact=True`, TFLite's asymmetric padding through `F.pad`
  (numerically identical to LiteRT; for tests).

`OPS[op_type](layer, xs) -> list[Tensor]` runs one op; `layer` holds its attributes and weights.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

OpFn = Callable[["object", list[torch.Tensor]], list[torch.Tensor]]


def nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1)


def activation(y: torch.Tensor, act: str, inplace: bool = True) -> torch.Tensor:
    """A fused activation as its own kernel (in place on a fresh result)."""
    if act == "NONE":
        return y
    if act == "RELU":
        return F.relu_(y) if inplace else F.relu(y)
    if act == "RELU6":
        return F.hardtanh_(y, 0.0, 6.0) if inplace else F.hardtanh(y, 0.0, 6.0)
    if act == "RELU_N1_TO_1":
        return F.hardtanh_(y, -1.0, 1.0) if inplace else F.hardtanh(y, -1.0, 1.0)
    if act == "TANH":
        return y.tanh_() if inplace else torch.tanh(y)
    raise NotImplementedError(f"fused activation {act}")


def _window_input(layer, x: torch.Tensor, pad_value: float = 0.0):
    """The NCHW input and the symmetric padding the window op gets."""
    xc = nchw(x)
    sym, asym = layer.pad_sym, layer.pad_asym
    if asym is not None and (layer.exact or None in sym):
        return F.pad(xc, asym, value=pad_value), (0, 0)
    return xc, sym


def conv(layer, xs):
    xc, pad = _window_input(layer, xs[0])
    y = F.conv2d(xc, layer.weight, layer.bias, layer.stride, pad, layer.dilation, layer.groups)
    return [nhwc(activation(y, layer.act))]


def fully_connected(layer, xs):
    x = xs[0].reshape(-1, layer.weight.shape[1])
    y = activation(F.linear(x, layer.weight, layer.bias), layer.act)
    return [y.reshape(layer.out_shapes[0])]


def max_pool(layer, xs):
    xc, pad = _window_input(layer, xs[0], pad_value=-math.inf)
    y = F.max_pool2d(xc, layer.filter, layer.stride, pad)
    return [nhwc(activation(y, layer.act))]


def avg_pool(layer, xs):
    xc, pad = _window_input(layer, xs[0])
    # TFLite averages over the valid pixels only: count_include_pad=False; exact mode divides
    # by the pooled count of the valid pixels instead, since F.pad's zeros would be counted.
    y = F.avg_pool2d(xc, layer.filter, layer.stride, pad, count_include_pad=False)
    if xc.shape != nchw(xs[0]).shape:   # F.pad made room: exact mode's asymmetric padding
        ones = F.pad(torch.ones_like(nchw(xs[0])[:1, :1]), layer.pad_asym)
        y = y / F.avg_pool2d(ones, layer.filter, layer.stride)
    return [nhwc(activation(y, layer.act))]


def mean(layer, xs):
    return [torch.mean(xs[0], dim=layer.axes, keepdim=layer.keep_dims)]


def _operands(layer, xs):
    return [getattr(layer, f"const{i}") if i in layer.const_inputs else xs[i]
            for i in range(layer.n_inputs)]


_BINARY = {"ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "DIV": torch.div,
           "MAXIMUM": torch.maximum, "MINIMUM": torch.minimum, "POW": torch.pow,
           "SQUARED_DIFFERENCE": lambda a, b: torch.square(a - b)}
_UNARY = {"RELU": F.relu, "RELU6": lambda x: F.hardtanh(x, 0.0, 6.0),
          "RELU_N1_TO_1": lambda x: F.hardtanh(x, -1.0, 1.0), "LOGISTIC": torch.sigmoid,
          "TANH": torch.tanh, "HARD_SWISH": F.hardswish, "EXP": torch.exp, "SQRT": torch.sqrt,
          "RSQRT": torch.rsqrt, "SQUARE": torch.square, "ABS": torch.abs, "NEG": torch.neg,
          "LOG": torch.log, "ELU": F.elu}


def binary(layer, xs):
    a, b = _operands(layer, xs)
    return [activation(_BINARY[layer.type](a, b), layer.act)]


def unary(layer, xs):
    return [_UNARY[layer.type](xs[0])]


def gelu(layer, xs):
    return [F.gelu(xs[0], approximate="tanh" if layer.approximate else "none")]


def leaky_relu(layer, xs):
    return [F.leaky_relu(xs[0], layer.alpha)]


def softmax(layer, xs):
    x = xs[0] if layer.beta == 1.0 else xs[0] * layer.beta
    return [torch.softmax(x, dim=-1)]


def concat(layer, xs):
    return [activation(torch.cat(_operands(layer, xs), dim=layer.axis), layer.act)]


def split(layer, xs):
    x = xs[layer.data_input]
    parts = torch.split(x, list(layer.sizes), dim=layer.axis)
    return [p.contiguous() for p in parts]


def reshape(layer, xs):
    return [xs[0].reshape(layer.out_shapes[0])]


def transpose(layer, xs):
    return [xs[0].permute(layer.perm).contiguous()]


def pad(layer, xs):
    return [F.pad(xs[0], layer.torch_pads, value=layer.pad_value)]


def strided_slice(layer, xs):
    y = xs[0][layer.index]
    return [y.contiguous()]


def batch_matmul(layer, xs):
    a, b = _operands(layer, xs)
    if layer.adj_x:
        a = a.transpose(-1, -2)
    if layer.adj_y:
        b = b.transpose(-1, -2)
    return [torch.matmul(a, b)]


OPS: dict[str, OpFn] = {
    "CONV_2D": conv, "DEPTHWISE_CONV_2D": conv, "FULLY_CONNECTED": fully_connected,
    "MAX_POOL_2D": max_pool, "AVERAGE_POOL_2D": avg_pool, "MEAN": mean,
    **{k: binary for k in _BINARY}, **{k: unary for k in _UNARY},
    "GELU": gelu, "LEAKY_RELU": leaky_relu, "SOFTMAX": softmax, "CONCATENATION": concat,
    "SPLIT": split, "SPLIT_V": split, "RESHAPE": reshape, "SQUEEZE": reshape,
    "EXPAND_DIMS": reshape, "TRANSPOSE": transpose, "PAD": pad, "PADV2": pad,
    "STRIDED_SLICE": strided_slice, "SLICE": strided_slice, "BATCH_MATMUL": batch_matmul,
}
