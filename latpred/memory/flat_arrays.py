"""A batch of graphs as flat arrays, for the compiled memory planners (`flat.py`, `flat_int8.py`).

All graphs' ops in a row (`Wiring`: each op's type, inputs and outputs, recorded while the
latency batch deduces each graph or walked after) and all graphs' tensors in a row (`Tensors`:
bytes, stored in the model, a data type XNNPACK takes, 8-bit; from the latency batch's interned
tensors or from the graphs' tensor tables). Tensor and op indices inside a graph are the
graph's own; `g_ops` / `g_tens` give each graph's first op / tensor (CSR offsets).
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Sequence

import numpy as np

from latpred.graph import _ITEMSIZE, Graph
from latpred.memory import xnnpack_partition as partition
from latpred.memory.compiled_buffers import dims_rows
from latpred.memory.host_cpu import _FB_FIXED, _FB_PER_OP, _FB_PER_TENSOR
from latpred.memory.litert_builtin import tensor_table

_OPS, _TENSORS, _DTYPE = attrgetter("ops"), attrgetter("tensors"), attrgetter("dtype")
_SHAPE, _KEY_DTYPE, _KEY_CONST = itemgetter(0), itemgetter(1), itemgetter(2)
# per data type (numbered as `_ITEMSIZE`): bytes an element, XNNPACK takes it, 8-bit
_DTYPE_CODE = {dtype: i for i, dtype in enumerate(_ITEMSIZE)}
_DTYPE_ITEMSIZE = np.array(list(_ITEMSIZE.values()), np.int64)
_DTYPE_OK = np.array([d in partition._DATA_DTYPES for d in _ITEMSIZE], np.bool_)
_DTYPE_EIGHT = np.array([d in partition.EIGHT_BIT_TYPES for d in _ITEMSIZE], np.bool_)


def _ptr(lengths) -> np.ndarray:
    """CSR offsets from lengths: item i is entries [ptr[i], ptr[i + 1])."""
    lengths = np.fromiter(lengths, np.int64)
    ptr = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return ptr


def op_offsets(graphs: Sequence[Graph]) -> np.ndarray:
    """Each graph's first op in all graphs' ops in a row (and one past the last)."""
    return _ptr(map(len, map(_OPS, graphs)))


def op_configs(kernels: Sequence[Sequence[Any]], batch: Any, g_ops: np.ndarray) -> np.ndarray:
    """Each op's configuration in the latency pass's FeatureBatch `batch` of the graphs'
    `kernels` (deduced for the host CPU or CUDA, `deduce.cpu.deduce_cpu`,
    `deduce.cuda.deduce_cuda`), all graphs' ops in a row (`g_ops`: `op_offsets`); -1 for an op
    of a several-op kernel or of none."""
    # a kernel of one op has a configuration of that op's kind, one of several of kind -1
    # (`FeatureBatch.config_kind`): read so, not by each kernel's op count (0.8 us a graph)
    single = batch.config_kind[batch.config] >= 0
    n_kernels = np.fromiter(map(len, kernels), np.int64, len(kernels))
    k_ptr = _ptr(n_kernels)
    # Both make one kernel per op in op order, but ops that join one (on the CPU a PAD folded
    # into a convolution, a table-lookup chain; on CUDA a view and its neighbour): no op is
    # in two kernels or none, so a graph with as many kernels as ops has op i in kernel i.
    # Only the other graphs' kernels are read (each one's first op; reading all cost ~1.4 us
    # a graph, session 40).
    first = np.arange(len(batch.config)) - np.repeat(k_ptr[:-1], n_kernels)
    for g in np.flatnonzero(n_kernels != np.diff(g_ops)).tolist():
        first[k_ptr[g]:k_ptr[g + 1]] = [k.ops[0] for k in kernels[g]]
    graph_start = np.repeat(g_ops[:-1], n_kernels)
    out = np.full(g_ops[-1], -1, np.int64)
    out[graph_start[single] + first[single]] = batch.config[single]
    return out


def _csr(lists: list) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and concatenated values of a list of int sequences."""
    ptr = _ptr(map(len, lists))
    return ptr, np.fromiter(chain.from_iterable(lists), np.int64, int(ptr[-1]))


def per_graph(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Sums of values[ptr[g]:ptr[g + 1]] (exact integers)."""
    sums = np.zeros(len(values) + 1, np.int64)
    np.cumsum(values, out=sums[1:])
    return sums[ptr[1:]] - sums[ptr[:-1]]


def model_bytes(size: np.ndarray, const: np.ndarray, g_tens: np.ndarray, g_ops: np.ndarray
                ) -> np.ndarray:
    """`host_cpu.estimate_model_bytes` of each graph: each stored buffer 16-aligned, plus 16,
    and the flatbuffer's tables per tensor and op (`size`, `const`: per tensor of all graphs
    in a row; `g_tens`, `g_ops`: each graph's first tensor and op)."""
    stored = per_graph(np.where(const, (size + 15) // 16 * 16 + 16, 0), g_tens)
    return (stored + _FB_PER_TENSOR * np.diff(g_tens) + _FB_PER_OP * np.diff(g_ops)
            + _FB_FIXED)


class Tensors(NamedTuple):
    """Per tensor of all graphs in a row: bytes, stored in the model, a data type XNNPACK
    takes; each graph's first tensor (and one past the last); 8-bit (`flat_int8`: the
    delegate's 8-bit rules of the ops that write one, the operators sized by the qs8
    sizes)."""

    size: np.ndarray
    const: np.ndarray
    dtype_ok: np.ndarray
    g_tens: np.ndarray
    eight_bit: np.ndarray


def batch_tensors(graphs: Sequence[Graph], batch: Any
                  ) -> tuple[Tensors, np.ndarray, np.ndarray]:
    """`Tensors` from the batch's interned tensors, each tensor's interned id, and each
    interned tensor's `compiled_buffers.DIMS` row (the operator sizes read them; their product
    gives the bytes, so the shapes are walked once)."""
    keys = batch.tensor_keys            # (shape, dtype, is_constant, value, quantized)
    n = len(keys)
    key_dims = dims_rows(list(map(_SHAPE, keys)))
    # one dict look-up per key, then the dtype's facts by index (4 generators over the keys
    # cost ~2.5x: 3.0 against 1.2 ms for 500 graphs' ~3,500 keys)
    dtype = np.fromiter(map(_DTYPE_CODE.__getitem__, map(_KEY_DTYPE, keys)), np.int64, n)
    key_size = key_dims[:, 5] * _DTYPE_ITEMSIZE[dtype]
    key_const = np.fromiter(map(_KEY_CONST, keys), np.bool_, n)
    ids, g_tens = interned_ids(batch)
    assert np.array_equal(np.diff(g_tens), [len(g.tensors) for g in graphs])
    return Tensors(key_size[ids], key_const[ids], _DTYPE_OK[dtype][ids], g_tens,
                   _DTYPE_EIGHT[dtype][ids]), ids, key_dims


def interned_ids(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each tensor's interned id in the batch (all graphs in a row), and each graph's first
    tensor."""
    ptr, ids = _csr(batch.tensor_ids)
    ids = np.delete(ids, ptr[1:] - 1)   # each graph's last id stands for index -1
    return ids, ptr - np.arange(len(ptr))


def graph_tensors(graphs: Sequence[Graph]) -> Tensors:
    """`Tensors` from the graphs' tensor tables (`litert_builtin.tensor_table`)."""
    tables = list(map(tensor_table, graphs))
    g_tens, size = _csr(list(map(itemgetter(0), tables)))
    const = np.fromiter(chain.from_iterable(map(itemgetter(1), tables)), np.bool_, g_tens[-1])
    dtypes = list(map(_DTYPE, chain.from_iterable(map(_TENSORS, graphs))))
    dtype_ok = np.fromiter(map(partition._DATA_DTYPES.__contains__, dtypes), np.bool_,
                           g_tens[-1])
    eight = np.fromiter(map(partition.EIGHT_BIT_TYPES.__contains__, dtypes), np.bool_, g_tens[-1])
    return Tensors(size, const, dtype_ok, g_tens, eight)


class Wiring:
    """Each op's type, inputs and outputs (all graphs' ops in a row), recorded graph by graph
    (`collect`, as `LatencyModel.predict_many_batch`'s per-graph hook: the deduction has just
    walked the graph's ops, so they are in the CPU caches; walked again after the whole batch
    they cost ~2.4x: 38 vs 16 us a graph) or for all graphs at once (`walk`)."""

    def __init__(self) -> None:
        self._arrays: tuple[np.ndarray, ...] | None = None
        self.ops: list = []
        self.types: list[str] = []
        self.n_in: list[int] = []
        self.ins: list[int] = []
        self.n_out: list[int] = []
        self.outs: list[int] = []

    def collect(self, graph: Graph) -> None:
        # A plain loop: attribute reads the interpreter specializes, and one visit per op
        # object, cost about half of zip(*map(attrgetter(...), ops)) (4 against 8 us a graph)
        types, n_in, ins, n_out, outs = (self.types.append, self.n_in.append, self.ins.extend,
                                         self.n_out.append, self.outs.extend)
        for op in graph.ops:
            types(op.type)
            op_ins, op_outs = op.inputs, op.outputs
            n_in(len(op_ins))
            ins(op_ins)
            n_out(len(op_outs))
            outs(op_outs)
        self.ops += graph.ops

    def walk(self, graphs: Sequence[Graph]) -> "Wiring":
        for graph in graphs:
            self.collect(graph)
        return self

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(in_ptr, ins, out_ptr, outs): the inputs and outputs as CSR arrays, made once."""
        if self._arrays is None:
            in_ptr, out_ptr = (_ptr(n) for n in (self.n_in, self.n_out))
            ins, outs = (np.array(t, np.int64) for t in (self.ins, self.outs))
            self._arrays = (in_ptr, ins, out_ptr, outs)
        return self._arrays
