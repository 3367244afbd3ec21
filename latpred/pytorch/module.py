"""latpred.Graph -> torch.nn.Module: one `Layer` per graph op, run in the graph's order.

`to_torch(graph, batch=None, exact=False, seed=0)` gives a `GraphModule` whose `forward` takes the
graph's inputs as NHWC tensors (or NCHW channels_last ones with `nchw_inputs=True` views — the
same memory) and returns its outputs NHWC. Weights are the seeded ones `write_tflite` writes for
the same graph and seed (`latpred.tflite.weights.constant_data`), so a module and the `.tflite`
file of one graph compute the same function (`seed=None`: fast random weights, for timing). `GraphModule.annotate = True` wraps every op in a
`torch.profiler.record_function("latpred_op<i>:<TYPE>")` range, which maps the CUDA kernels a
profiled run launches back to graph ops (`op_of_range`).
"""

from __future__ import annotations

import re
from contextlib import nullcontext

import numpy as np
import torch
from torch import nn

from latpred.errors import LatpredError
from latpred.graph import Graph, Op
from latpred.pytorch.batch import with_batch
from latpred.pytorch.ops import OPS
from latpred.windows import pair, window_padding

RANGE_PREFIX = "latpred_op"
_RANGE_RE = re.compile(rf"{RANGE_PREFIX}(\d+):")


class UnsupportedOpError(LatpredError):
    """A graph op the PyTorch runtime has no implementation for."""


def op_of_range(name: str) -> int | None:
    """The op index of a `record_function` range name this module made, else None."""
    m = _RANGE_RE.match(name)
    return int(m.group(1)) if m else None


def _torch_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class Layer(nn.Module):
    """One graph op: its attributes as plain fields, its weights as parameters/buffers."""

    def __init__(self, graph: Graph, index: int, data: dict[int, np.ndarray], exact: bool):
        super().__init__()
        op = graph.ops[index]
        self.type, self.index, self.exact = op.type, index, exact
        self.act = op.activation
        self.n_inputs = len(op.inputs)
        self.out_shapes = [tuple(graph.tensors[t].shape) for t in op.outputs]
        self.const_inputs: tuple[int, ...] = ()
        self.fn = OPS.get(op.type)
        if self.fn is None:
            raise UnsupportedOpError(f"The PyTorch runtime has no implementation of {op.type} "
                                     f"(op {index}).")
        setup = _SETUP.get(op.type, _setup_generic)
        setup(self, graph, op, data)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.fn(self, xs)


def _tensor(data: dict[int, np.ndarray] | None, graph: Graph, t: int) -> torch.Tensor:
    shape = graph.tensors[t].shape
    if data is None:   # timing only: random weights scaled by their fan-in, made fast
        fan_in = max(1, int(np.prod(shape[1:]))) if len(shape) > 1 else 1
        return torch.randn(shape) * (1.0 / fan_in) ** 0.5
    arr = data.get(t)
    if arr is None:
        arr = np.zeros(shape, np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def _const_value(graph: Graph, t: int) -> tuple[int, ...]:
    v = graph.tensors[t].value
    if v is None:
        raise UnsupportedOpError(f"Tensor {graph.tensors[t].name!r} must be a constant with a "
                                 "known value for the PyTorch runtime.")
    return tuple(int(x) for x in v)


def _setup_window(layer: Layer, graph: Graph, op: Op, kernel_hw) -> None:
    x = graph.tensors[op.inputs[0]]
    layer.stride = pair(op.attr("stride", 1), "stride")
    layer.dilation = pair(op.attr("dilation", 1), "dilation")
    layer.pad_sym, layer.pad_asym = window_padding(x.shape[1:3], kernel_hw, layer.stride,
                                                   layer.dilation, op.attr("padding", "VALID"))


def _setup_conv(layer: Layer, graph: Graph, op: Op, data) -> None:
    w = _tensor(data, graph, op.inputs[1])            # [O, H, W, I/g] or [1, H, W, C*m]
    cin = graph.tensors[op.inputs[0]].shape[-1]
    if op.type == "DEPTHWISE_CONV_2D":
        w = w[0].permute(2, 0, 1).unsqueeze(1)         # [C*m, 1, H, W]
        layer.groups = cin
    else:
        w = w.permute(0, 3, 1, 2)                      # [O, I/g, H, W]
        layer.groups = max(1, cin // w.shape[1])
    layer.weight = nn.Parameter(w.contiguous(memory_format=torch.channels_last),
                                requires_grad=False)
    has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
    layer.bias = nn.Parameter(_tensor(data, graph, op.inputs[2]), requires_grad=False) \
        if has_bias else None
    _setup_window(layer, graph, op, tuple(w.shape[2:]))


def _setup_fc(layer: Layer, graph: Graph, op: Op, data) -> None:
    layer.weight = nn.Parameter(_tensor(data, graph, op.inputs[1]), requires_grad=False)
    has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
    layer.bias = nn.Parameter(_tensor(data, graph, op.inputs[2]), requires_grad=False) \
        if has_bias else None


def _setup_pool(layer: Layer, graph: Graph, op: Op, data) -> None:
    layer.filter = pair(op.attr("filter", 1), "pool filter")
    _setup_window(layer, graph, op, layer.filter)


def _setup_mean(layer: Layer, graph: Graph, op: Op, data) -> None:
    rank = len(graph.tensors[op.inputs[0]].shape)
    layer.axes = tuple(sorted({_torch_axis(a, rank) for a in _const_value(graph, op.inputs[1])}))
    layer.keep_dims = bool(op.attr("keep_dims", False))
    layer.n_inputs = 1


def _setup_generic(layer: Layer, graph: Graph, op: Op, data) -> None:
    """Element-wise and other ops: constant operands become buffers."""
    for k, t in enumerate(op.inputs):
        if t >= 0 and graph.tensors[t].is_constant:
            value = graph.tensors[t].value
            if value is not None:
                arr = np.asarray(value, np.float32).reshape(graph.tensors[t].shape)
                buf = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
            else:
                buf = _tensor(data, graph, t)
            layer.register_buffer(f"const{k}", buf)
            layer.const_inputs += (k,)
    layer.approximate = bool(op.attr("approximate", False))
    layer.alpha = float(op.attr("alpha", 0.2))
    layer.beta = float(op.attr("beta", 1.0))
    layer.adj_x, layer.adj_y = bool(op.attr("adj_x", False)), bool(op.attr("adj_y", False))


def _setup_concat(layer: Layer, graph: Graph, op: Op, data) -> None:
    _setup_generic(layer, graph, op, data)
    rank = len(graph.tensors[op.outputs[0]].shape)
    layer.axis = _torch_axis(int(op.attr("axis", -1)), rank)


def _setup_split(layer: Layer, graph: Graph, op: Op, data) -> None:
    if op.type == "SPLIT":
        layer.data_input, axis = 1, _const_value(graph, op.inputs[0])[0]
    else:
        layer.data_input, axis = 0, _const_value(graph, op.inputs[2])[0]
    rank = len(graph.tensors[op.inputs[layer.data_input]].shape)
    layer.axis = _torch_axis(axis, rank)
    layer.sizes = tuple(graph.tensors[t].shape[layer.axis] for t in op.outputs)


def _setup_transpose(layer: Layer, graph: Graph, op: Op, data) -> None:
    layer.perm = _const_value(graph, op.inputs[1])


def _setup_pad(layer: Layer, graph: Graph, op: Op, data) -> None:
    flat = _const_value(graph, op.inputs[1])
    pairs = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]
    layer.torch_pads = tuple(v for b, a in reversed(pairs) for v in (b, a))
    layer.pad_value = 0.0
    if op.type == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        v = graph.tensors[op.inputs[2]].value
        layer.pad_value = float(v[0]) if v else 0.0


def _setup_strided_slice(layer: Layer, graph: Graph, op: Op, data) -> None:
    shape = graph.tensors[op.inputs[0]].shape
    begin, end = _const_value(graph, op.inputs[1]), _const_value(graph, op.inputs[2])
    strides = _const_value(graph, op.inputs[3]) if len(op.inputs) > 3 else (1,) * len(shape)
    if op.attr("ellipsis_mask", 0) or op.attr("new_axis_mask", 0):
        raise UnsupportedOpError("STRIDED_SLICE with ellipsis or new-axis masks is not supported "
                                 "by the PyTorch runtime.")
    bm, em, sm = (int(op.attr(k, 0)) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
    index = []
    for d, size in enumerate(shape):
        if sm >> d & 1:
            index.append(begin[d] + size if begin[d] < 0 else begin[d])
            continue
        b = None if bm >> d & 1 else begin[d]
        e = None if em >> d & 1 else end[d]
        if op.attr("offset", False) and e is not None and b is not None:
            e = b + e
        index.append(slice(b, e, strides[d]))
    if any(isinstance(s, slice) and s.step is not None and s.step < 0 for s in index):
        raise UnsupportedOpError("STRIDED_SLICE with negative strides is not supported by the "
                                 "PyTorch runtime.")
    layer.index = tuple(index)


def _setup_slice(layer: Layer, graph: Graph, op: Op, data) -> None:
    shape = graph.tensors[op.inputs[0]].shape
    begin, size = _const_value(graph, op.inputs[1]), _const_value(graph, op.inputs[2])
    layer.index = tuple(slice(b, n if s == -1 else b + s)
                        for b, s, n in zip(begin, size, shape))


_SETUP = {"CONV_2D": _setup_conv, "DEPTHWISE_CONV_2D": _setup_conv,
          "FULLY_CONNECTED": _setup_fc, "MAX_POOL_2D": _setup_pool,
          "AVERAGE_POOL_2D": _setup_pool, "MEAN": _setup_mean,
          "CONCATENATION": _setup_concat, "SPLIT": _setup_split, "SPLIT_V": _setup_split,
          "TRANSPOSE": _setup_transpose, "PAD": _setup_pad, "PADV2": _setup_pad,
          "STRIDED_SLICE": _setup_strided_slice, "SLICE": _setup_slice}


class GraphModule(nn.Module):
    """A latpred Graph as a torch module (see the module docstring)."""

    def __init__(self, graph: Graph, exact: bool = False, seed: int | None = 0):
        super().__init__()
        self.graph = graph
        data = None
        if seed is not None:
            from latpred.tflite.weights import constant_data

            data = constant_data(graph, seed)
        self.layers = nn.ModuleList(Layer(graph, i, data, exact) for i in range(len(graph.ops)))
        self.annotate = False
        self._plan = [(tuple(op.inputs), tuple(op.outputs)) for op in graph.ops]

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(self.graph.tensors[t].shape) for t in self.graph.inputs]

    def forward(self, *inputs: torch.Tensor):
        from torch.profiler import record_function

        env: dict[int, torch.Tensor] = dict(zip(self.graph.inputs, inputs))
        for layer, (ins, outs) in zip(self.layers, self._plan):
            ctx = record_function(f"{RANGE_PREFIX}{layer.index}:{layer.type}") \
                if self.annotate else nullcontext()
            with ctx:
                ys = layer([env[t] if t in env else None for t in ins])
            for t, y in zip(outs, ys):
                env[t] = y
        outs = [env[t] for t in self.graph.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)


def to_torch(graph: Graph, batch: int | None = None, exact: bool = False,
             seed: int | None = 0) -> GraphModule:
    """The module that runs `graph` (at `batch`, when given; see `with_batch`).

    `seed=None` skips `write_tflite`'s seeded weights for fast random ones (timing only).
    """
    if batch is not None:
        graph = with_batch(graph, batch)
    return GraphModule(graph, exact=exact, seed=seed)
