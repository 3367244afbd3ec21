"""The CUDA requests of many graphs at once, for `cuda.batch_peaks` (`memory_totals` and
memory-aware NAS on CUDA targets).

A NAS batch meets the same op configurations again and again, so each op's share of the
requests (`torch_plan.load_requests` and `forward_requests`: the sizes it allocates, what it
frees) is worked out once per configuration and kept as a template: the op's type, attributes
and tensors (shape, dtype, constness, kept value, quantized or not: all the rules read) name
it. Per graph, Python only looks the templates up; a compiled loop lays them out in
`simulate`'s order (every op's load, the inputs, every op's forward) with storage ids, for the
compiled allocator. The latency pass's interned tensors (`predictors.batch.FeatureBatch`),
where given, spare describing each tensor again.
"""

from __future__ import annotations

import threading
from math import prod

import numpy as np
from numba import njit

from latpred.graph import Graph
from latpred.memory import cuda_workspace
from latpred.memory.torch_plan import forward_requests, load_requests

_CAP = 1 << 17                   # templates (and tensor descriptions) kept; then cleared


class _Templates:
    """Templates of one element size: flat request sizes and refs, and per template
    (start, end of its load part = start of its forward part, end, load allocations, forward
    allocations)."""

    def __init__(self):
        self.index: dict[tuple, int] = {}
        self.sizes = np.zeros(1 << 12, np.int64)
        self.refs = np.zeros(1 << 12, np.int64)
        self.meta = np.zeros((1 << 10, 5), np.int64)
        self.n_entries = 0

    def add(self, new: list[tuple], elem: int) -> list[int]:
        """Make the templates of `new` (key, graph, op) and return their numbers."""
        sizes: list[int] = []
        refs: list[int] = []
        meta: list[tuple] = []
        e = self.n_entries
        for key, graph, op in new:
            load = load_requests(graph, op, elem)
            fwd = forward_requests(graph, op, elem, cuda_workspace.conv_workspace,
                                   cuda_workspace.mean_scratch)
            start = e + len(sizes)
            for size, ref, _ in load.reqs + fwd.reqs:
                sizes.append(size)
                refs.append(ref)
            meta.append((start, start + len(load.reqs), e + len(sizes), load.n, fwd.n))
        t0 = len(self.index)
        end, t_end = e + len(sizes), t0 + len(meta)
        if end > len(self.sizes):
            self.sizes = np.resize(self.sizes, 2 * end)
            self.refs = np.resize(self.refs, 2 * end)
        if t_end > len(self.meta):
            self.meta = np.resize(self.meta, (2 * t_end, 5))
        self.sizes[e:end] = sizes
        self.refs[e:end] = refs
        if meta:
            self.meta[t0:t_end] = meta
        self.n_entries = end
        for t, (key, _, _) in enumerate(new, t0):
            self.index[key] = t
        return list(range(t0, t_end))


_TEMPLATES: dict[int, _Templates] = {}
_TENSORS: dict[tuple, int] = {}      # a tensor's description -> an id kept across calls
_LOCK = threading.Lock()


def batch_requests(graphs, elem: int, batch: int, tensors=None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sizes or FREE, storage ids, each graph's first request, each graph's load length) of
    `graphs` at `batch` in `elem`-byte elements; `tensors`: the graphs' FeatureBatch."""
    from latpred.pytorch.batch import with_batch

    with _LOCK:
        if len(_TENSORS) > _CAP or sum(len(s.index) for s in _TEMPLATES.values()) > _CAP:
            _TENSORS.clear()          # template keys name tensors by these ids: both go
            _TEMPLATES.clear()
        store = _TEMPLATES.setdefault(elem, _Templates())
        shared = None if tensors is None else _tensor_ids(tensors.tensor_keys)
        tpl_ids: list[int] = []
        new: dict[tuple, tuple] = {}    # configurations not yet known: (graph, op, positions)
        op_ptr = [0]
        in_sizes: list[int] = []
        in_ptr = [0]
        for k, graph in enumerate(graphs):
            g = with_batch(graph, batch)
            if shared is not None and g is graph:
                ids = [shared[i] for i in tensors.tensor_ids[k]]   # [-1]: -1, index -1's
            else:
                ids = _tensor_ids([(t.shape, t.dtype, t.is_constant, t.value,
                                    t.quantization is not None) for t in g.tensors])
            _op_templates(g, ids.__getitem__, store, tpl_ids, new)
            op_ptr.append(len(tpl_ids))
            in_sizes += [prod(g.tensors[i].shape) * elem for i in g.inputs]
            in_ptr.append(len(in_sizes))
        _add_new(new, store, elem, tpl_ids)
        return _lay_out(np.array(tpl_ids, np.int64), np.array(op_ptr, np.int64),
                        np.array(in_sizes, np.int64), np.array(in_ptr, np.int64),
                        store.sizes, store.refs, store.meta)


def _tensor_ids(descriptions) -> list[int]:
    """Ids kept across calls for tensor descriptions (shape, dtype, constness, value,
    quantized), then -1 (what index -1, an absent optional input, maps to)."""
    put = _TENSORS.setdefault
    return [put(d, len(_TENSORS)) for d in descriptions] + [-1]


def _op_templates(g: Graph, id_of, store: _Templates, out: list[int], new: dict) -> None:
    """Append the template of each of the graph's ops to `out`; a configuration not yet
    known gets a place-holder, its position noted in `new`."""
    find = store.index.get
    for op in g.ops:
        key = (op.type, op.attrs, *map(id_of, op.inputs), -2, *map(id_of, op.outputs))
        t = find(key)
        if t is None:
            seen = new.get(key)
            if seen is None:
                seen = new[key] = (g, op, [])
            seen[2].append(len(out))
            t = -1
        out.append(t)


def _add_new(new: dict, store: _Templates, elem: int, tpl_ids: list[int]) -> None:
    """Make the templates of the batch's new configurations, their convolutions' cuDNN
    workspaces worked out together (one estimator call for those the table lacks)."""
    cuda_workspace.prefetch_workspaces(
        [(g, op) for g, op, _ in new.values() if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D")],
        elem)
    made = store.add([(key, g, op) for key, (g, op, _) in new.items()], elem)
    for t, (_, _, positions) in zip(made, new.values()):
        for k in positions:
            tpl_ids[k] = t


@njit(cache=True)
def _lay_out(tpl_ids, op_ptr, in_sizes, in_ptr, t_sizes, t_refs, meta):
    """Each graph's requests in `simulate`'s order, its allocations numbered from 0: every
    op's load part, the inputs, every op's forward part. Returns (sizes, storage ids, each
    graph's first request, how many requests its load makes)."""
    n_graphs = len(op_ptr) - 1
    total = len(in_sizes)
    for k in range(len(tpl_ids)):
        total += meta[tpl_ids[k], 2] - meta[tpl_ids[k], 0]
    sizes = np.empty(total, np.int64)
    sids = np.empty(total, np.int64)
    g_ptr = np.zeros(n_graphs + 1, np.int64)
    g_reset = np.zeros(n_graphs, np.int64)
    e = 0
    for g in range(n_graphs):
        ops = tpl_ids[op_ptr[g]:op_ptr[g + 1]]
        e, base = _lay_out_part(ops, 0, 0, e, t_sizes, t_refs, meta, sizes, sids)
        for j in range(in_ptr[g], in_ptr[g + 1]):
            sizes[e], sids[e] = in_sizes[j], base
            base += 1
            e += 1
        g_reset[g] = e - g_ptr[g]
        e, base = _lay_out_part(ops, 1, base, e, t_sizes, t_refs, meta, sizes, sids)
        g_ptr[g + 1] = e
    return sizes, sids, g_ptr, g_reset


@njit(cache=True)
def _lay_out_part(ops, part, base, e, t_sizes, t_refs, meta, sizes, sids):
    """Write part `part` (0 the load, 1 the forward) of each op's template from position `e`,
    its allocations numbered from `base`; returns the next position and number."""
    for t in ops:
        for j in range(meta[t, part], meta[t, part + 1]):
            sizes[e], sids[e] = t_sizes[j], base + t_refs[j]
            e += 1
        base += meta[t, 3 + part]
    return e, base
