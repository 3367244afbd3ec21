"""Which ops the XNNPACK delegate takes and the partitions TFLite forms around them.

Sources: google-ai-edge/LiteRT v2.2.0 tflite/delegates/xnnpack/xnnpack_delegate.cc (the
Visit* checks `supported` approximates), tflite/graph_info.cc
(`PartitionGraphIntoIndependentNodeSubsets`, `BuildNodeSubset`). `xnnpack.delegated_input`
builds the execution plan from these partitions. An 8-bit op is also checked against what the
delegate declines for 8-bit tensors (`latpred.deduce.xnnpack_int8.declined`, the rules the
latency deduction uses: float-only Visit* functions, scale ranges, fused activations).
"""

from __future__ import annotations

from latpred.deduce.prepare import MMAP
from latpred.deduce.xnnpack_int8 import EIGHT_BIT_TYPES, declined
from latpred.graph import Graph, Op
from latpred.memory.configs import OpConfigs

_ELEMENTWISE = frozenset({
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "PRELU", "RELU",
    "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "LOGISTIC", "TANH", "HARD_SWISH", "ELU", "GELU",
    "ABS", "NEG", "SQRT", "SQUARE", "RSQRT", "EXP", "LOG", "FLOOR", "CEIL", "ROUND", "SIN",
    "COS"})
# Taken whatever their attributes (SPLIT: when its axis is static); poolings and SOFTMAX are
# checked in `supported`.
_ALWAYS = _ELEMENTWISE | {"CONCATENATION", "SPLIT", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH",
                          "RESIZE_BILINEAR", "BATCH_MATMUL", "QUANTIZE", "DEQUANTIZE"}
_DATA_DTYPES = frozenset({"float32", "int8", "uint8"})
# Ops with operands that must be static (kTfLiteMmapRo): input positions.
_STATIC = {"CONV_2D": (1, 2), "DEPTHWISE_CONV_2D": (1, 2), "FULLY_CONNECTED": (1, 2),
           "MEAN": (1,), "SUM": (1,), "REDUCE_MAX": (1,), "REDUCE_MIN": (1,), "PAD": (1,),
           "PADV2": (1, 2), "RESHAPE": (1,), "TRANSPOSE": (1,), "STRIDED_SLICE": (1, 2, 3),
           "SLICE": (1, 2), "EXPAND_DIMS": (1,), "TRANSPOSE_CONV": (0, 1)}
_POOLS = frozenset({"AVERAGE_POOL_2D", "MAX_POOL_2D"})


def supported(graph: Graph, op: Op, kinds: dict[int, str]) -> bool:
    """Whether the delegate takes `op` (float32 graphs; an approximation of its Visit* checks:
    operand types, static operands; SOFTMAX needs beta 1; SPLIT_V, SHAPE, PACK, GATHER stay)."""
    ins, type_ = op.inputs, op.type
    if eight_bit(graph, op) and declined(graph, op):
        return False
    data = 1 if type_ == "SPLIT" else 0          # SPLIT: axis first
    if len(ins) > data and ins[data] >= 0 and graph.tensors[ins[data]].dtype not in _DATA_DTYPES:
        return False  # XNNPACK takes fp32 and 8-bit quantized tensors, not int32 shapes
    static = _STATIC.get(type_)
    if static is not None:
        for k in static:
            if k < len(ins) and ins[k] >= 0 and kinds[ins[k]] != MMAP:
                return False
        return True
    if type_ in _ALWAYS:
        return type_ != "SPLIT" or kinds[ins[0]] == MMAP
    return (type_ in _POOLS or type_ == "SOFTMAX") and attrs_supported(op)


def eight_bit(graph: Graph, op: Op) -> bool:
    """Whether `op` writes an 8-bit tensor (the delegate's quantized Visit* paths)."""
    return bool(op.outputs) and graph.tensors[op.outputs[0]].dtype in EIGHT_BIT_TYPES


def attrs_supported(op: Op) -> bool:
    """What `supported` reads of a pooling's or SOFTMAX's attributes."""
    if op.type in _POOLS:
        # CheckPoolingParams: a stride larger than the filter is declined
        stride, size = op.attr("stride", (1, 1)), op.attr("filter", (1, 1))
        return stride[0] <= size[0] and stride[1] <= size[1]
    return abs(float(op.attr("beta", 1.0)) - 1.0) < 1e-9


def partitions(graph: Graph, kinds: dict[int, str]) -> list[tuple[bool, list[int]]]:
    """(delegated, op indices) subsets in execution order, as TFLite's greedy
    `PartitionGraphIntoIndependentNodeSubsets` forms them (tflite/graph_info.cc
    `BuildNodeSubset`): the subset takes the kind of the lowest ready op and keeps every op of
    that kind that becomes ready, before the next subset starts."""
    return _partitions(graph, kinds)[0]


def _partitions(graph: Graph, kinds: dict[int, str], configs: OpConfigs | None = None
                ) -> tuple[list[tuple[bool, list[int]]], list[int] | None]:
    """`partitions`, and each op's subset (None when there is one subset)."""
    sup = _supported_ops(graph, kinds, configs)
    if all(sup) or not any(sup):
        # one kind only: the first subset drains the whole graph
        return ([(sup[0], list(range(len(sup))))] if sup else []), None
    subset_of = _subset_numbers(graph, sup)
    if subset_of is None:
        out = _greedy_subsets(graph, sup)
        subset_of = [0] * len(sup)
        for k, (_, ops) in enumerate(out):
            for i in ops:
                subset_of[i] = k
        return out, subset_of
    groups: list[list[int]] = [[] for _ in range(max(subset_of) + 1)]
    for i, k in enumerate(subset_of):
        groups[k].append(i)
    return [(sup[ops[0]], ops) for ops in groups], subset_of


def _supported_ops(graph: Graph, kinds: dict[int, str], configs: OpConfigs | None
                   ) -> list[bool]:
    """`supported` per op. With `configs` (given only while every allocation type is the
    default one, so that it depends on nothing but the op's configuration), computed once per
    configuration; an 8-bit op's each time (its scales decide, and a configuration does not
    name them)."""
    if configs is None:
        return [supported(graph, op, kinds) for op in graph.ops]
    known = configs.supported
    out = []
    for op, c in zip(graph.ops, configs.of_op):
        s = known.get(c)
        if s is None:
            s = supported(graph, op, kinds)
            if c >= 0 and not eight_bit(graph, op):
                known[c] = s
        out.append(s)
    return out


def _subset_numbers(graph: Graph, sup: list[bool]) -> list[int] | None:
    """Each op's subset in one pass, when every op's producers come before it (else None).

    What the greedy drain comes to in that case: op 0 is ready, so the first subset has its
    kind; a drain stops only when no op of its kind is ready, so the kinds alternate (subset k
    has op 0's kind when k is even); and an op lands in the first subset of its kind that
    follows its producers: a producer's subset for one of its kind, the next one for the other
    kind. (Every candidate has the op's parity, so their maximum is that subset.)"""
    producers = graph.producers
    first = sup[0]
    subset_of: list[int] = []
    for j, op in enumerate(graph.ops):
        kind = sup[j]
        k = 0 if kind == first else 1
        for t in op.inputs:
            i = producers.get(t)
            if i is None:
                continue
            if i >= j:
                return None
            need = subset_of[i] if sup[i] == kind else subset_of[i] + 1
            if need > k:
                k = need
        subset_of.append(k)
    return subset_of


def _greedy_subsets(graph: Graph, sup: list[bool]) -> list[tuple[bool, list[int]]]:
    """`BuildNodeSubset` step by step (ops in any order): ready ops in a heap per kind."""
    import heapq

    producers = graph.producers
    deps = [{producers[t] for t in op.inputs if t in producers} for op in graph.ops]
    waiting = [len(d) for d in deps]
    readers: list[list[int]] = [[] for _ in deps]
    for j, d in enumerate(deps):
        for i in d:
            readers[i].append(j)
    ready: dict[bool, list[int]] = {True: [], False: []}
    for i, n in enumerate(waiting):
        if n == 0:
            ready[sup[i]].append(i)
    out: list[tuple[bool, list[int]]] = []
    while ready[True] or ready[False]:
        kind = min((h[0], k) for k, h in ready.items() if h)[1]
        heap, subset = ready[kind], []
        while heap:
            i = heapq.heappop(heap)
            subset.append(i)
            for j in readers[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready[sup[j]], j)
        out.append((kind, sorted(subset)))
    return out


def _read_across(graph: Graph, subset_of: list[int]) -> set[int]:
    """Tensors read by an op of another subset than the one that produces them."""
    producers = graph.producers
    return {t for j, op in enumerate(graph.ops) for t in op.inputs
            if t in producers and subset_of[producers[t]] != subset_of[j]}
