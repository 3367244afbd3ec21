"""Lowerings of pools, reductions, layout and data movement, and layer norm (see
`lowering.py`, whose HANDLERS table holds them).

Where a layout choice matters they follow litert-torch 0.10's layout pass
(litert_torch/_convert/fx_passes/optimize_layout_transposes_pass/, layout_check.py and
layout_rewrite.py): it runs an op in NHWC only when its output and inputs are 4-D and it has an
NHWC rewrite; aten.view/permute/expand never are (`_not_nhwc`), so a view works on torch's order
(the channel shuffle: TRANSPOSE, RESHAPE, TRANSPOSE, RESHAPE, TRANSPOSE), a reduction to fewer
than 4 axes runs on NCHW, and split_with_sizes is rewritten to NHWC and lowered as SLICEs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
import torch

from latpred.pytorch.export import Handler, Lowering, Val, op_name
from latpred.pytorch.layout import canonical, is_trivial, permuted, reduce_perm
from latpred.pytorch.lowering import (_LOWEST, _arg, _like, _pads, _unsupported,
                                      _window_padding)
from latpred.windows import pair


# -- pooling and reductions ------------------------------------------------------------------
def _reduce(lw: Lowering, n: Any, x: Val, dims: Any, keep: bool, op_type: str) -> Val:
    dims = sorted({int(d) % x.rank for d in (dims if dims else range(x.rank))})
    if x.rank == 4 and (not keep or _feeds_permute(n)):
        # litert-torch: a reduction whose output is not 4-D is never NHWC (layout_check.py's
        # default checker), so it reduces NCHW (x.mean([2, 3]): TRANSPOSE, MEAN). A keep_dims
        # mean that a permute reads stays NCHW too: the converter folds TRANSPOSE-MEAN only
        # when a reshape follows the MEAN, not a transpose (ConvNeXt's head, litert-torch 0.10).
        x = lw.to_layout(x, tuple(range(4)))
    axes = sorted(x.perm.index(d) for d in dims)
    base = lw.b._base(n.name, op_type.lower())
    axes_t = lw.b._int_const((len(axes),), axes, f"{base}/axes")
    y = lw.b._op(op_type, (x.tid, axes_t), base, keep_dims=bool(keep))[0]
    return lw.val(y, lw.out_shape(), x.perm if keep else reduce_perm(x.perm, dims))


def _feeds_permute(n: Any) -> bool:
    users = list(n.users)
    return len(users) == 1 and op_name(users[0]) in ("permute", "transpose")


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
def torch_reshape(lw: Lowering, x: Val, shape: Any, name: str) -> Val:
    """`x` viewed as torch shape `shape`, as litert-torch lowers aten.view: on torch's order (a
    TRANSPOSE first, none when only size-1 axes move, which the RESHAPE does), then a RESHAPE
    (none when the shapes agree) or the converter's fold into a keep_dims MEAN before it."""
    shape = tuple(int(d) for d in shape)
    if not is_trivial(x.shape, x.perm, tuple(range(x.rank))):
        x = lw.to_layout(x, tuple(range(x.rank)))
    tid = x.tid
    if lw.b.shape(tid) != shape:
        tid = _fold_into_mean(lw, tid, shape)
    if lw.b.shape(tid) != shape:
        tid = lw.b.reshape(tid, shape, name=name)
    return lw.val(tid, shape, tuple(range(len(shape))))


def _fold_into_mean(lw: Lowering, tid: int, shape: tuple[int, ...]) -> int:
    """A keep_dims MEAN read only by this reshape drops its size-1 axes (keep_dims=False), as
    the converter writes it; the reshape is then gone or reshapes the squeezed result."""
    ops = lw.b._ops
    if not ops or ops[-1].type != "MEAN" or ops[-1].outputs != (tid,) \
            or not ops[-1].attr("keep_dims") or not lw.sole_reader(tid):
        return tid
    mean = ops[-1]
    axes = {a % len(lw.b.shape(tid)) for a in lw.b._tensors[mean.inputs[1]].value or ()}
    squeezed = tuple(d for i, d in enumerate(lw.b.shape(mean.inputs[0])) if i not in axes)
    lw.b._tensors[tid] = replace(lw.b._tensors[tid], shape=squeezed)
    ops[-1] = type(mean)(mean.type, mean.inputs, mean.outputs,
                         tuple(sorted({**mean.attr_dict, "keep_dims": False}.items())))
    return tid


def view(lw: Lowering, n: Any, args: Any, kw: Mapping[str, Any]) -> Val:
    return torch_reshape(lw, _like(lw, args[0]), lw.out_shape(), n.name)


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
    """One SLICE per part, as litert-torch lowers split_with_sizes; a 4-D input is split in
    NHWC (its layout pass rewrites the split's dim, layout_rewrite.py dim_attr_rewriter) unless
    `_split_layout` finds torch's order cheaper."""
    x = _like(lw, args[0])
    if x.rank == 4:
        x = lw.to_layout(x, _split_layout(lw, n, x))
    dim = int(_arg(args, kw, 2, "dim", 0)) % x.rank
    axis, shape = x.perm.index(dim), lw.b.shape(x.tid)
    vals, start = [], 0
    for out in n.meta["val"]:
        out = tuple(int(d) for d in out.shape)
        begin, size = [0] * x.rank, list(shape)
        begin[axis], size[axis] = start, out[dim]
        base = lw.b._base(n.name, "slice")
        consts = [lw.b._int_const((x.rank,), v, f"{base}/{w}")
                  for v, w in ((begin, "begin"), (size, "size"))]
        tid = lw.b._raw("SLICE", (x.tid, *consts), [(tuple(size), lw.b._get(x.tid).dtype)],
                        base)[0]
        vals.append(lw.val(tid, out, x.perm))
        start += out[dim]
    return vals


_TORCH_ORDER_READERS = ("permute", "transpose", "t", "view", "reshape", "_unsafe_view",
                        "flatten", "squeeze", "unsqueeze", "expand")
_NHWC_READERS = ("conv2d", "convolution", "_convolution", "max_pool2d",
                 "max_pool2d_with_indices", "avg_pool2d")


def _split_layout(lw: Lowering, n: Any, x: Val) -> tuple[int, ...]:
    """NHWC, unless torch's order costs fewer TRANSPOSEs: litert-torch's min-cut partitioner
    (layout_partitioners/min_cut.py: one cut per edge between an NHWC op and one that cannot be,
    such as a view or permute) counted on the split's own edges. A split of a tensor in torch's
    order whose parts feed permutes or views stays there (channel shuffle written on NHWC
    tensors); ties keep NHWC (torchvision's ShuffleNetV2 chunk after its shuffle)."""
    nhwc, torch_order = canonical(4), tuple(range(4))
    cost = {p: int(x.perm != p and (x.tid, p) not in lw.relayouts)
            for p in (nhwc, torch_order)}
    for part in n.users:   # the getitem nodes of the parts
        sides = set()
        for reader in part.users:
            name = op_name(reader) if reader.op == "call_function" else ""
            sides |= {torch_order} if name in _TORCH_ORDER_READERS else \
                {nhwc} if name in _NHWC_READERS else set()
        for p in cost:
            cost[p] += any(s != p for s in sides)
    return torch_order if cost[torch_order] < cost[nhwc] else nhwc


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
    """litert-torch's lowering (backend/lowerings/_layer_norm.py, 0.10): the input reshaped to
    [1, rows, C], stablehlo batch_norm_training over it, which the converter writes as MEAN,
    SQUARED_DIFFERENCE, MEAN, ADD(eps), RSQRT, MUL, SUB and the broadcast MUL, ADD with [1,
    rows, 1] RESHAPEs; then gamma and beta as MUL and ADD of [C] constants, each left out when
    it is the identity (the converter folds x*1 and x+0); then the RESHAPE back."""
    x = _like(lw, args[0])
    weight, bias = _arg(args, kw, 2, "weight"), _arg(args, kw, 3, "bias")
    eps = float(_arg(args, kw, 4, "eps", 1e-5))
    if len(list(args[1])) != 1 or isinstance(weight, Val) or isinstance(bias, Val):
        raise _unsupported(lw, "over more than the last axis")
    rows, shape = int(np.prod(x.shape[:-1])), x.shape
    b, base = lw.b, lw.b._base(n.name, "layer_norm")
    x3 = torch_reshape(lw, x, (1, rows, shape[-1]), f"{base}/rows").tid
    axes = b._int_const((2,), (0, 2), f"{base}/axes")
    mean = b._op("MEAN", (x3, axes), f"{base}/mean", keep_dims=False)[0]
    diff = b._op("SQUARED_DIFFERENCE", (x3, b.reshape(mean, (1, rows, 1), name=f"{base}/mean_b")),
                 f"{base}/sqdiff")[0]
    var = b._op("MEAN", (diff, axes), f"{base}/var", keep_dims=False)[0]
    rstd = b._op("RSQRT", (b.add(var, lw.constant(np.float32(eps), f"{base}/epsilon"),
                                 name=f"{base}/add_eps"),), f"{base}/rstd")[0]
    shift = b.sub(lw.constant(np.float32(0.0), f"{base}/zero"),
                  b.mul(mean, rstd, name=f"{base}/mean_rstd"), name=f"{base}/shift")
    y = b.mul(x3, b.reshape(rstd, (1, rows, 1), name=f"{base}/rstd_b"), name=f"{base}/scaled")
    y = b.add(y, b.reshape(shift, (1, rows, 1), name=f"{base}/shift_b"), name=f"{base}/norm")
    gamma = weight is not None and not bool(torch.all(weight == 1))
    beta = bias is not None and bool(torch.any(bias != 0))
    if gamma:
        y = b.mul(y, lw.constant(weight.numpy(), f"{base}/gamma"), name=f"{base}/gamma")
    if beta:
        y = b.add(y, lw.constant(bias.numpy(), f"{base}/beta"), name=f"{base}/beta")
    if b.shape(y) != shape:
        y = b.reshape(y, shape, name=base)
        if gamma or beta:   # the converter reshapes before a FULLY_CONNECTED here (`_dense`)
            lw.no_fold.add(y)
    out = lw.val(y, shape, tuple(range(len(shape))))
    return out if op_name(n) == "layer_norm" else (out, None, None)
