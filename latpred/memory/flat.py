"""Memory-aware NAS, compiled: a whole batch's XNNPACK totals in one numba call.

`predict_many_with_memory` hands over the latency batch (`fast.py`: `xnnpack_totals`;
`memory_totals` on its own: `graph_totals`); here every graph's ops, wiring and tensors become
flat arrays (`flat_arrays`: built with C-level walks over the batch, tensor sizes from the
batch's interned tensors or the graphs' tensor tables; on an int8 target, `flat_int8` retypes
float graphs and splices in their twins), `compiled_graph.plan_batch` plans all graphs,
`compiled_buffers.op_buffers` sizes the operators' packed weights and indirection once per
configuration (with a batch; per op by signature without), and the totals are summed with
numpy. Graphs the compiled planner does not cover (Prepare changes an
allocation type or ends a chunk, an op left to TFLite has temporaries or runs in place, ops
out of dependency order, more than 16 tied arena tensors) are planned in Python as before, so
every total equals `memory_totals`' (scripts/memory_fast_check.py).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Collection, NamedTuple, Sequence

import numpy as np

from latpred.graph import Graph
from latpred.memory import compiled as cc
from latpred.memory import compiled_buffers as cb
from latpred.memory import compiled_graph as cg
from latpred.memory import flat_int8
from latpred.memory import xnnpack
from latpred.memory import xnnpack_partition as partition
from latpred.memory import xnnpack_operators as xnn_ops
from latpred.memory.configs import OpConfigs
from latpred.memory.flat_arrays import (Tensors, Wiring, _csr, batch_tensors, graph_tensors,
                                       model_bytes, op_configs, op_offsets, per_graph)
from latpred.memory.host_cpu import (OVERHEAD_FIXED, OVERHEAD_PER_TENSOR, eight_bit_fixed,
                                     transient)
from latpred.deduce.prepare import PREPARE_FOLDS, REDUCE
from latpred.memory.litert_builtin import set_tensor_table
from latpred.memory.litert_plan import INPLACE

_INPUTS, _OUTPUTS = attrgetter("inputs"), attrgetter("outputs")
_FLAGS: dict[str, int] = {}
_ATTR_FACTS: dict[tuple, tuple[bool, bool, bool]] = {}
OP_BUFFERS = 1 << 24            # packed weights or an indirection buffer (not a planner bit)


def type_flags(op_type: str) -> int:
    """`compiled.OP_*` bits of an op type, read from the Python planners' own sets."""
    flags = _FLAGS.get(op_type)
    if flags is not None:
        return flags
    static = partition._STATIC.get(op_type)
    bits = [(op_type in partition._ALWAYS, cc.OP_ALWAYS), (op_type == "SPLIT", cc.OP_SPLIT),
            (static is not None, cc.OP_STATIC), (op_type in xnnpack._POOLS, cc.OP_POOL),
            (op_type == "SOFTMAX", cc.OP_SOFTMAX),
            (op_type in REDUCE or op_type in ("CONV_2D", "FULLY_CONNECTED"),
             cc.OP_TFLITE_ONLY),
            (bool(INPLACE.get(op_type)), cc.OP_INPLACE),
            (op_type in ("SHAPE", "REDUCE_PROD"), cc.OP_KIND_STOP),
            (op_type == "RESHAPE", cc.OP_RESHAPE), (op_type == "STRIDED_SLICE", cc.OP_SLICE),
            (op_type in PREPARE_FOLDS - {"RESHAPE", "STRIDED_SLICE"}, cc.OP_FOLD),
            (op_type in xnnpack._IN_PLACE, cc.OP_XNN_IN_PLACE),
            (op_type in xnnpack._ELIDABLE - xnnpack._POOLS, cc.OP_PAD),
            (op_type in ("CONV_2D", "DEPTHWISE_CONV_2D"), cc.OP_CONV),
            (op_type in xnn_ops._WITH_BUFFERS, OP_BUFFERS)]
    flags = sum(bit for on, bit in bits if on)
    for k in static or ():
        flags |= 1 << (cc.STATIC_SHIFT + k)
    _FLAGS[op_type] = flags
    return flags


def _op_attrs(ops: list, flags: np.ndarray, kinds: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """What the planners read of attributes, for the poolings and SOFTMAX only: whether the
    delegate takes them, whether a pooling is a clamp, and a clamp without activation (once
    per distinct type and attributes: a fresh op would build its attribute dict). `kinds`:
    per op its interned (type, attributes) from the latency batch (-1: not known), which
    spares hashing the attributes of every such op (~1 us each)."""
    at = np.flatnonzero(flags & (cc.OP_POOL | cc.OP_SOFTMAX))
    by_kind: dict[int, tuple[bool, bool, bool]] = {}
    facts = []
    known = kinds[at] if kinds is not None else np.full(len(at), -1)
    for j, kind in zip(at.tolist(), known.tolist()):
        found = by_kind.get(kind) if kind >= 0 else None
        if found is None:
            found = _facts(ops[j])
            if kind >= 0:
                by_kind[kind] = found
        facts.append(found)
    out = np.zeros((3, len(ops)), np.bool_)
    if facts:
        out[:, at] = np.array(facts, np.bool_).T
    return out[0], out[1], out[2]


def _facts(op: Any) -> tuple[bool, bool, bool]:
    key = (op.type, op.attrs)
    facts = _ATTR_FACTS.get(key)
    if facts is None:
        if len(_ATTR_FACTS) > 4096:      # a bound, for spaces of many pooling shapes
            _ATTR_FACTS.clear()
        facts = _ATTR_FACTS[key] = (partition.attrs_supported(op), xnnpack._is_clamp(op),
                                    xnnpack.is_noop_clamp(op))
    return facts


class Planned(NamedTuple):
    """`compiled_graph.plan_batch` over a batch: per graph (covered, arena, workspace,
    regrowth), per op whether XNNPACK takes it, and the flat arrays it read."""

    res: np.ndarray
    delegated: np.ndarray
    ops: list
    g_ops: np.ndarray
    flags: np.ndarray
    tensors: Tensors
    in_ptr: np.ndarray
    ins: np.ndarray
    out_ptr: np.ndarray
    outs: np.ndarray


def plan(graphs: Sequence[Graph], tensors: Tensors, wiring: Wiring | None = None,
         op_kind: np.ndarray | None = None, g_ops: np.ndarray | None = None,
         retype: np.ndarray | None = None) -> Planned:
    """Every graph's partitions, arena and workspace in one compiled call (`wiring`: the
    graphs' ops, recorded before; else walked here; `op_kind`: see `_op_attrs`; `g_ops`:
    `op_offsets(graphs)` where the caller has them; `retype`: per graph, plan the float graph
    as its int8 model, `flat_int8.as_int8`)."""
    wiring = wiring or Wiring().walk(graphs)
    g_ops = op_offsets(graphs) if g_ops is None else g_ops
    if len(wiring.ops) != g_ops[-1]:
        raise ValueError("the recorded wiring is not these graphs'")
    for op_type in set(wiring.types).difference(_FLAGS):
        type_flags(op_type)
    flags = np.fromiter(map(_FLAGS.__getitem__, wiring.types), np.int64, len(wiring.ops))
    in_ptr, ins, out_ptr, outs = wiring.arrays()
    gin_ptr, gin = _csr(list(map(_INPUTS, graphs)))
    gout_ptr, gout = _csr(list(map(_OUTPUTS, graphs)))
    attr_ok, clamp, noact = _op_attrs(wiring.ops, flags, op_kind)
    if retype is not None and retype.any():
        tensors, declined = flat_int8.retyped(graphs, tensors, retype, wiring, g_ops, flags,
                                              in_ptr, ins, out_ptr, outs, op_kind)
    else:
        declined = flat_int8.declined_per_op(graphs, wiring.ops, g_ops, tensors, out_ptr, outs)
    res, delegated = cg.plan_batch(g_ops, tensors.g_tens, gin_ptr, gin, gout_ptr, gout, in_ptr,
                                   ins, out_ptr, outs, flags, attr_ok, declined, clamp, noact,
                                   tensors.size, tensors.const, tensors.dtype_ok)
    return Planned(res, delegated, wiring.ops, g_ops, flags, tensors, in_ptr, ins, out_ptr,
                   outs)


def xnnpack_totals(graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]], batch: Any,
                   wiring: Wiring | None = None, int8: bool = False) -> np.ndarray:
    """`memory_totals(graphs)` with XNNPACK, from a FeatureBatch of the graphs' `kernels`
    (`wiring`: their ops, recorded while the batch was built; `int8`: on an int8 target, float
    graphs planned as their int8 models, `flat_int8`)."""
    tensors, key_ids, key_dims = batch_tensors(graphs, batch)
    g_ops = op_offsets(graphs)
    op_cfg = op_configs(kernels, batch, g_ops)
    wiring = wiring or Wiring().walk(graphs)
    retype, layouts = None, []
    if int8:
        kinds = flat_int8.classify(graphs, wiring, tensors, g_ops,
                                   _float_graphs(batch, key_ids, tensors.g_tens))
        retype, layouts = kinds.retype, kinds.layouts
        # the float twins take their graphs' places (flat_int8.with_twins)
        wiring, tensors, key_ids, op_cfg, g_ops = flat_int8.with_twins(
            kinds, wiring, tensors, key_ids, op_cfg, g_ops)
    planned = plan(graphs, tensors, wiring,
                   np.where(op_cfg >= 0, batch.config_kind[op_cfg], -1), g_ops, retype)
    graph_of = np.repeat(np.arange(len(graphs)), np.diff(planned.g_ops))
    keys = batch.tensor_keys
    shapes = _Shapes(keys, key_ids, tensors.g_tens, graph_of)

    def buffers(j: int) -> int:
        sig = shapes.signature(j, planned.ops[j])
        retyped = retype is not None and retype[graph_of[j]]
        return sum(xnn_ops._buffers(flat_int8.int8_signature(sig) if retyped else sig))

    sizer = cb.Sizer(planned, key_ids, key_dims, buffers, batch.config_kind)
    return _layouts(_totals(graphs, planned, op_cfg, sizer, retype, layouts), graphs, layouts)


def _float_graphs(batch: Any, key_ids: np.ndarray, g_tens: np.ndarray) -> np.ndarray:
    """Per graph, `quantize.is_float_graph`, read from the batch's interned tensors."""
    from latpred.tflite.quantize import FLOAT_GRAPH_TYPES

    keys = batch.tensor_keys            # (shape, dtype, is_constant, value, quantized)
    odd = np.fromiter((k[1] not in FLOAT_GRAPH_TYPES or bool(k[4]) for k in keys), np.bool_,
                      len(keys))
    return per_graph(odd[key_ids].astype(np.int64), g_tens) == 0


def graph_totals(graphs: Sequence[Graph], int8: bool = False) -> np.ndarray:
    """`memory_totals(graphs)` with XNNPACK, without a latency batch (no configurations: the
    operator buffers are looked up per op by signature, as `xnnpack_operators` does; reading
    every op's tensor dims for the compiled sizes costs more here than the look-ups; `int8`:
    as `xnnpack_totals`)."""
    wiring, tensors, g_ops = Wiring().walk(graphs), graph_tensors(graphs), op_offsets(graphs)
    retype, layouts = None, []
    if int8:
        kinds = flat_int8.classify(graphs, wiring, tensors, g_ops)
        retype, layouts = kinds.retype, kinds.layouts
        wiring, tensors, _, _, g_ops = flat_int8.with_twins(kinds, wiring, tensors, None, None,
                                                            g_ops)
    return _layouts(_graph_totals(graphs, retype, layouts, wiring, tensors, g_ops), graphs,
                    layouts)


def _graph_totals(graphs: Sequence[Graph], retype: np.ndarray | None, layouts: Collection[int],
                  wiring: Wiring | None = None, tensors: Tensors | None = None,
                  g_ops: np.ndarray | None = None) -> np.ndarray:
    tensors = graph_tensors(graphs) if tensors is None else tensors
    planned = plan(graphs, tensors, wiring, g_ops=g_ops, retype=retype)
    graph_of = np.repeat(np.arange(len(graphs)), np.diff(planned.g_ops)).tolist()

    def op_buffers(j: int) -> int:
        g = graph_of[j]
        op = planned.ops[j]
        if op.type not in xnn_ops._WITH_BUFFERS:
            return 0
        sig = xnn_ops._signature(graphs[g].tensors, op)
        retyped = retype is not None and retype[g]
        return sum(xnn_ops._buffers(flat_int8.int8_signature(sig) if retyped else sig))

    def buffers(reps: np.ndarray, _: np.ndarray) -> np.ndarray:
        return np.fromiter(map(op_buffers, reps.tolist()), np.int64, len(reps))

    return _totals(graphs, planned, np.full(len(planned.ops), -1, np.int64), buffers, retype,
                   layouts)


def _layouts(totals: np.ndarray, graphs: Sequence[Graph], layouts: list[int]) -> np.ndarray:
    """`totals`, those of the float graphs only their int8 layouts plan (`flat_int8.classify`)
    replaced by their layouts'."""
    from latpred.tflite.quantize import int8_layout

    if layouts:
        totals[layouts] = graph_totals([int8_layout(graphs[g]) for g in layouts])
    return totals


def _totals(graphs: Sequence[Graph], planned: Planned, op_cfg: np.ndarray,
            sizer: Callable[[np.ndarray, np.ndarray], np.ndarray],
            retype: np.ndarray | None = None, replaced: Collection[int] = ()) -> np.ndarray:
    """The totals of the planned graphs (`op_cfg`: each op's configuration, -1 for none;
    `sizer(ops, their configurations)`: packed weights plus indirection,
    `compiled_buffers.Sizer`; `retype`: see `plan`); uncovered graphs in Python (a retyped
    one as its int8 layout, `int8_layout(graphs[g])`), but for those the caller `replaced`."""
    from latpred.memory.fast import memory_total

    res, delegated, _, g_ops, flags, (size, const, _, g_tens, _) = planned[:6]
    covered = res[:, 0].astype(np.bool_)
    n_tensors, n_ops = np.diff(g_tens), np.diff(g_ops)
    with_buffers = delegated & np.repeat(covered, n_ops) & (flags & OP_BUFFERS != 0)
    per_op, sized, per_cfg = _buffers(with_buffers, op_cfg, sizer)
    buffers = per_graph(per_op, g_ops)
    # host_cpu.eight_bit_operators: a delegated operator with 8-bit weights
    qs8 = per_graph((with_buffers & flat_int8.eight_bit_weights(planned)).astype(np.int64),
                     g_ops) > 0
    # host_cpu.overhead; host_cpu.transient: one chunk outgrows no arena, so only a
    # workspace that regrew leaves something
    totals = (model_bytes(size, const, g_tens, g_ops) +
              res[:, 1] + res[:, 2] + buffers + OVERHEAD_FIXED +
              OVERHEAD_PER_TENSOR * n_tensors + eight_bit_fixed() * qs8).tolist()
    for g in np.flatnonzero(covered & (res[:, 3] > 0)).tolist():
        totals[g] += transient((int(res[g, 1]),), int(res[g, 3]))
    supported: dict[int, bool] = {}
    known: dict[int, int] | None = None     # packed weights + indirection per configuration
    skip = set(replaced)
    for g in np.flatnonzero(~covered).tolist():
        if g in skip:
            continue
        if known is None:   # only where a graph is planned in Python (few: built once)
            known = dict(zip(sized.tolist(), per_cfg[sized].tolist()))
        if retype is not None and retype[g]:
            from latpred.tflite.quantize import int8_layout

            totals[g] = memory_total(int8_layout(graphs[g]))
            continue
        t0, t1 = g_tens[g], g_tens[g + 1]
        set_tensor_table(graphs[g], size[t0:t1].tolist(), const[t0:t1].tolist())
        configs = OpConfigs(op_cfg[g_ops[g]:g_ops[g + 1]].tolist(), supported, known)
        totals[g] = memory_total(graphs[g], "xnnpack", configs)
    return np.array(totals, dtype=np.int64)


class _Shapes(NamedTuple):
    """Tensor shapes read from the batch's interned tensors (not the graphs' Tensor objects,
    which a fresh batch would fetch from memory one by one)."""

    keys: tuple
    key_ids: np.ndarray
    g_tens: np.ndarray
    graph_of: np.ndarray

    def signature(self, j: int, op: Any) -> tuple:
        """`xnnpack_operators._signature` of op j (all graphs' ops in a row)."""
        base = int(self.g_tens[self.graph_of[j]])
        ins, ids, keys = op.inputs, self.key_ids, self.keys
        w = keys[ids[base + ins[1]]] if len(ins) > 1 and ins[1] >= 0 else ((), "float32")
        return (op.type, op.attrs, keys[ids[base + ins[0]]][0] if ins[0] >= 0 else (),
                w[0], keys[ids[base + op.outputs[0]]][0], w[1])


def _buffers(chosen: np.ndarray, op_cfg: np.ndarray,
             sizer: Callable[[np.ndarray, np.ndarray], np.ndarray]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op: its packed weights + indirection where `chosen` (0 elsewhere), sized once per
    configuration (its first op) and for each op of no configuration; the configurations
    sized, and per configuration its size (as `xnnpack_operators.buffers_total` keeps them).
    The first op of each configuration by `np.minimum.at`, not `np.unique`'s sort."""
    at = np.flatnonzero(chosen)
    cfg = op_cfg[at]
    none = cfg < 0
    some, some_cfg = at[~none], cfg[~none]
    n_cfg = int(some_cfg.max()) + 1 if len(some_cfg) else 0
    first = np.full(n_cfg, len(chosen), np.int64)
    np.minimum.at(first, some_cfg, some)
    sized = np.flatnonzero(first < len(chosen))
    values = sizer(np.concatenate((first[sized], at[none])), np.concatenate((sized, cfg[none])))
    per_cfg = np.zeros(n_cfg, np.int64)
    per_cfg[sized] = values[:len(sized)]
    out = np.zeros(len(chosen), np.int64)
    out[some] = per_cfg[some_cfg]
    out[at[none]] = values[len(sized):]
    return out, sized, per_cfg
