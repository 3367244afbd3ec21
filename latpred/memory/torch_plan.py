"""The CUDA allocations of the module `latpred.pytorch.to_torch` builds, in the order it makes
them: loading it (`module.to("cuda", dtype)`, then the inputs, as `latpred.profile.cuda.prepare`
does) and one forward under `torch.no_grad()`.

`load_events(graph, elem)` and `forward_events(graph, elem, workspace)` return `Event`s:
("alloc", storage id, bytes requested, op index) and ("free", storage id, 0, op index). Op
index -1 is the load, len(graph.ops) the end of the forward. They are made op by op:
`load_requests(graph, op, elem)` and `forward_requests(...)` give one op's share (an
`OpRequests`), which `memory_totals` also keeps per op configuration (`cuda_requests`).
Where each rule comes from:

Load (torch/nn/modules/module.py `Module._apply`: children first, then each module's
parameters, then its buffers, in registration order; `latpred/pytorch/module.py` registers a
convolution's `weight` then `bias`, a fully-connected layer's likewise, and an element-wise
op's constant operands as buffers `const<k>`, a RESHAPE's shape operand included):
- each tensor becomes one CUDA tensor of its bytes in the target precision
  (`_to_copy` -> `empty_strided`, the memory format preserved);
- a precision change into a destination that is not default-contiguous (a channels_last
  convolution weight with more than one input channel per group and a window over 1x1) adds
  a temporary of the same size (aten/src/ATen/native/cuda/Copy.cu, `copy_kernel_cuda`: when
  `copy_requires_temporaries`, `dst_contig = at::empty_like(dst, LEGACY_CONTIGUOUS)`, then
  `dst.copy_(dst_contig)`), freed at once; a same-precision copy is one memcpy;
- then one tensor per graph input (`torch.randn(shape, device="cuda")`).

Forward (`GraphModule.forward` keeps every value in its `env` dict until it returns, so no op
output is freed before the end; the ops are latpred/pytorch/ops.py):
- every op allocates its outputs (fused activations run in place: no allocation);
- views allocate nothing and keep their base alive: RESHAPE / SQUEEZE / EXPAND_DIMS
  (`reshape` of a contiguous tensor), a SPLIT part or STRIDED_SLICE that is contiguous, a
  TRANSPOSE whose permuted tensor is contiguous (`.contiguous()` returns itself);
- temporaries, freed inside the op: SAME padding that a symmetric pad cannot give
  (`F.pad`, before the window op); MAX_POOL_2D's int64 indices (`F.max_pool2d` on CUDA runs
  `max_pool2d_with_indices`, aten/src/ATen/native/Pooling.cpp); cuDNN's workspace for a
  convolution (aten/src/ATen/native/cudnn/Conv_v8.cpp allocates it through the caching
  allocator per call; its size is cuDNN's choice: `latpred.memory.cudnn_workspace`); MEAN's
  global-reduction buffer and semaphores when the reduction is split across blocks
  (aten/src/ATen/native/cuda/Reduce.cuh, `ReduceConfig`; `mean_scratch`);
  SQUARED_DIFFERENCE's `a - b`; SOFTMAX's `x * beta` when beta != 1;
- at the end the env is dropped: every storage not returned is freed.
"""

from __future__ import annotations

from math import prod
from typing import Callable, NamedTuple

from latpred.graph import Graph, Op
from latpred.windows import pair, window_padding

_VIEWS = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
_OWN_SETUP = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D",
              "AVERAGE_POOL_2D", "MEAN", "SPLIT", "SPLIT_V", "TRANSPOSE", "PAD", "PADV2",
              "STRIDED_SLICE"}


class Event(NamedTuple):
    action: str      # "alloc" or "free"
    storage: int
    nbytes: int
    op: int
    what: str = ""   # "weight", "temp", "input", "output", "workspace", "scratch"


_numel = prod                   # a shape's elements (1 for a scalar's empty shape)
_new = tuple.__new__            # an Event without NamedTuple's Python-level __new__ (hot)


def _contig_strides(shape) -> list[int]:
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= shape[d]
    return strides


def is_contiguous(shape, strides) -> bool:
    """c10's default contiguity: size-1 dimensions are skipped."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _channels_last_weight_needs_temp(shape) -> bool:
    """A weight [O, I, kh, kw] stored channels_last (strides I*kh*kw, 1, kw*I, I): whether it is
    not default-contiguous (then a precision-changing copy goes through a temporary)."""
    o, i, kh, kw = shape
    return not is_contiguous((o, i, kh, kw), (i * kh * kw, 1, kw * i, i))


FREE = -1      # a request's size for a free (the compiled allocator's code for one too)


class OpRequests:
    """One op's requests, in order: (bytes, ref, kind) allocates, `ref` its index among the
    op's own allocations; (FREE, ref, kind) frees the op's allocation `ref`. `outs`: where each
    output lives: one of the op's allocations (>= 0) or a view of an input (-1 - j: of
    op.inputs[j])."""

    __slots__ = ("reqs", "n", "outs")

    def __init__(self):
        self.reqs: list[tuple[int, int, str]] = []
        self.n = 0
        self.outs: list[int] = []

    def alloc(self, nbytes: int, what: str) -> int:
        self.reqs.append((int(nbytes), self.n, what))
        self.n += 1
        return self.n - 1

    def free(self, ref: int, what: str) -> None:
        self.reqs.append((FREE, ref, what))


def load_requests(graph: Graph, op: Op, elem: int) -> OpRequests:
    """The op's share of `load_events`: its module's parameters and buffers."""
    t = graph.tensors
    r = OpRequests()
    if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = t[op.inputs[1]].shape
        if op.type == "DEPTHWISE_CONV_2D":
            torch_w = (w[3], 1, w[1], w[2])
        else:
            torch_w = (w[0], w[3], w[1], w[2])
        r.alloc(_numel(w) * elem, "weight")
        # the module is built in float32 on the CPU: another precision is a converting copy
        if elem != 4 and _channels_last_weight_needs_temp(torch_w):
            r.free(r.alloc(_numel(w) * elem, "temp"), "temp")
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            r.alloc(_numel(t[op.inputs[2]].shape) * elem, "weight")
    elif op.type == "FULLY_CONNECTED":
        r.alloc(_numel(t[op.inputs[1]].shape) * elem, "weight")
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            r.alloc(_numel(t[op.inputs[2]].shape) * elem, "weight")
    elif op.type not in _OWN_SETUP:     # _setup_generic: constant operands as buffers
        for i in op.inputs:
            if i >= 0 and t[i].is_constant:
                r.alloc(_numel(t[i].shape) * elem, "weight")
    return r


def load_events(graph: Graph, elem: int) -> list[Event]:
    """Weights (module order), then the inputs; `elem`: bytes per element (2 or 4)."""
    ev: list[Event] = []
    sid = 0
    for op in graph.ops:
        sid = _expand(load_requests(graph, op, elem), sid, -1, ev)
    for i in graph.inputs:
        ev.append(_new(Event, ("alloc", sid, _numel(graph.tensors[i].shape) * elem, -1,
                               "input")))
        sid += 1
    return ev


def _expand(r: OpRequests, first: int, op: int, ev: list[Event]) -> int:
    """Append one op's requests to `ev` as Events, its allocations numbered from `first`;
    returns the next free storage id."""
    for size, ref, what in r.reqs:
        if size == FREE:
            ev.append(_new(Event, ("free", first + ref, 0, op, what)))
        else:
            ev.append(_new(Event, ("alloc", first + ref, size, op, what)))
    return first + r.n


WorkspaceFn = Callable[[Graph, Op, int], int]
ScratchFn = Callable[[Graph, Op, int], "tuple[int, ...]"]


def forward_requests(graph: Graph, op: Op, elem: int, workspace: WorkspaceFn,
                     scratch: ScratchFn) -> OpRequests:
    """What one op of the forward allocates and frees, and where its outputs live."""
    t = graph.tensors
    outs = op.outputs
    ty = op.type
    r = OpRequests()
    temps: list[int] = []
    if ty in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D"):
        x = t[op.inputs[0]].shape
        if ty in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w = t[op.inputs[1]].shape
            khw = (w[1], w[2])
        else:
            khw = pair(op.attr("filter", 1), "pool filter")
        sym, asym = window_padding(x[1:3], khw, pair(op.attr("stride", 1), "stride"),
                                   pair(op.attr("dilation", 1), "dilation"),
                                   op.attr("padding", "VALID"))
        if asym is not None and None in sym:
            l, rr, tp, b = asym
            temps.append(r.alloc((x[0] * (x[1] + tp + b) * (x[2] + l + rr) * x[3]) * elem,
                                 "temp"))
        r.outs.append(r.alloc(_numel(t[outs[0]].shape) * elem, "output"))
        if ty == "MAX_POOL_2D":
            temps.append(r.alloc(_numel(t[outs[0]].shape) * 8, "temp"))
        elif ty in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            ws = workspace(graph, op, elem)
            if ws > 0:
                r.free(r.alloc(ws, "workspace"), "workspace")
    elif ty in _VIEWS:
        r.outs.append(-1)
    elif ty in ("SPLIT", "SPLIT_V"):
        src = 1 if ty == "SPLIT" else 0
        strides = _contig_strides(t[op.inputs[src]].shape)
        for o in outs:
            r.outs.append(-1 - src if is_contiguous(t[o].shape, strides)
                          else r.alloc(_numel(t[o].shape) * elem, "output"))
    elif ty == "STRIDED_SLICE":
        r.outs.append(-1 if _slice_contiguous(graph, op) else r.alloc(_numel(t[outs[0]].shape) * elem, "output"))
    elif ty == "TRANSPOSE":
        shape = t[op.inputs[0]].shape
        perm = tuple(int(v) for v in t[op.inputs[1]].value)
        strides = _contig_strides(shape)
        r.outs.append(-1 if is_contiguous([shape[p] for p in perm], [strides[p] for p in perm])
                      else r.alloc(_numel(t[outs[0]].shape) * elem, "output"))
    else:
        if ty == "SQUARED_DIFFERENCE" or (ty == "SOFTMAX" and
                                          float(op.attr("beta", 1.0)) != 1.0):
            first = next(i for i in op.inputs if i >= 0)
            temps.append(r.alloc(_numel(t[first].shape) * elem, "temp"))
        for o in outs:
            r.outs.append(r.alloc(_numel(t[o].shape) * elem, "output"))
        if ty == "MEAN":    # buffer then semaphores, both held through the launch
            held = [r.alloc(s, "scratch") for s in scratch(graph, op, elem)]
            for s in reversed(held):
                r.free(s, "scratch")
    for s in temps:
        r.free(s, "temp")
    return r


def forward_events(graph: Graph, elem: int, workspace: WorkspaceFn, scratch: ScratchFn,
                   first_storage: int, returns: bool = True) -> list[Event]:
    """One forward: the events per op, then (`returns`) the frees when it returns (outputs
    kept; they cannot raise the peak, so `memory_totals` leaves them out)."""
    ev: list[Event] = []
    sid = first_storage
    storage: dict[int, int] = {}
    for k, i in enumerate(graph.inputs):
        storage[i] = -1 - k                       # the inputs: held by the caller
    for k, op in enumerate(graph.ops):
        r = forward_requests(graph, op, elem, workspace, scratch)
        for o, where in zip(op.outputs, r.outs):
            storage[o] = sid + where if where >= 0 else storage[op.inputs[-1 - where]]
        sid = _expand(r, sid, k, ev)
    if not returns:
        return ev
    end = len(graph.ops)
    kept = {storage[o] for o in graph.outputs if o in storage}
    seen = set()
    for tid, s in storage.items():        # the env dict, in insertion order
        if s < 0 or s in kept or s in seen:
            continue
        seen.add(s)
        ev.append(_new(Event, ("free", s, 0, end, "output")))
    return ev


def _slice_contiguous(graph: Graph, op: Op) -> bool:
    """Whether `x[index]` of a STRIDED_SLICE is contiguous (its `.contiguous()` is a no-op)."""
    shape = graph.tensors[op.inputs[0]].shape
    out = graph.tensors[op.outputs[0]].shape
    strides = _contig_strides(shape)
    vals = [graph.tensors[i].value for i in op.inputs[1:4]]
    step = tuple(int(v) for v in vals[2]) if len(vals) > 2 and vals[2] else (1,) * len(shape)
    sm = int(op.attr("shrink_axis_mask", 0))
    kept_shape, kept_strides = [], []
    for d in range(len(shape)):         # the view's kept dimensions, in order
        if sm >> d & 1:
            continue
        kept_shape.append(out[len(kept_shape)] if len(kept_shape) < len(out) else 1)
        kept_strides.append(strides[d] * step[d])
    return is_contiguous(kept_shape, kept_strides)
