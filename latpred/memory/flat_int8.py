"""8-bit tensors in the compiled memory planner (`flat.py`).

Two kinds of graph reach it with 8-bit tensors:

- **int8 models** (files, or `int8_layout` graphs): the delegate's 8-bit checks read scales,
  so `declined_per_op` asks `deduce.xnnpack_int8.declined` of every op that writes an 8-bit
  tensor and hands the answers to the port as a mask;
- **float NAS candidates on an int8 target**, planned as the int8 model latpred would write of
  them (`tflite.quantize.int8_layout`). Where that model keeps the float graph's ops and
  tensors (`quantize.float_twin`: no fp32 island, no float constant in a same-scale group;
  requantizing QUANTIZE ops are added to the float graph first: `classify` finds them and
  `with_twins` adds them to the flat arrays, both in numba, `compiled_twin`), it
  differs in data types only: every float32 tensor becomes int8, one byte an element, except
  the biases, which become int32 (four); and the layout's scales (placeholder [0, 1] ranges
  and the fixed parameters 1/256, 1/128, 1/16) pass every scale check of `declined` (an ADD's
  input over output scale stays within [1/16, 16], a MUL's product over output within
  [1/4096, 1]), so only the checks that read the op alone decide (`declined_by_op`).
  `as_int8` retypes the flat tensors so, without building a Graph per candidate (~240 us in
  Python); tests/test_memory.py compares the totals with the Python planner on the layouts.

`eight_bit_weights` marks the operators XNNPACK sizes by its qs8 rules.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from latpred.deduce.xnnpack_int8 import declined, op_declines
from latpred.graph import Graph, Op
from latpred.memory import compiled_twin as ct
from latpred.memory.compiled import OP_CONV
from latpred.memory.flat_arrays import Tensors, Wiring, graph_tensors, op_offsets
from latpred.tflite.quantize import is_float_graph, requantized


class Int8Kinds(NamedTuple):
    """What `classify` finds of a batch's graphs on an int8 target."""

    retype: np.ndarray      # per graph: a float graph, planned retyped (`as_int8`)
    layouts: list[int]      # graphs that only their int8 layouts plan (`quantize.int8_layout`)
    twins: np.ndarray       # graphs whose int8 model adds requantizing QUANTIZE ops, ascending
    ptr: np.ndarray         # twin i requantizes requant[ptr[i]:ptr[i + 1]] (graph-local)
    requant: np.ndarray
    same_scale: np.ndarray  # per op of the batch: a same-scale op (`quantize.SAME_SCALE`)

    def twin(self, graphs: Sequence[Graph], i: int) -> Graph:
        """Twin i as a Graph (`quantize.requantized`): what `with_twins` plans in flat form."""
        return requantized(graphs[self.twins[i]],
                           self.requant[self.ptr[i]:self.ptr[i + 1]].tolist())


def classify(graphs: Sequence[Graph], wiring: Wiring | None = None,
             tensors: Tensors | None = None, g_ops: np.ndarray | None = None,
             is_float: np.ndarray | None = None) -> Int8Kinds:
    """For an int8 target: the float graphs (`is_float`: per graph,
    `quantize.is_float_graph`, found here where not given), whose tensors are retyped
    (`as_int8`), and among them those
    whose int8 model adds ops: the twins, whose requantizing QUANTIZE ops `with_twins` adds
    to the flat arrays, and those only their int8 layouts plan (an fp32 island, a float
    constant in a same-scale group). `quantize.float_twin`'s decision is taken for all graphs
    at once over the flat arrays (`compiled_twin`). The rest (already 8-bit) are planned as
    they are. Every float graph of a batch is retyped, the others too: the batch sizes an
    operator once per configuration, so all of a configuration's ops must have the same
    types. The flat arrays (`wiring`, `tensors`, `g_ops`) are made here where not given."""
    wiring = wiring or Wiring().walk(graphs)
    tensors = graph_tensors(graphs) if tensors is None else tensors
    g_ops = op_offsets(graphs) if g_ops is None else g_ops
    if is_float is None:
        is_float = np.fromiter(map(is_float_graph, graphs), np.bool_, len(graphs))
    types = wiring.types
    in_ptr, ins, out_ptr, outs = wiring.arrays()
    retype = np.asarray(is_float, np.bool_).copy()
    floats = np.flatnonzero(retype)
    for op_type in set(types).difference(ct._CODES):
        ct.type_code(op_type)
    code = np.fromiter(map(ct._CODES.__getitem__, types), np.int64, len(types))
    # float graphs hold float32, int32, int64 and bool: float32 is a data type XNNPACK takes
    # that is not 8-bit
    f32 = tensors.dtype_ok & ~tensors.eight_bit
    kinds, ptr, requant = ct.twin_kinds(floats, g_ops, tensors.g_tens, code, in_ptr, ins,
                                        out_ptr, outs, f32, tensors.const)
    return Int8Kinds(retype, floats[kinds == ct.LAYOUT].tolist(), floats[kinds == ct.TWIN],
                     ptr[np.flatnonzero(kinds == ct.TWIN).tolist() + [len(kinds)]]
                     if len(kinds) else np.zeros(1, np.int64), requant, code & 3 == 1)


def _graph_of(g_ops: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(g_ops) - 1), np.diff(g_ops))


def _first_outputs(out_ptr: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """Each op's output 0 (-1: none)."""
    first = np.full(len(out_ptr) - 1, -1, np.int64)
    has = out_ptr[1:] > out_ptr[:-1]
    first[has] = outs[out_ptr[:-1][has]]
    return first


def writes_eight_bit(tensors: Any, g_ops: np.ndarray, out_ptr: np.ndarray,
                      outs: np.ndarray) -> np.ndarray:
    """Per op: whether its output 0 is an 8-bit tensor (`xnnpack_partition.eight_bit`)."""
    first = _first_outputs(out_ptr, outs)
    writes = first >= 0
    writes[writes] = tensors.eight_bit[first[writes] + tensors.g_tens[_graph_of(g_ops)[writes]]]
    return writes


def declined_per_op(graphs: Sequence[Graph], ops: list, g_ops: np.ndarray, tensors: Any,
                    out_ptr: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """Per op: whether it writes an 8-bit tensor and the delegate's quantized checks refuse it
    (`xnnpack_partition.supported`'s first rule), asked of the graphs as they are. All False
    for float graphs."""
    out = np.zeros(len(ops), np.bool_)
    if not tensors.eight_bit.any():
        return out
    graph_of = _graph_of(g_ops)
    for j in np.flatnonzero(writes_eight_bit(tensors, g_ops, out_ptr, outs)).tolist():
        out[j] = bool(declined(graphs[graph_of[j]], ops[j]))
    return out


def declined_by_op(ops: list, writes: np.ndarray, kinds: np.ndarray | None = None,
                   arity: np.ndarray | None = None) -> np.ndarray:
    """Per op of a retyped candidate (`as_int8`): whether it writes an 8-bit tensor and a check
    that reads the op alone refuses it (`deduce.xnnpack_int8.op_declines`), once per type,
    attributes and arity: by `kinds` (the latency batch's interned type and attributes, -1
    where unknown) with `arity` (per op: inputs, outputs) where given, else by the Op."""
    out = np.zeros(len(ops), np.bool_)
    at = np.flatnonzero(writes)
    if kinds is not None and len(at):
        named = kinds[at] >= 0
        # (kind, inputs, outputs) as one int: np.unique over rows (axis=0) costs ~10x more
        span = int(arity.max(initial=0)) + 1
        rows = (kinds[at][named] * span + arity[at][named, 0]) * span + arity[at][named, 1]
        if len(rows):
            _, first, back = np.unique(rows, return_index=True, return_inverse=True)
            reps = at[named][first]
            answers = np.fromiter((bool(op_declines(ops[j])) for j in reps.tolist()), np.bool_,
                                  len(reps))
            out[at[named]] = answers[back.reshape(-1)]
        at = at[~named]
    known: dict[tuple, bool] = {}
    for j in at.tolist():
        op = ops[j]
        key = (op.type, op.attrs, len(op.inputs), len(op.outputs))
        no = known.get(key)
        if no is None:
            no = known[key] = bool(op_declines(op))
        out[j] = no
    return out


def as_int8(tensors: Tensors, retype: np.ndarray, g_ops: np.ndarray, types: list[str],
            in_ptr: np.ndarray, ins: np.ndarray, flags: np.ndarray) -> Tensors:
    """The flat tensors of the graphs marked `retype` as their int8 models have them: float32
    (4 bytes an element) becomes int8 (1), except the biases (input 2 of a convolution or a
    fully connected op), which become int32 (4 bytes, as before)."""
    graph_of = _graph_of(g_ops)
    is_float = tensors.dtype_ok & ~tensors.eight_bit      # float graphs: float32 exactly
    in_graph = np.repeat(retype, np.diff(tensors.g_tens))
    bias = np.zeros(len(tensors.size), np.bool_)
    with_bias = np.flatnonzero((flags & OP_CONV != 0) | (np.array(types) == "FULLY_CONNECTED"))
    with_bias = with_bias[in_ptr[with_bias + 1] - in_ptr[with_bias] > 2]
    b = ins[in_ptr[with_bias] + 2]
    b_flat = b[b >= 0] + tensors.g_tens[graph_of[with_bias[b >= 0]]]
    bias[b_flat] = tensors.const[b_flat]
    eight = is_float & in_graph & ~bias
    size = np.where(eight, tensors.size // 4, tensors.size)
    return Tensors(size, tensors.const, tensors.dtype_ok, tensors.g_tens,
                   tensors.eight_bit | eight)


def retyped(graphs: Sequence[Graph], tensors: Any, retype: np.ndarray, wiring: Any,
            g_ops: np.ndarray, flags: np.ndarray, in_ptr: np.ndarray, ins: np.ndarray,
            out_ptr: np.ndarray, outs: np.ndarray, kinds: np.ndarray | None = None
            ) -> tuple[Any, np.ndarray]:
    """The flat tensors with the `retype` graphs' retyped (`as_int8`), and every op's 8-bit
    decision: by the op alone in retyped graphs (`kinds`: see `declined_by_op`), asked of
    the graph in the others."""
    int8 = as_int8(tensors, retype, g_ops, wiring.types, in_ptr, ins, flags)
    in_retyped = np.repeat(retype, np.diff(g_ops))
    writes = writes_eight_bit(int8, g_ops, out_ptr, outs)
    arity = np.column_stack((np.diff(in_ptr), np.diff(out_ptr)))
    declined = declined_by_op(wiring.ops, writes & in_retyped, kinds, arity)
    if tensors.eight_bit.any():
        declined |= declined_per_op(graphs, wiring.ops, g_ops, tensors, out_ptr, outs) & \
            ~in_retyped
    return int8, declined


def int8_signature(sig: tuple) -> tuple:
    """An operator signature (`xnnpack_operators._signature`) of a retyped graph: its float32
    weights are int8 there."""
    return sig[:5] + ("int8",) if sig[5] == "float32" else sig


def eight_bit_weights(planned: Any) -> np.ndarray:
    """Per op: whether its input 1 (the weights of a convolution or fully connected op) is an
    8-bit tensor (XNNPACK's qs8 rules size such an operator)."""
    t = planned.tensors
    out = np.zeros(len(planned.ops), np.bool_)
    if not t.eight_bit.any():
        return out
    two = planned.in_ptr[1:] - planned.in_ptr[:-1] > 1
    w = np.full(len(planned.ops), -1, np.int64)
    w[two] = planned.ins[planned.in_ptr[:-1][two] + 1]
    has = w >= 0
    out[has] = t.eight_bit[w[has] + t.g_tens[_graph_of(planned.g_ops)[has]]]
    return out


def with_twins(kinds: Int8Kinds, wiring: Wiring, tensors: Tensors,
               key_ids: np.ndarray | None, op_cfg: np.ndarray | None, g_ops: np.ndarray
               ) -> tuple[Wiring, Tensors, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """The batch's flat arrays with each twin (`classify`) in its graph's place
    (`compiled_twin.splice`), so that the twins are planned in the batch's one compiled call
    without building them: their ops (the graph's, each with its configuration and Op, and the
    added QUANTIZE ops, with none), their tensors (the graph's, then the added int8 ones, each
    with its source's interned id: the same shape). Returns the wiring, tensors, interned ids,
    configurations and op offsets."""
    if not len(kinds.twins):
        return wiring, tensors, key_ids, op_cfg, g_ops
    in_ptr, ins, out_ptr, outs = wiring.arrays()
    new_ops, new_tens, in_ptr, ins, out_ptr, outs, src_op, src_t, added = ct.splice(
        kinds.twins, kinds.ptr, kinds.requant, g_ops, tensors.g_tens, in_ptr, ins, out_ptr,
        outs, kinds.same_scale)
    spliced = Wiring()
    at = src_op.tolist()        # -1 (an added QUANTIZE) takes the last item of each list
    spliced.ops = list(map((wiring.ops + [_QUANTIZE]).__getitem__, at))
    spliced.types = list(map((wiring.types + ["QUANTIZE"]).__getitem__, at))
    spliced._arrays = (in_ptr, ins, out_ptr, outs)
    # an added tensor is int8 of its float32 source's shape: a quarter of its bytes
    size = np.where(added, tensors.size[src_t] // 4, tensors.size[src_t])
    spliced_tensors = Tensors(size, tensors.const[src_t] & ~added,
                                    tensors.dtype_ok[src_t] | added, new_tens,
                                    tensors.eight_bit[src_t] | added)
    return (spliced, spliced_tensors, None if key_ids is None else key_ids[src_t],
            None if op_cfg is None else np.where(src_op >= 0, op_cfg[src_op], -1), new_ops)


# What the flat planners read of an added QUANTIZE op: its type, attributes and arity
_QUANTIZE = Op.make("QUANTIZE", (0,), (1,))
