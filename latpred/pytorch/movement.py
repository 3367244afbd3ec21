"""Lowerings of pools, reductions, layout and data movement, and layer norm (see
`lowering.py`, whose HANDLERS table holds them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
import torch

from latpred.pytorch.export import Handler, Lowering, Val, op_name
from latpred.pytorch.layout import canonical, permuted, plan_view, reduce_perm
from latpred.pytorch.lowering import (_LOWEST, _arg, _like, _pads, _unsupported,
                                      _window_padding)
from latpred.shapes import pair


# -- pooling and reductions ------------------------------------------------------------------
def _reduce(lw: Lowering, n: Any, x: Val, dims: Any, keep: bool, op_type: str) -> Val:
    dims = sorted({int(d) % x.rank for d in (dims if dims else range(x.rank))})
    axes = sorted(x.perm.index(d) for d in dims)
    base = lw.b._base(n.name, op_type.lower())
    axes_t = lw.b._int_const((len(axes),), axes, f"{base}/axes")
    y = lw.b._op(op_type, (x.tid, axes_t), base, keep_dims=bool(keep))[0]
    return lw.val(y, lw.out_shape(), x.perm if keep else reduce_perm(x.perm, dims))


def reducer(op_type: str) -> Handler:
    def handler(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
        x = _like(lw, args[0])
        return _reduce(lw, n, x, _arg(args, kw, 1, "dim", None),
                       bool(_arg(args, kw, 2, "keepdim", False)), op_type)
    return handler


def adaptive_pool(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Any:
    x = _like(lw, args[0])
    oh, ow = pair(args[1], "output size")
    h, w = x.shape[2], x.shape[3]
    is_max = "max" in op_name(n)
    if (oh, ow) == (1, 1):
        y = _reduce(lw, n, x, (2, 3), True, "REDUCE_MAX" if is_max else "MEAN")
    elif (oh, ow) == (h, w):
        y = x
    elif h % oh == 0 and w % ow == 0:
        pool = lw.b.max_pool if is_max else lw.b.avg_pool
        y = lw.val(pool(lw.nhwc(x).tid, (h // oh, w // ow), name=n.name), lw.out_shape(),
                   canonical(4))
    else:
        raise _unsupported(lw, f"from {h}x{w} to {oh}x{ow} (not a whole window)")
    return (y, None) if is_max else y


def _pool(lw: Lowering, n: Any, x: Val, k, s, p, is_max: bool, include_pad: bool) -> Val:
    x = lw.nhwc(x)
    k = pair(k, "pool kernel")
    s = pair(s, "pool stride") if s else k
    p = _pads(p)
    out = lw.out_shape()[2:]
    size = (x.shape[2], x.shape[3])
    mode = _window_padding(size, k, s, (1, 1), p)
    if mode == "SAME" and not is_max and include_pad:
        mode = None    # TFLite's SAME average leaves the padding out of the count
    extra = [max(0, (o - 1) * ss + kk - (nn + 2 * pp)) for o, ss, kk, nn, pp in
             zip(out, s, k, size, p)]
    if mode is not None and (mode == "SAME" or not any(extra)):
        xt = x.tid
    else:
        mode = "VALID"
        pads = ((0, 0), (p[0], p[0] + extra[0]), (p[1], p[1] + extra[1]), (0, 0))
        if is_max:
            base = lw.b._base(f"{n.name}/pad", "pad")
            flat = tuple(v for q in pads for v in q)
            xt = lw.b._op("PADV2", (x.tid, lw.b._int_const((4, 2), flat, f"{base}/paddings"),
                                    lw.constant(np.float32(_LOWEST), f"{base}/lowest")), base)[0]
        else:
            xt = lw.b.pad(x.tid, pads, name=f"{n.name}/pad")
    pool = lw.b.max_pool if is_max else lw.b.avg_pool
    return lw.val(pool(xt, k, s, padding=mode, name=n.name), lw.out_shape(), canonical(4))


def max_pool(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Any:
    x = _like(lw, args[0])
    if pair(_arg(args, kw, 4, "dilation", 1) or 1, "dilation") != (1, 1):
        raise _unsupported(lw, "with dilation")
    y = _pool(lw, n, x, args[1], _arg(args, kw, 2, "stride", None),
              _arg(args, kw, 3, "padding", 0), True, True)
    return (y, None) if op_name(n) == "max_pool2d_with_indices" else y


def avg_pool(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    if _arg(args, kw, 6, "divisor_override", None) is not None:
        raise _unsupported(lw, "with divisor_override")
    return _pool(lw, n, x, args[1], _arg(args, kw, 2, "stride", None),
                 _arg(args, kw, 3, "padding", 0), False,
                 bool(_arg(args, kw, 5, "count_include_pad", True)))


# -- data movement ---------------------------------------------------------------------------
def view(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    new = lw.out_shape()
    plan = plan_view(x.shape, x.perm, new)
    ops = lw.b._ops
    if plan.mid == x.perm and ops and ops[-1].type == "MEAN" and ops[-1].outputs == (x.tid,) \
            and ops[-1].attr("keep_dims") and len(n.args[0].users) == 1:
        mean = ops[-1]
        axes = set(lw.b._tensors[mean.inputs[1]].value or ())
        squeezed = tuple(d for i, d in enumerate(lw.b.shape(mean.inputs[0])) if i not in axes)
        if squeezed == plan.out_shape:   # the converter folds the reshape into the MEAN
            lw.b._tensors[x.tid] = replace(lw.b._tensors[x.tid], shape=squeezed)
            ops[-1] = type(mean)(mean.type, mean.inputs, mean.outputs,
                                 tuple(sorted({**mean.attr_dict, "keep_dims": False}.items())))
            return lw.val(x.tid, new, plan.out_perm)
    if plan.mid != x.perm:
        x = lw.to_layout(x, plan.mid)
    tid = x.tid if lw.b.shape(x.tid) == plan.out_shape else \
        lw.b.reshape(x.tid, plan.out_shape, name=n.name)
    return lw.val(tid, new, plan.out_perm)


def permute(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    name = op_name(n)
    if name == "permute":
        dims = [int(d) % x.rank for d in args[1]]
    else:
        dims = list(range(x.rank))
        if name == "transpose":
            i, j = int(args[1]) % x.rank, int(args[2]) % x.rank
        else:   # t
            i, j = 0, x.rank - 1
        dims[i], dims[j] = dims[j], dims[i]
    return lw.val(x.tid, lw.out_shape(), permuted(x.perm, dims))


def identity(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Any:
    x = args[0]
    dtype = kw.get("dtype")
    if dtype not in (None, torch.float32):
        raise _unsupported(lw, f"to {dtype} (only float32 graphs are lowered)")
    return x


def cat(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    xs = list(args[0])
    like = next(v for v in xs if isinstance(v, Val))
    dim = int(_arg(args, kw, 1, "dim", 0)) % like.rank
    ids = [lw.operand(v, like).tid for v in xs]
    y = lw.b.concat(ids, axis=like.perm.index(dim), name=n.name)
    return lw.val(y, lw.out_shape(), like.perm)


def split(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> list[Val]:
    x = _like(lw, args[0])
    dim = int(_arg(args, kw, 2, "dim", 0)) % x.rank
    outs = [tuple(int(d) for d in v.shape) for v in n.meta["val"]]
    sizes = [s[dim] for s in outs]
    axis = x.perm.index(dim)
    ids = lw.b.split(x.tid, len(sizes), axis, name=n.name) if len(set(sizes)) == 1 else \
        lw.b.split_v(x.tid, sizes, axis, name=n.name)
    return [lw.val(t, s, x.perm) for t, s in zip(ids, outs)]


def slice_(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    dim = int(_arg(args, kw, 1, "dim", 0)) % x.rank
    size = x.shape[dim]
    start, end = _arg(args, kw, 2, "start", None), _arg(args, kw, 3, "end", None)
    step = int(_arg(args, kw, 4, "step", 1))
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    if (start, end, step) == (0, size, 1):
        return x
    axis = x.perm.index(dim)
    shape = lw.b.shape(x.tid)
    begin, stop, strides = [0] * x.rank, list(shape), [1] * x.rank
    begin[axis], stop[axis], strides[axis] = start, end, step
    base = lw.b._base(n.name, "slice")
    consts = [lw.b._int_const((x.rank,), v, f"{base}/{w}")
              for v, w in ((begin, "begin"), (stop, "end"), (strides, "strides"))]
    y = lw.b._op("STRIDED_SLICE", (x.tid, *consts), base, begin_mask=0, end_mask=0,
                 ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=False)[0]
    return lw.val(y, lw.out_shape(), x.perm)


def pad(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    x = _like(lw, args[0])
    spec = [int(v) for v in args[1]]
    mode = _arg(args, kw, 2, "mode", "constant") if op_name(n) == "pad" else "constant"
    value = _arg(args, kw, 3 if op_name(n) == "pad" else 2, "value", 0.0) or 0.0
    if mode != "constant" or min(spec, default=0) < 0:
        raise _unsupported(lw, f"with mode {mode!r} or negative padding")
    per_axis = {x.rank - 1 - i: (spec[2 * i], spec[2 * i + 1]) for i in range(len(spec) // 2)}
    pads = tuple(per_axis.get(a, (0, 0)) for a in x.perm)
    if float(value) == 0.0:
        return lw.val(lw.b.pad(x.tid, pads, name=n.name), lw.out_shape(), x.perm)
    base = lw.b._base(n.name, "pad")
    flat = tuple(v for q in pads for v in q)
    y = lw.b._op("PADV2", (x.tid, lw.b._int_const((x.rank, 2), flat, f"{base}/paddings"),
                           lw.constant(np.float32(value), f"{base}/value")), base)[0]
    return lw.val(y, lw.out_shape(), x.perm)


def layer_norm(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Any:
    x = _like(lw, args[0])
    shape = list(args[1])
    weight, bias = _arg(args, kw, 2, "weight"), _arg(args, kw, 3, "bias")
    eps = float(_arg(args, kw, 4, "eps", 1e-5))
    if len(shape) != 1 or isinstance(weight, Val) or isinstance(bias, Val):
        raise _unsupported(lw, "over more than the last axis")
    last = x.rank - 1
    if x.perm[-1] != last:
        x = lw.to_layout(x, tuple(a for a in x.perm if a != last) + (last,))
    b, base = lw.b, lw.b._base(n.name, "layer_norm")
    axis = b._int_const((1,), (-1,), f"{base}/axis")
    mean = b._op("MEAN", (x.tid, axis), f"{base}/mean", keep_dims=True)[0]
    neg = b._op("NEG", (mean,), f"{base}/neg")[0]
    diff = b._op("SQUARED_DIFFERENCE", (x.tid, mean), f"{base}/sqdiff")[0]
    var = b._op("MEAN", (diff, axis), f"{base}/var", keep_dims=True)[0]
    inv = b._op("RSQRT", (b.add(var, lw.constant(np.float32(eps), f"{base}/epsilon"),
                                name=f"{base}/add_eps"),), f"{base}/rsqrt")[0]
    if weight is not None:
        inv = b.mul(inv, lw.constant(weight.numpy(), f"{base}/gamma"), name=f"{base}/scale")
    shift = b.mul(neg, inv, name=f"{base}/shift")
    if bias is not None:
        shift = b.add(shift, lw.constant(bias.numpy(), f"{base}/beta"), name=f"{base}/center")
    y = b.add(b.mul(x.tid, inv, name=f"{base}/scaled"), shift, name=base)
    out = lw.val(y, lw.out_shape() if op_name(n) == "layer_norm" else x.shape, x.perm)
    return out if op_name(n) == "layer_norm" else (out, None, None)
