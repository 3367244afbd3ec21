"""The CUDA requests of many graphs at once, for `cuda.batch_peaks` (`memory_totals` and
memory-aware NAS on CUDA targets).

A NAS batch meets the same op configurations again and again, so each op's share of the
requests (`torch_plan.load_requests` and `forward_requests`: the sizes it allocates, what it
frees) is worked out once per configuration and kept as a template: the op's type, attributes
and tensors (shape, dtype, constness, kept value, quantized or not: all the rules read) name
it. Python only looks the templates up; a compiled loop lays them out in `simulate`'s order
(every op's load, the inputs, every op's forward) with storage ids, for the compiled
allocator. Given the latency pass's `predictors.batch.FeatureBatch` and kernels
(memory-aware NAS), an op that is a kernel of its own is keyed once per latency configuration
(the batch's key reads all the template key does), not once per op: 500 synthetic models
share ~5,900 configurations among ~15,000 ops. The other ops (views joined to their reader's
kernel) are keyed one by one, their tensors described by the batch's interned ones.
"""

from __future__ import annotations

import threading
from math import prod

import numpy as np
from numba import njit

from latpred.memory import cuda_workspace
from latpred.memory.compiled import leaf
from latpred.memory.flat_arrays import _csr, op_configs, op_offsets
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

    def add(self, new: list[tuple], elem: int, workspace) -> list[int]:
        """Make the templates of `new` (key, graph, op), convolutions' cuDNN workspace from
        `workspace(graph, op, elem)`, and return their numbers."""
        sizes: list[int] = []
        refs: list[int] = []
        meta: list[tuple] = []
        e = self.n_entries
        for key, graph, op in new:
            load = load_requests(graph, op, elem)
            fwd = forward_requests(graph, op, elem, workspace, cuda_workspace.mean_scratch)
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


# per (numbering of op kinds, element bytes): configuration keys name an op by its kind id in
# the featurizer's numbering (`FeatureBatch.kind_numbering`; one a thread, and a new one past
# its cap), so each numbering has its templates
_TEMPLATES: dict[tuple[int, int], _Templates] = {}
_TENSORS: dict[tuple, int] = {}      # a tensor's description -> an id kept across calls
_LOCK = threading.Lock()


def batch_requests(graphs, elem: int, batch: int, tensors=None, kernels=None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sizes or FREE, storage ids, each graph's first request, each graph's load length) of
    `graphs` at `batch` in `elem`-byte elements; `tensors`: the graphs' FeatureBatch, and
    `kernels`: the graphs' kernels it was built from."""
    from latpred.pytorch.batch import with_batch

    with _LOCK:
        if len(_TENSORS) > _CAP or sum(len(s.index) for s in _TEMPLATES.values()) > _CAP:
            _TENSORS.clear()          # template keys name tensors by these ids: both go
            _TEMPLATES.clear()
        numbering = -1 if tensors is None else tensors.kind_numbering
        store = _TEMPLATES.setdefault((numbering, elem), _Templates())
        sized = [with_batch(g, batch) for g in graphs]
        g_ops = op_offsets(sized)
        tpl_ids = np.full(g_ops[-1], -1, np.int64)
        new: dict[tuple, tuple] = {}    # configurations not yet known: (graph, op)
        shared = None if tensors is None else _tensor_ids(tensors.tensor_keys)
        left = np.ones(len(tpl_ids), np.bool_)      # ops whose template is still to find
        by_config = None
        if shared is not None and kernels is not None:
            cfg = op_configs(kernels, tensors, g_ops)
            resized = np.repeat([s is not g for s, g in zip(sized, graphs)], np.diff(g_ops))
            cfg[resized] = -1       # another batch size: other tensors than the batch's
            by_config = _config_keys(cfg, sized, g_ops, tensors.config_keys, shared, store,
                                     new)
            left = cfg < 0
        pos, found, unknown = _op_by_op(left, sized, graphs, g_ops, tensors, shared, store,
                                        new)
        _add_new(new, store, elem)
        if by_config is not None:
            inverse, per_config, unknown_config = by_config
            _resolve(per_config, unknown_config, store)
            tpl_ids[~left] = np.array(per_config, np.int64)[inverse]
        _resolve(found, unknown, store)
        tpl_ids[slice(None) if pos is None else pos] = found
        in_ptr, in_sizes = _csr([[prod(g.tensors[i].shape) * elem for i in g.inputs]
                                 for g in sized])
        return _lay_out(tpl_ids, g_ops, in_sizes, in_ptr, store.sizes, store.refs, store.meta)


def _tensor_ids(descriptions) -> list[int]:
    """Ids kept across calls for tensor descriptions (shape, dtype, constness, value,
    quantized), then -1 (what index -1, an absent optional input, maps to)."""
    put = _TENSORS.setdefault
    return [put(d, len(_TENSORS)) for d in descriptions] + [-1]


def _op_by_op(left: np.ndarray, sized, graphs, g_ops: np.ndarray, tensors, shared, store,
              new: dict) -> tuple[list[int] | None, list[int], list[tuple[int, tuple]]]:
    """The templates of the ops `left` marks, keyed one by one (type, attributes, its tensors'
    ids): their positions (None: every op), their templates (-1 for a configuration not yet
    known, noted in `new`), and (place, key) of those."""
    find = store.index.get
    pos: list[int] = []
    found: list[int] = []
    unknown: list[tuple[int, tuple]] = []
    every = bool(left.all())
    graphs_left = range(len(sized)) if every else \
        np.unique(np.searchsorted(g_ops, np.flatnonzero(left), "right") - 1).tolist()
    for k in graphs_left:
        g = sized[k]
        if shared is not None and g is graphs[k]:
            ids = [shared[i] for i in tensors.tensor_ids[k]]   # [-1]: -1, index -1's
        else:
            ids = _tensor_ids([(t.shape, t.dtype, t.is_constant, t.value,
                                t.quantization is not None) for t in g.tensors])
        id_of, first, last = ids.__getitem__, int(g_ops[k]), int(g_ops[k + 1])
        if every:
            ops = g.ops
        else:
            js = np.flatnonzero(left[first:last]).tolist()
            ops = [g.ops[j] for j in js]
            pos += [first + j for j in js]
        for op in ops:
            key = (op.type, op.attrs, *map(id_of, op.inputs), -2, *map(id_of, op.outputs))
            t = find(key)
            if t is None:
                t = _unknown(key, g, op, new, unknown, len(found))
            found.append(t)
    return (None if every else pos), found, unknown


def _config_keys(cfg: np.ndarray, graphs, g_ops: np.ndarray, config_keys, shared: list[int],
                 store: _Templates, new: dict
                 ) -> tuple[np.ndarray, list[int], list[tuple[int, tuple]]]:
    """The templates of the ops of single-op kernels (`cfg` >= 0), each looked up once per
    latency configuration: its key (`FeatureBatch.config_keys`: the op's interned type and
    attributes, its input count, its tensors' interned ids) reads all the template key does,
    so ops of one configuration share a template, keyed by the op's kind, input count and its
    tensors' ids kept across calls (flat ints: hashed faster than the op's own attributes).
    Returns, for those ops in order, which configuration is theirs (`inverse`), per
    configuration its template (-1 for one not yet known, noted in `new`), and (place, key) of
    those."""
    known = np.flatnonzero(cfg >= 0)
    configs, first, inverse = np.unique(cfg[known], return_index=True, return_inverse=True)
    first = known[first]
    graph_of = np.searchsorted(g_ops, first, "right") - 1
    op_of = (first - g_ops[graph_of]).tolist()
    graph_of = graph_of.tolist()
    find, kept_id = store.index.get, shared.__getitem__
    found: list[int] = []
    unknown: list[tuple[int, tuple]] = []
    for n, c in enumerate(configs.tolist()):   # once per configuration: inline
        ck = config_keys[c]      # (kernel type, stage, kind, input count, *ids)
        key = (ck[2], ck[3], *map(kept_id, ck[4:]))
        t = find(key)
        if t is None:
            g = graphs[graph_of[n]]
            t = _unknown(key, g, g.ops[op_of[n]], new, unknown, len(found))
        found.append(t)
    return inverse.reshape(-1), found, unknown


def _unknown(key: tuple, g, op, new: dict, unknown: list, place: int) -> int:
    """Note a key no template has yet: in `new` (with the graph and op that make it, once) and
    in `unknown` (with its place); -1 holds the place."""
    if key not in new:
        new[key] = (g, op)
    unknown.append((place, key))
    return -1


def _resolve(found: list[int], unknown: list[tuple[int, tuple]], store: _Templates) -> None:
    """Fill the places of keys made since (`_add_new`) with their templates."""
    index = store.index
    for place, key in unknown:
        found[place] = index[key]


def _add_new(new: dict, store: _Templates, elem: int) -> None:
    """Make the templates of the batch's new configurations, their convolutions' cuDNN
    workspaces worked out together (one estimator call for those the table lacks; each is a
    configuration met for the first time, so none is kept)."""
    convs = [(g, op) for g, op in new.values() if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    ws_of = dict(zip([id(op) for _, op in convs], cuda_workspace.workspaces(convs, elem)))
    store.add([(key, g, op) for key, (g, op) in new.items()], elem,
              lambda graph, op, elem: ws_of[id(op)])


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


@leaf
def _lay_out_part(ops, part, base, e, t_sizes, t_refs, meta, sizes, sids):
    """Write part `part` (0 the load, 1 the forward) of each op's template from position `e`,
    its allocations numbered from `base`; returns the next position and number."""
    for t in ops:
        for j in range(meta[t, part], meta[t, part + 1]):
            sizes[e], sids[e] = t_sizes[j], base + t_refs[j]
            e += 1
        base += meta[t, 3 + part]
    return e, base
