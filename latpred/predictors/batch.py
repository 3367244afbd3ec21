"""Featurize the kernels of many graphs at once, each distinct kernel configuration once.

Candidates of one NAS space share most kernel configurations (10,000 synthetic_cnn models hold
about 300,000 CPU kernels but only about 26,000 distinct ones), so `predict_many` featurizes and
predicts each configuration once and scatters the results. A configuration is everything
`kernel_features` can read: the kernel's type and stage, and for each member op its type,
attributes and the shape, dtype, constness and kept value of every tensor it touches, plus which
inputs come from inside the kernel. Tests check the cached path gives the uncached result.

The one graph-level column, `context_bytes` (conv and FC kernels: the bytes the whole graph
moves, see `latpred.features.kernel`), is summed per graph from the configurations' bytes and
set per kernel at prediction: those groups are predicted per distinct (configuration, context).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from latpred.graph import Graph

# Op objects whose interned facts are kept across calls (chained graphs'; tens of MB at the cap)
_KEPT_CAP = 1 << 17
# each _OpKeys instance numbers kinds its own way: a kind id means nothing in another
_NUMBERINGS = itertools.count()


@dataclass(frozen=True)
class FeatureBatch:
    """Distinct kernel configurations, their feature rows per regressor group, and for every
    kernel (in flat order over all graphs) the configuration it has."""

    rows: dict[str, np.ndarray]     # group -> (n_distinct_in_group, n_features) float64
    members: dict[str, np.ndarray]  # group -> configuration ids of those rows
    config: np.ndarray              # per kernel: its configuration id
    n_configs: int
    context: np.ndarray             # per kernel: its graph's context_bytes
    context_col: dict[str, int]     # group -> the column of context_bytes, where it has one
    moved: np.ndarray               # per configuration: bytes read + written
    # Per graph, each tensor's interned id (then -1 for index -1), and per id what it names:
    # (shape, dtype, is_constant, value, quantized). latpred.memory reads tensor sizes there.
    tensor_ids: tuple[list[int], ...] = ()
    tensor_keys: tuple[tuple, ...] = ()
    # Per configuration of one op, its interned (type, attrs) (-1 for a kernel of several ops);
    # latpred.memory reads operator attributes once per such kind.
    config_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    # Per configuration its key (a single op's: kernel type, stage, kind, input count, then its
    # inputs' and outputs' interned ids), and which numbering of kinds they use (kind ids stay
    # the same across calls while it does): latpred.memory keys CUDA request templates by them.
    config_keys: tuple[tuple, ...] = ()
    kind_numbering: int = -1


def featurize(graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]], target: Any,
              group_of: Callable[[str], tuple[str, tuple[str, ...]]],
              features: Callable[[Graph, Any, Any], Mapping[str, float]] | None = None
              ) -> FeatureBatch:
    """Feature rows of all kernels; `group_of(kernel_type)` -> (group name, feature names);
    `features(graph, kernel, target)` (default `kernel_features`) must depend on nothing the
    configuration key leaves out."""
    from latpred.features import CONTEXT, kernel_features

    features = features or kernel_features

    seen: dict[tuple, int] = {}
    interned: dict[tuple, int] = {}
    by_object: dict[int, int] = {}     # id(Tensor) -> its interned id
    by_part: dict[int, list[int]] = {}  # id(a chained graph's part's tensors) -> their ids
    held: list[Any] = []               # what those ids name, kept alive so no id is reused
    op_keys = _OpKeys.current()
    op_kinds = op_keys.op_kinds
    # What keys read of Op objects, by identity: a chained graph's Ops are kept alive by its
    # parts, so theirs is kept across calls; other graphs' for this call only.
    kept = (op_keys.kinds, op_keys.fused, op_keys.held)
    once = ({}, {}, held)
    rows: dict[str, list[list[float]]] = {}
    members: dict[str, list[int]] = {}
    context_col: dict[str, int] = {}
    moved: list[float] = []            # per configuration: bytes read + written
    kinds: list[int] = []              # per configuration: its op's kind, or -1
    config: list[int] = []
    sigs: list[list[int]] = []
    seen_get, add_config, fused_key = seen.get, config.append, op_keys.fused_key
    for g, ks in zip(graphs, kernels):
        sig = _tensor_ids(g, interned, by_object, by_part, held)
        sigs.append(sig)
        at = sig.__getitem__
        ops = g.ops
        op_ids, by_ops, hold = kept if g.segments is not None else once
        kind_of = op_ids.get
        for k in ks:   # this loop runs once per kernel: names hoisted, the common case inline
            k_ops = k.ops
            if len(k_ops) == 1:
                op = ops[k_ops[0]]
                kind = kind_of(id(op))   # (type, attrs) as an int: one hash per Op object
                if kind is None:
                    hold.append(op)
                    kind = op_ids[id(op)] = op_kinds.setdefault((op.type, op.attrs),
                                                                len(op_kinds))
                # One flat tuple of ints (and two interned strings): hashed and compared
                # faster than nested tuples. The input count keeps inputs apart from outputs.
                ins = op.inputs
                key = (k.type, k.part, kind, len(ins), *map(at, ins), *map(at, op.outputs))
            else:
                key, kind = fused_key(ops, k, at, by_ops, hold), -1
            cid = seen_get(key)
            if cid is None:
                cid = seen[key] = len(seen)
                group, names = group_of(k.type)
                f = features(g, k, target)
                if CONTEXT in names:
                    context_col[group] = names.index(CONTEXT)
                    f = {**f, CONTEXT: 0.0}   # set per kernel by predict_batch
                rows.setdefault(group, []).append(_pick(f, names, k.type))
                members.setdefault(group, []).append(cid)
                moved.append(f["bytes_read"] + f["bytes_written"])
                kinds.append(kind)
            add_config(cid)
    config_ids = np.asarray(config, dtype=np.intp)
    moved_per_config = np.asarray(moved, dtype=np.float64)
    return FeatureBatch({grp: np.asarray(r, dtype=np.float64) for grp, r in rows.items()},
                        {grp: np.asarray(v, dtype=np.intp) for grp, v in members.items()},
                        config_ids, len(seen),
                        _graph_context(kernels, config_ids, moved_per_config), context_col,
                        moved_per_config, tuple(sigs), tuple(interned),
                        np.asarray(kinds, dtype=np.intp), tuple(seen), op_keys.numbering)


def _graph_context(kernels: Sequence[Sequence[Any]], config: np.ndarray,
                   moved: np.ndarray) -> np.ndarray:
    """Per kernel, `context_bytes` of its graph: the bytes all its kernels move, rounded."""
    from latpred.features import context_bytes

    sizes = np.fromiter((len(ks) for ks in kernels), dtype=np.intp, count=len(kernels))
    per_kernel = moved[config] if len(config) else np.zeros(0)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    starts = np.minimum(starts, max(len(per_kernel) - 1, 0))   # reduceat needs them in range
    sums = np.add.reduceat(per_kernel, starts) if len(per_kernel) else np.zeros(len(sizes))
    sums = np.where(sizes > 0, sums, 0.0)   # reduceat repeats a value for empty graphs
    return np.repeat(context_bytes(sums), sizes)


def predict_configs(batch: FeatureBatch, regressors: Mapping[str, Any]) -> np.ndarray:
    """Latency per configuration of the groups without `context_bytes` (NaN for the others,
    whose latency depends on the graph): one regressor call per group."""
    per_config = np.full(batch.n_configs, np.nan, dtype=np.float64)
    for group, X in batch.rows.items():
        if group not in batch.context_col:
            per_config[batch.members[group]] = regressors[group].predict(X)
    return per_config


def predict_batch(batch: FeatureBatch, regressors: Mapping[str, Any]) -> np.ndarray:
    """Latency of every kernel in flat order: one regressor call per group."""
    out = predict_configs(batch, regressors)[batch.config]
    if not batch.context_col:
        return out
    # Graphs share few contexts (rounded to 1/8 octave): numbered, a (configuration, context)
    # pair is one int, deduplicated far faster than rows of two columns.
    contexts, code = np.unique(batch.context, return_inverse=True)
    code, k = code.reshape(-1), len(contexts)
    for group, col in batch.context_col.items():
        row_of = np.full(batch.n_configs, -1, dtype=np.intp)
        row_of[batch.members[group]] = np.arange(len(batch.members[group]))
        mine = np.flatnonzero(row_of[batch.config] >= 0)
        # Kernels of one configuration in graphs that move the same bytes share a prediction.
        uniq, back = np.unique(batch.config[mine] * k + code[mine], return_inverse=True)
        X = batch.rows[group][row_of[uniq // k]]   # a copy
        X[:, col] = contexts[uniq % k]
        out[mine] = regressors[group].predict(X)[back.reshape(-1)]
    return out


def _tensor_ids(g: Graph, interned: dict[tuple, int], by_object: dict[int, int],
                by_part: dict[int, list[int]], held: list[Any]) -> list[int]:
    """Per tensor, a small int naming what features can read of it (shape, dtype, constness,
    kept value, quantized or not), shared across graphs; the trailing -1 stands for index -1
    (an absent optional input). Keys of ints hash far faster than nested tuples, and graphs
    that share Tensor objects (chained supernet blocks) look each one up by identity; a chained
    graph's are joined from its parts' (`Graph.segments`: the same values), each part's made
    once."""
    if g.segments is not None:
        ids = []
        for _, tensors in g.segments:
            part = by_part.get(id(tensors))
            if part is None:
                held.append(tensors)
                part = by_part[id(tensors)] = _object_ids(tensors, interned, by_object, held)
            ids += part[1:] if ids else part
    else:
        ids = _object_ids(g.tensors, interned, by_object, held)
    ids.append(-1)
    return ids


def _object_ids(tensors: tuple, interned: dict[tuple, int], by_object: dict[int, int],
                held: list[Any]) -> list[int]:
    ids = list(map(by_object.get, map(id, tensors)))
    if None in ids:
        for i, t in enumerate(tensors):
            if ids[i] is None:
                held.append(t)
                ids[i] = by_object[id(t)] = interned.setdefault(
                    (t.shape, t.dtype, t.is_constant, t.value, t.quantization is not None),
                    len(interned))
    return ids


class _OpKeys:
    """What configuration keys read of Op objects, interned per thread (ids stay consistent
    while the instance lives): an Op's (type, attrs) as an int, and the keys of
    kernels of several ops (a single op's is built inline): the kernel's type and stage, its
    Ops' layout (`_fused_layout`) interned as -1 - an id (negative unlike a single op's kind),
    then the interned ids of the tensors it reads from outside and writes: one short flat
    tuple like a single op's. The layout fixes how many ids follow, so keys are as distinct as
    nested (type, attrs, inputs, outputs) tuples per op would be. It is worked out once per
    sequence of Op objects; `kinds` and `fused` keep them, by identity, for chained graphs'
    Ops across calls (chained subnets share them; `held` keeps them alive so no id is
    reused)."""

    _local = threading.local()   # one per thread: numbering is not atomic

    def __init__(self) -> None:
        self.op_kinds: dict[tuple, int] = {}
        self.layouts: dict[tuple, int] = {}
        self.kinds: dict[int, int] = {}        # id(Op) -> its interned (type, attrs)
        self.fused: dict[tuple, tuple] = {}    # ids of the Ops -> (layout, tensor indices)
        self.held: list[Any] = []
        self.numbering = next(_NUMBERINGS)

    @classmethod
    def current(cls) -> "_OpKeys":
        """The thread's instance; a new one past `_KEPT_CAP` entries (a call in progress
        keeps the one it started with, whose ids stay consistent)."""
        keys = getattr(cls._local, "keys", None)
        if keys is None or len(keys.kinds) + len(keys.fused) + len(keys.op_kinds) \
                + len(keys.layouts) > _KEPT_CAP:
            keys = cls._local.keys = cls()
        return keys

    def fused_key(self, ops, k: Any, at: Callable[[int], int], by_ops: dict[tuple, tuple],
                  hold: list[Any]) -> tuple:
        ids = tuple(map(id, map(ops.__getitem__, k.ops)))
        found = by_ops.get(ids)
        if found is None:
            members = [ops[i] for i in k.ops]
            hold.extend(members)
            head, tensors = _fused_layout(members, self.op_kinds)
            layout = -1 - self.layouts.setdefault(head, len(self.layouts))
            found = by_ops[ids] = (layout, tensors)
        layout, tensors = found
        return (k.type, k.part, layout, *map(at, tensors))


def _fused_layout(members: list, op_kinds: dict[tuple, int]) -> tuple[tuple, tuple]:
    """What a fused kernel's key reads of its Ops: a head of ints and the tensor indices whose
    interned ids follow it. Per op the head holds its interned (type, attrs), input and output
    counts and per input 0, or 1 + the position of its producer when that is inside the kernel
    (fusion features count only bytes read from outside); those inputs have no tensor index."""
    inside: dict[int, int] = {}
    head: list[int] = []
    tensors: list[int] = []
    for pos, op in enumerate(members):
        head += (op_kinds.setdefault((op.type, op.attrs), len(op_kinds)),
                 len(op.inputs), len(op.outputs))
        for t in op.inputs:
            producer = inside.get(t)
            head.append(0 if producer is None else 1 + producer)
            if producer is None:
                tensors.append(t)
        tensors += op.outputs
        for t in op.outputs:
            inside[t] = pos
    return tuple(head), tuple(tensors)


def _pick(feats: Mapping[str, float], names: tuple[str, ...], ktype: str) -> list[float]:
    from latpred.errors import PredictorError

    try:
        return [feats[f] for f in names]
    except KeyError as err:
        raise PredictorError(f"The {ktype} regressor expects feature {err.args[0]!r}, which "
                             "featurization no longer produces; retrain the predictor.") from None
