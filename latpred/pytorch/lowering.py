"""ATen op -> TFLite op lowerings for `export.py`, keyed by the op's overload-packet name.

Each handler gets the `Lowering`, the exported node, its arguments (lowered values: `Val` for
graph tensors, real tensors for weights and other constants, plain numbers) and returns the
node's value. What each writes is what the converters write for the same layer:

- conv2d/convolution: CONV_2D (groups kept), DEPTHWISE_CONV_2D when groups == input channels;
  SAME when TFLite's implicit padding equals torch's, VALID for none, else PAD + VALID.
- batch norm after a convolution or linear layer used once: folded; elsewhere MUL + ADD.
- linear/addmm/mm: FULLY_CONNECTED on torch's order, keep_num_dims as litert-torch's converter
  leaves it (`_dense`).
- relu/relu6/hardtanh(0, 6) -> RELU/RELU6 (fused into the producer by the builder), hardswish ->
  HARD_SWISH, hardsigmoid -> ADD(3, RELU6) + MUL(1/6), silu -> LOGISTIC + MUL, gelu -> GELU.
- adaptive average pool to 1x1 -> MEAN(keep_dims); to a divisor -> AVERAGE_POOL_2D; max pools
  padded by torch get a PADV2 of the lowest float before a VALID window (SAME when it matches).
- layer_norm over the last axis: litert-torch's lowering on [1, rows, C] (MEAN,
  SQUARED_DIFFERENCE, MEAN, ADD, RSQRT, MUL, SUB, MUL, ADD with RESHAPEs; see `movement.py`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from latpred.errors import UnsupportedOpError
from latpred.pytorch.export import Handler, Lowering, Val, module_path, op_name
from latpred.pytorch.layout import canonical
from latpred.windows import pair

BATCH_NORMS = ("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm",
               "_native_batch_norm_legit")
FOLDS_BN = ("conv2d", "convolution", "_convolution", "linear")
SKIP = ("sym_size", "sym_numel", "sym_stride", "_set_grad_enabled", "sym_constrain_range",
        "sym_constrain_range_for_size", "_assert_async", "_assert_scalar",
        "_assert_tensor_metadata")
_IDENTITY = ("dropout", "feature_dropout", "alpha_dropout", "clone", "alias", "detach",
             "contiguous", "lift_fresh_copy", "_to_copy", "to", "type_as")
_LOWEST = float(np.finfo(np.float32).min)


def _arg(args: Any, kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _pads(v: Any) -> tuple[int, int]:
    """A torch padding (int or pair, zero allowed) as an (h, w) pair."""
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[-1])) if v else (0, 0)
    return int(v or 0), int(v or 0)


def _unsupported(lw: Lowering, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"from_torch cannot lower aten.{op_name(lw.node)} {why} (from "
                              f"{module_path(lw.node)}).")


def _like(lw: Lowering, x: Any) -> Val:
    if not isinstance(x, Val):
        raise _unsupported(lw, "on a constant input")
    return x


def _same(v: Val, tid: int, lw: Lowering) -> Val:
    return lw.val(tid, lw.out_shape(), v.perm)


# -- convolutions, dense layers, batch norm -------------------------------------------------------
def _bn_scale_shift(lw: Lowering, bn: Any) -> tuple[torch.Tensor, torch.Tensor]:
    a = (None, *lw.args(tuple(bn.args[1:])))   # input 0 is the conv being lowered
    gamma, beta, mean, var = a[1], a[2], a[3], a[4]
    eps = a[6] if op_name(bn) == "_native_batch_norm_legit_no_training" else a[7]
    if any(isinstance(v, Val) for v in (gamma, beta, mean, var)):
        raise _unsupported(lw, "with batch-norm statistics computed at run time")
    gamma = torch.ones_like(mean) if gamma is None else gamma
    beta = torch.zeros_like(mean) if beta is None else beta
    scale = gamma.double() / torch.sqrt(var.double() + float(eps))
    return scale, beta.double() - mean.double() * scale


def _fold(lw: Lowering, n: Any, w: torch.Tensor, b: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    bn = lw.folded.get(n.name)
    if bn is None:
        return w, b
    scale, shift = _bn_scale_shift(lw, bn)
    w = (w.double() * scale.reshape((-1,) + (1,) * (w.dim() - 1))).float()
    b0 = torch.zeros_like(scale) if b is None else b.double()
    return w, (b0 * scale + shift).float()


def _window_padding(size: tuple[int, int], k: tuple[int, int], s: tuple[int, int],
                    d: tuple[int, int], p: tuple[int, int]) -> str | None:
    """'VALID' (no padding), 'SAME' (TFLite's implicit padding is torch's), else None."""
    if p == (0, 0):
        return "VALID"
    for n, kk, ss, dd, pp in zip(size, k, s, d, p):
        eff = (kk - 1) * dd + 1
        out_torch = (n + 2 * pp - eff) // ss + 1
        out_same = -(-n // ss)
        total = max((out_same - 1) * ss + eff - n, 0)
        if out_torch != out_same or total // 2 != pp:
            return None
    return "SAME"


def conv(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x, w = _like(lw, args[0]), args[1]
    bias = _arg(args, kw, 2, "bias")
    if op_name(n) == "conv2d":
        stride, padding = _arg(args, kw, 3, "stride", 1), _arg(args, kw, 4, "padding", 0)
        dilation, groups = _arg(args, kw, 5, "dilation", 1), _arg(args, kw, 6, "groups", 1)
    else:
        stride, padding, dilation, transposed = args[3], args[4], args[5], args[6]
        groups = args[8]
        if transposed:
            raise _unsupported(lw, "(a transposed convolution)")
    if isinstance(w, Val) or isinstance(bias, Val) or x.rank != 4 or w.dim() != 4:
        raise _unsupported(lw, "other than a 2-D convolution with constant weights")
    w, bias = _fold(lw, n, w.float(), None if bias is None else bias.float())
    x = lw.nhwc(x)
    cout, _, kh, kwid = w.shape
    cin, size = x.shape[1], (x.shape[2], x.shape[3])
    stride, dilation = pair(stride, "stride"), pair(dilation, "dilation")
    if isinstance(padding, str):
        pads, mode = (0, 0), ("VALID" if padding == "valid" else "SAME")
    else:
        pads = _pads(padding)
        mode = _window_padding(size, (kh, kwid), stride, dilation, pads)
    xt = x.tid
    if mode is None:
        xt = lw.b.pad(xt, ((pads[0], pads[0]), (pads[1], pads[1])), name=f"{n.name}/pad")
        mode = "VALID"
    if groups == cin and groups > 1:
        y = lw.b.depthwise_conv2d(xt, (kh, kwid), stride, mode, depth_multiplier=cout // cin,
                                  dilation=dilation, name=n.name)
        data = w.permute(1, 2, 3, 0)                       # [1, kh, kw, C*m]
    else:
        y = lw.b.conv2d(xt, cout, (kh, kwid), stride, mode, dilation, groups, name=n.name)
        data = w.permute(0, 2, 3, 1)                       # [O, kh, kw, I/groups]
    ins = lw.last_inputs()
    lw.set_data(ins[1], data)
    # the builder gives a bias-less convolution a bias tensor (LiteRT needs one): zeros
    lw.set_data(ins[2], bias if bias is not None else torch.zeros(cout))
    return lw.val(y, lw.out_shape(), canonical(4))


def _dense(lw: Lowering, n: Any, x: Any, w: Any, bias: Any) -> Val:
    """FULLY_CONNECTED as litert-torch 0.10 writes aten.linear (view to 2-D, mm, view back):
    on torch's order, reading through RESHAPEs that keep the last axis, with keep_num_dims
    when that gives the output's leading axes, without it for a 2-D output, else followed by
    a RESHAPE (the converter's FULLY_CONNECTED/RESHAPE folds, as observed on its output)."""
    from latpred.pytorch.movement import torch_reshape

    x = _like(lw, x)
    if isinstance(w, Val) or isinstance(bias, Val):
        raise _unsupported(lw, "with weights computed at run time (use a constant weight)")
    w, bias = _fold(lw, n, w.float(), None if bias is None else bias.float())
    x = torch_reshape(lw, x, x.shape, f"{n.name}/in")
    src, out = _fc_source(lw, x.tid, int(w.shape[1])), lw.out_shape()
    lead = lw.b.shape(src)[:-1]
    keep = lead == out[:-1] or len(out) != 2
    y = lw.b.fully_connected(src, int(w.shape[0]), bias=bias is not None, keep_num_dims=keep,
                             name=n.name)
    ins = lw.last_inputs()
    lw.set_data(ins[1], w)
    if bias is not None:
        lw.set_data(ins[2], bias)
    if lw.b.shape(y) != out:
        y = lw.b.reshape(y, out, name=f"{n.name}/out")
    return lw.val(y, out, tuple(range(len(out))))


def _fc_source(lw: Lowering, tid: int, k: int) -> int:
    """The tensor a FULLY_CONNECTED reads: through the RESHAPEs just written that keep the last
    axis (`k`), unless a lowering pinned one (`Lowering.no_fold`). A skipped RESHAPE that
    nothing else reads is dropped with the dead ops."""
    recent = {op.outputs[0]: op for op in lw.b._ops[-4:] if op.type == "RESHAPE"}
    while tid in recent and tid not in lw.no_fold:
        src = recent[tid].inputs[0]
        if lw.b.shape(src)[-1] != k:
            break
        tid = src
    return tid


def linear(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    return _dense(lw, n, args[0], args[1], _arg(args, kw, 2, "bias"))


def addmm(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    bias, x, w = (None, args[0], args[1]) if op_name(n) == "mm" else args[:3]
    return _dense(lw, n, x, w.t() if isinstance(w, torch.Tensor) else w, bias)


def batch_norm(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Any:
    x = _like(lw, args[0])
    src = n.args[0]
    if lw.folded.get(getattr(src, "name", "")) is not n:
        from latpred.pytorch.export import _bn_training

        if _bn_training(n):
            raise _unsupported(lw, "in training mode")
        scale, shift = _bn_scale_shift(lw, n)
        tail = (1,) * (x.rank - 2)
        y = lw.b.mul(x.tid, lw.operand(scale.float().reshape(-1, *tail), x).tid,
                     name=f"{n.name}/scale")
        y = lw.b.add(y, lw.operand(shift.float().reshape(-1, *tail), x).tid, name=n.name)
        x = lw.val(y, x.shape, x.perm)
    return x if op_name(n) == "batch_norm" else (x, None, None)


# -- activations and element-wise ------------------------------------------------------------
def _unary(method: str) -> Handler:
    def handler(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
        x = _like(lw, args[0])
        return _same(x, getattr(lw.b, method)(x.tid, name=n.name), lw)
    return handler


def hardtanh(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    lo, hi = float(_arg(args, kw, 1, "min_val", -1.0)), float(_arg(args, kw, 2, "max_val", 1.0))
    if (lo, hi) == (0.0, 6.0):
        return _same(x, lw.b.relu6(x.tid, name=n.name), lw)
    if (lo, hi) == (-1.0, 1.0):
        return _same(x, lw.b._op("RELU_N1_TO_1", (x.tid,), lw.b._base(n.name, "relu"))[0], lw)
    y = lw.b._op("MAXIMUM", (x.tid, lw.operand(lo, x).tid), lw.b._base(f"{n.name}/max", "max"))
    y = lw.b._op("MINIMUM", (y[0], lw.operand(hi, x).tid), lw.b._base(n.name, "min"))
    return _same(x, y[0], lw)


def relu6(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    return _same(args[0], lw.b.relu6(_like(lw, args[0]).tid, name=n.name), lw)


def fold_affine(lw: Lowering, v: Any, const: Any, kind: str) -> bool:
    """Fold `v` (+, -, *, /) a per-channel or scalar constant into the CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED that just produced it, when nothing else reads it
    (the TFLite converter's fuse-add/mul-into-affine patterns). True when folded."""
    ops = lw.b._ops
    if not isinstance(v, Val) or isinstance(const, Val) or not ops:
        return False
    prod, node = ops[-1], lw.origin.get(v.tid)
    if prod.outputs != (v.tid,) or prod.activation != "NONE" or node is None \
            or len(node.users) != 1 or prod.type not in ("CONV_2D", "DEPTHWISE_CONV_2D",
                                                          "FULLY_CONNECTED"):
        return False
    c = lw.b.shape(v.tid)[-1]
    arr = np.asarray(const.detach().numpy() if isinstance(const, torch.Tensor) else const,
                     dtype=np.float64)
    if arr.ndim > v.rank:
        return False
    arr = arr.reshape((1,) * (v.rank - arr.ndim) + arr.shape).transpose(v.perm)
    if any(d != 1 for d in arr.shape[:-1]) or arr.shape[-1] not in (1, c):
        return False
    vec = np.broadcast_to(arr.reshape(-1), (c,))
    names = [lw.b._tensors[t].name if t >= 0 else None for t in prod.inputs]
    bias = lw.data[names[2]].astype(np.float64) if len(names) > 2 and names[2] else np.zeros(c)
    if kind in ("ADD", "SUB"):
        bias = bias + (vec if kind == "ADD" else -vec)
    else:
        scale = vec if kind == "MUL" else 1.0 / vec
        w = lw.data[names[1]].astype(np.float64)
        axis = w.ndim - 1 if prod.type == "DEPTHWISE_CONV_2D" else 0
        lw.data[names[1]] = (w * scale.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
                             ).astype(np.float32)
        bias = bias * scale
    if len(names) > 2 and names[2]:
        lw.data[names[2]] = bias.astype(np.float32)
    else:
        tid = lw.constant(bias, f"{names[1].rsplit('/', 1)[0]}/bias")
        ops[-1] = type(prod)(prod.type, (prod.inputs[0], prod.inputs[1], tid), prod.outputs,
                             prod.attrs)
    return True


def hardsigmoid(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    if fold_affine(lw, x, 3.0, "ADD"):       # conv bias + 3, RELU6 fused: CONV_2D, MUL
        y = lw.b.relu6(x.tid, name=f"{n.name}/relu6")
    else:
        y = lw.b.add(x.tid, lw.operand(3.0, x).tid, activation="RELU6", name=f"{n.name}/add")
    return _same(x, lw.b.mul(y, lw.operand(1.0 / 6.0, x).tid, name=n.name), lw)


def gelu(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    approx = _arg(args, kw, 1, "approximate", "none") == "tanh"
    return _same(x, lw.b.gelu(x.tid, approximate=approx, name=n.name), lw)


def leaky_relu(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    alpha = float(_arg(args, kw, 1, "negative_slope", 0.01))
    return _same(x, lw.b._op("LEAKY_RELU", (x.tid,), lw.b._base(n.name, "leaky_relu"),
                             alpha=alpha)[0], lw)


def softmax(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    dim = int(_arg(args, kw, 1, "dim", -1)) % x.rank
    if x.perm[-1] != dim:
        x = lw.to_layout(x, tuple(a for a in x.perm if a != dim) + (dim,))
    return _same(x, lw.b.softmax(x.tid, name=n.name), lw)


def _binary(op_type: str) -> Handler:
    def handler(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
        a, c = args[0], args[1]
        alpha = _arg(args, kw, 2, "alpha", 1)
        if alpha != 1:
            if isinstance(c, Val):
                raise _unsupported(lw, "with alpha != 1 on a computed operand")
            c = c * alpha
        kind = op_type
        if op_name(n) == "rsub":
            a, c, kind = c, a, "SUB"
        vals = [v for v in (a, c) if isinstance(v, Val)]
        like = max(vals, key=lambda v: v.rank)
        if op_name(n) != "rsub" and len(vals) == 1 and kind != "DIV" or kind == "DIV" and \
                isinstance(a, Val) and not isinstance(c, Val):
            v, k = (a, c) if isinstance(a, Val) else (c, a)
            if (kind != "SUB" or v is a) and fold_affine(lw, v, k, kind):
                return lw.val(v.tid, lw.out_shape(), v.perm)
        x, y = lw.operand(a, like), lw.operand(c, like)
        tid = lw.b._binary(kind, kind.lower(), x.tid, y.tid, "NONE", n.name)
        return lw.val(tid, lw.out_shape(), like.perm)
    return handler


from latpred.pytorch.movement import (adaptive_pool, avg_pool, cat, identity,  # noqa: E402
                                      layer_norm, max_pool, pad, permute, reducer, slice_,
                                      split, view)


HANDLERS: dict[str, Handler] = {
    "conv2d": conv, "convolution": conv, "_convolution": conv,
    "linear": linear, "addmm": addmm, "mm": addmm,
    **{name: batch_norm for name in BATCH_NORMS},
    "relu": _unary("relu"), "relu6": relu6, "hardtanh": hardtanh, "sigmoid": _unary("sigmoid"),
    "tanh": _unary("tanh"), "hardswish": _unary("hard_swish"), "silu": _unary("swish"),
    "hardsigmoid": hardsigmoid, "gelu": gelu, "leaky_relu": leaky_relu,
    "softmax": softmax, "_softmax": softmax,
    "add": _binary("ADD"), "sub": _binary("SUB"), "rsub": _binary("SUB"),
    "mul": _binary("MUL"), "div": _binary("DIV"),
    "mean": reducer("MEAN"), "sum": reducer("SUM"), "amax": reducer("REDUCE_MAX"),
    "adaptive_avg_pool2d": adaptive_pool, "_adaptive_avg_pool2d": adaptive_pool,
    "adaptive_max_pool2d": adaptive_pool,
    "max_pool2d": max_pool, "max_pool2d_with_indices": max_pool, "avg_pool2d": avg_pool,
    "view": view, "reshape": view, "_unsafe_view": view, "flatten": view, "squeeze": view,
    "unsqueeze": view, "unflatten": view,
    "permute": permute, "transpose": permute, "t": permute,
    **{name: identity for name in _IDENTITY},
    "cat": cat, "concat": cat, "split": split, "split_with_sizes": split, "chunk": split,
    "slice": slice_, "constant_pad_nd": pad, "pad": pad,
    "layer_norm": layer_norm, "native_layer_norm": layer_norm,
}
