"""Full-integer (int8) quantization of an fp32 graph, the way TFLite's converter does it.

- Activations, graph inputs and outputs: int8, asymmetric, per tensor, from calibrated ranges
  (`calibrate.py`: the fp32 model run in LiteRT on seeded inputs).
- Weights int8 symmetric (per output channel for convolutions), biases int32, other float
  constants asymmetric (`int8_values`).
- Kernel constraints: LOGISTIC/SOFTMAX/TANH/LOG_SOFTMAX outputs get the fixed parameters their
  int8 kernels require; ops that only move data (RESHAPE, TRANSPOSE, PAD, pools, CONCATENATION,
  SPLIT, ...) share one scale and zero point between their data inputs and outputs, taken over
  the union of their ranges (a fixed-parameter tensor in such a group fixes the whole group).
  Where one group would hold two different fixed parameters (a TANH and a LOGISTIC output
  concatenated), the first keeps the group and each other one is requantized into it by a
  QUANTIZE op (int8 to int8), as the converter's quantization driver inserts a requantize on
  a conflicting operand: otherwise the LOGISTIC's output would carry TANH's scale, which
  TFLite's kernel refuses at Prepare ("output->params.scale == 1. / 256", activations.cc).
- Ops with no int8 kernel known here stay fp32, between DEQUANTIZE and QUANTIZE ops, as the
  converter leaves an op it cannot quantize.
"""

from __future__ import annotations

import numpy as np

from latpred.errors import UnsupportedModelError
from latpred.graph import Graph, Op, Quantization, Tensor
from latpred.tflite.calibrate import calibrate
from latpred.tflite.int8_values import (HAS_BIAS, WEIGHT_AXIS, WEIGHTS, affine,
                                        quantize_constants, to_int8)
from latpred.tflite.weights import constant_data

FIXED = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128), "TANH": (1 / 128, 0),
         "LOG_SOFTMAX": (16 / 256, 127)}
SAME_SCALE = frozenset({
    "RESHAPE", "TRANSPOSE", "PAD", "PADV2", "MAX_POOL_2D", "AVERAGE_POOL_2D", "CONCATENATION",
    "SPLIT", "SPLIT_V", "STRIDED_SLICE", "SQUEEZE", "EXPAND_DIMS", "SLICE", "GATHER",
    "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "RESIZE_NEAREST_NEIGHBOR", "REDUCE_MAX", "MAXIMUM",
    "MINIMUM", "BROADCAST_TO", "TILE",
})
FREE = frozenset({
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MEAN", "SUM", "ADD", "SUB", "MUL",
    "DIV", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "HARD_SWISH", "GELU", "PRELU",
    "BATCH_MATMUL", "SQUARED_DIFFERENCE", "RSQRT", "NEG", "ABS", "RESIZE_BILINEAR",
})
INT8_KERNELS = FREE | SAME_SCALE | FIXED.keys()     # ops with an int8 kernel known here


def _data_inputs(op: Op) -> tuple[int, ...]:
    """The inputs of a data-movement op that carry the data (not shapes, axes, paddings)."""
    if op.type in ("CONCATENATION", "MAXIMUM", "MINIMUM"):
        return op.inputs
    if op.type == "SPLIT":
        return op.inputs[1:2]
    if op.type == "PADV2":
        return (op.inputs[0],) + op.inputs[2:3]
    return op.inputs[:1]


class _Groups:
    """Union-find over tensor indices: tensors that must share quantization parameters."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, t: int) -> int:
        root = t
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        self.parent[t] = root
        return root

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def quantize(graph: Graph, seed: int) -> tuple[Graph, dict[int, np.ndarray]]:
    """The int8 graph and the data of its constants (same seed -> same result)."""
    _check_float(graph)
    data = constant_data(graph, seed)
    from latpred.tflite.writer import serialize

    ranges = calibrate(serialize(graph, data), graph, seed)
    island = _islands(graph)
    keep_float = _float_tensors(graph, island)
    params, requant = _activation_params(graph, ranges, data, island, keep_float)
    tensors = _int8_tensors(graph, params)
    qdata = dict(data)
    qdata.update((i, to_int8(data[i], q)) for i, q in params.items()
                 if graph.tensors[i].is_constant)
    for op_index, op in enumerate(graph.ops):
        if op_index not in island:
            quantize_constants(op, graph, params, data, tensors, qdata)
    ops = _requantize(_wrap_islands(graph, tensors, island, keep_float), tensors, requant)
    return Graph(tuple(tensors), tuple(ops), graph.inputs, graph.outputs, graph.name), qdata


def int8_layout(graph: Graph) -> Graph:
    """The int8 graph `quantize` would write, without calibration or weights: the same ops
    (fp32 islands between DEQUANTIZE and QUANTIZE, conflicting fixed parameters requantized)
    and data types. Activations get placeholder parameters (a [0, 1] range) unless fixed, so
    checks on scales see equal ones, as the latency deduction assumes of a float graph. For
    what depends on structure and data types only: the memory a NAS candidate needs on an
    int8 target before it is written (`latpred.memory`)."""
    _check_float(graph)
    island = _islands(graph)
    keep_float = _float_tensors(graph, island)
    floats = [(i, t.is_constant) for i, t in enumerate(graph.tensors) if t.dtype == "float32"]
    ranges = {i: (0.0, 1.0) for i, const in floats if not const}
    stand_in = dict.fromkeys((i for i, const in floats if const), _NOWEIGHTS)
    params, requant = _activation_params(graph, ranges, stand_in, island, keep_float)
    tensors = _int8_tensors(graph, params)
    for op_index, op in enumerate(graph.ops):
        if op_index in island:
            continue
        for k, t in enumerate(op.inputs):
            src = tensors[t] if t >= 0 else None
            if src is None or not src.is_constant or src.dtype != "float32":
                continue
            bias = k == 2 and op.type in HAS_BIAS
            if bias or (k == 1 and op.type in WEIGHTS):
                axis = WEIGHT_AXIS.get(op.type) if k == 1 else None
                n = src.shape[axis] if axis is not None else 1
                q = Quantization((1.0,) * n, (0,) * n, axis or 0)
            else:
                # an operand (ADD's, MUL's constant): asymmetric like the activations, so the
                # delegate's scale checks see the ratio a written file has, not 255
                q = _PLACEHOLDER
            tensors[t] = Tensor(src.name, src.shape, "int32" if bias else "int8", q, True, None)
    ops = _requantize(_wrap_islands(graph, tensors, island, keep_float), tensors, requant)
    return Graph(tuple(tensors), tuple(ops), graph.inputs, graph.outputs, graph.name)


_NOWEIGHTS = np.zeros(1, np.float32)       # int8_layout's stand-in for every constant's data
_PLACEHOLDER = affine(0.0, 1.0)             # int8_layout's activation ranges are [0, 1]


def _islands(graph: Graph) -> set[int]:
    """Ops with no int8 kernel known here: they stay fp32 (`_wrap_islands`)."""
    return {i for i, op in enumerate(graph.ops) if op.type not in INT8_KERNELS}


def _int8_tensors(graph: Graph, params: dict[int, Quantization]) -> list[Tensor]:
    """The graph's tensors, those of `params` made int8 with their parameters."""
    tensors = list(graph.tensors)
    for i, q in params.items():
        t = graph.tensors[i]
        tensors[i] = Tensor(t.name, t.shape, "int8", q, t.is_constant, None)
    return tensors


def is_float_graph(graph: Graph) -> bool:
    """Whether `quantize` / `int8_layout` take the graph: no quantized or 8-bit tensor."""
    return all(t.quantization is None and t.dtype in FLOAT_GRAPH_TYPES for t in graph.tensors)


FLOAT_GRAPH_TYPES = frozenset({"float32", "int32", "int64", "bool"})


def _check_float(graph: Graph) -> None:
    for t in graph.tensors:
        if t.quantization is not None or t.dtype not in FLOAT_GRAPH_TYPES:
            raise UnsupportedModelError(f"int8 writing needs an fp32 graph, but tensor "
                                        f"{t.name!r} is {t.dtype}"
                                        f"{' and quantized' if t.quantization else ''}.")


def _float_tensors(graph: Graph, island: set[int]) -> set[int]:
    """Activations that stay fp32: made by an fp32 island and read only by islands."""
    keep = set()
    ends = set(graph.inputs) | set(graph.outputs)
    for i, op in enumerate(graph.ops):
        if i in island:
            for t in op.outputs:
                if t not in ends and all(c in island for c in graph.consumers_of(t)):
                    keep.add(t)
    return keep


def _same_scale_groups(graph: Graph, island: set[int]
                       ) -> tuple[_Groups, dict[int, tuple[float, int]], set[int]]:
    """The tensors that must share parameters (union-find), the fixed parameters of the ops'
    outputs that need them, and the float constants inside a group (islands left out)."""
    groups = _Groups()
    fixed: dict[int, tuple[float, int]] = {}
    grouped_consts: set[int] = set()
    for i, op in enumerate(graph.ops):
        if i in island:
            continue
        if op.type in FIXED:
            for t in op.outputs:
                fixed[t] = FIXED[op.type]
        if op.type in SAME_SCALE:
            members = [t for t in (*_data_inputs(op), *op.outputs)
                       if t >= 0 and graph.tensors[t].dtype == "float32"]
            grouped_consts.update(t for t in members if graph.tensors[t].is_constant)
            for t in members[1:]:
                groups.union(members[0], t)
    return groups, fixed, grouped_consts


def float_twin(graph: Graph) -> Graph | None:
    """A float graph whose int8 model `int8_layout(graph)` differs from it in data types only:
    `graph` itself, when the layout keeps its ops and tensors; the graph with the
    requantizing QUANTIZE ops the layout adds (each writing a new tensor that the fixed-
    parameter tensor's same-scale readers read), when a same-scale group holds two different
    fixed parameters; None when the layout wraps an fp32 island in DEQUANTIZE / QUANTIZE, or
    when a float constant sits in a same-scale group (its scale would come from its absent
    data, not from a placeholder or a fixed parameter). What `latpred.memory.flat_int8` plans
    without building the layout (the new tensors are int8 already; the rest it retypes)."""
    tensors = graph.tensors
    params: set[tuple[float, int]] = set()
    fixed_out: set[int] = set()
    read_same: list[int] = []           # what same-scale ops read
    for op in graph.ops:                # one pass: NAS loops call this per candidate
        kind = op.type
        if kind not in INT8_KERNELS:
            return None
        if kind in SAME_SCALE:
            data = _data_inputs(op)
            for t in data:
                if t >= 0 and tensors[t].is_constant and tensors[t].dtype == "float32":
                    return None
            read_same += data
        elif kind in FIXED:
            params.add(FIXED[kind])
            fixed_out.update(op.outputs)
    # a fixed-parameter tensor (an op's output) joins a group only where a same-scale op reads
    # it: without one, no group holds two
    if len(params) < 2 or fixed_out.isdisjoint(read_same):
        return graph
    groups, fixed, _ = _same_scale_groups(graph, set())
    pinned_at: dict[int, tuple[float, int]] = {}
    if all(pinned_at.setdefault(groups.find(t), q) == q for t, q in fixed.items()):
        return graph
    # `_activation_params`' order: groups as their first activation comes, members in index
    # order; the first fixed member keeps the group's parameters
    members_of: dict[int, list[int]] = {}
    for t, x in enumerate(tensors):
        if x.dtype == "float32" and not x.is_constant:
            members_of.setdefault(groups.find(t), []).append(t)
    requant: list[int] = []
    for members in members_of.values():
        pinned = [fixed[t] for t in members if t in fixed]
        requant += [t for t in members if t in fixed and fixed[t] != pinned[0]]
    return requantized(graph, requant) if requant else graph


def requantized(graph: Graph, requant: list[int]) -> Graph:
    """`graph` with tensors `requant` requantized (`_requantize`, in this order) into the
    layout's placeholder parameters: `float_twin`'s twin (`latpred.memory.compiled_twin`
    finds the same tensors)."""
    new_tensors = list(graph.tensors)
    ops = _requantize(list(graph.ops), new_tensors, dict.fromkeys(requant, _PLACEHOLDER))
    return Graph(tuple(new_tensors), tuple(ops), graph.inputs, graph.outputs, graph.name)


def _activation_params(graph: Graph, ranges, data, island, keep_float
                       ) -> tuple[dict[int, Quantization], dict[int, Quantization]]:
    """Parameters of every int8 activation, and of float constants inside same-scale groups;
    and the fixed-parameter tensors whose group holds other fixed parameters, each with the
    group's parameters (a QUANTIZE op requantizes it into the group, `_requantize`)."""
    groups, fixed, grouped_consts = _same_scale_groups(graph, island)
    members_of: dict[int, list[int]] = {}
    for t in [*ranges, *grouped_consts]:
        if t not in keep_float:
            members_of.setdefault(groups.find(t), []).append(t)
    params: dict[int, Quantization] = {}
    requant: dict[int, Quantization] = {}
    for members in members_of.values():
        pinned = [fixed[t] for t in members if t in fixed]
        if pinned:
            q = Quantization((pinned[0][0],), (pinned[0][1],))
        else:
            lo = min(_range(t, ranges, data)[0] for t in members)
            hi = max(_range(t, ranges, data)[1] for t in members)
            q = affine(lo, hi)
        params.update({t: q for t in members})
        for t in members:
            if t in fixed and fixed[t] != pinned[0]:
                params[t] = Quantization((fixed[t][0],), (fixed[t][1],))
                requant[t] = q
    return params, requant


def _requantize(ops: list[Op], tensors: list[Tensor], requant: dict[int, Quantization]
                ) -> list[Op]:
    """Each tensor of `requant` requantized by a QUANTIZE op right after its producer into a
    new tensor with its group's parameters, which its same-scale consumers read instead."""
    if not requant:
        return ops
    into: dict[int, int] = {}
    for t, q in requant.items():
        src = tensors[t]
        tensors.append(Tensor(f"{src.name}/requantized", src.shape, "int8", q))
        into[t] = len(tensors) - 1
    out: list[Op] = []
    for op in ops:
        if op.type in SAME_SCALE and any(t in into for t in op.inputs):
            op = Op(op.type, tuple(into.get(t, t) for t in op.inputs), op.outputs, op.attrs)
        out.append(op)
        out.extend(Op.make("QUANTIZE", (t,), (into[t],)) for t in op.outputs if t in into)
    return out


def _range(t: int, ranges, data) -> tuple[float, float]:
    if t in ranges:
        return ranges[t]
    x = data[t]
    return (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)


def _wrap_islands(graph: Graph, tensors: list[Tensor], island: set[int],
                  keep_float: set[int]) -> list[Op]:
    """Ops in order, each fp32 island op between DEQUANTIZE of its int8 inputs and QUANTIZE of
    its int8 outputs. New float tensors are appended to `tensors`."""
    ops: list[Op] = []
    dequantized: dict[int, int] = {}

    def add_float(like: int, suffix: str) -> int:
        t = graph.tensors[like]
        tensors.append(Tensor(f"{t.name}/{suffix}", t.shape, "float32"))
        return len(tensors) - 1

    for i, op in enumerate(graph.ops):
        if i not in island:
            ops.append(op)
            continue
        inputs = []
        for t in op.inputs:
            if t >= 0 and tensors[t].dtype == "int8" and not tensors[t].is_constant:
                if t not in dequantized:
                    dequantized[t] = add_float(t, "dequantized")
                    ops.append(Op.make("DEQUANTIZE", (t,), (dequantized[t],)))
                t = dequantized[t]
            inputs.append(t)
        outputs, requant = [], []
        for t in op.outputs:
            if tensors[t].dtype == "int8" and t not in keep_float:
                f = add_float(t, "float")
                requant.append(Op.make("QUANTIZE", (f,), (t,)))
                t = f
            outputs.append(t)
        ops.append(Op(op.type, tuple(inputs), tuple(outputs), op.attrs))
        ops.extend(requant)
    return ops
