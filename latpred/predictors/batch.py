"""Featurize the kernels of many graphs at once, each distinct kernel configuration once.

Candidates of one NAS space share most kernel configurations (10,000 synthetic_cnn models hold
about 300,000 CPU kernels but only about 26,000 distinct ones), so `predict_many` featurizes and
predicts each configuration once and scatters the results. A configuration is everything
`kernel_features` can read: the kernel's type and stage, and for each member op its type,
attributes and the shape, dtype, constness and kept value of every tensor it touches, plus which
inputs come from inside the kernel. Tests check the cached path gives the uncached result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from latpred.graph import Graph


@dataclass(frozen=True)
class FeatureBatch:
    """Distinct kernel configurations, their feature rows per regressor group, and for every
    kernel (in flat order over all graphs) the configuration it has."""

    rows: dict[str, np.ndarray]     # group -> (n_distinct_in_group, n_features) float64
    members: dict[str, np.ndarray]  # group -> configuration ids of those rows
    config: np.ndarray              # per kernel: its configuration id
    n_configs: int


def featurize(graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]], target: Any,
              group_of: Callable[[str], tuple[str, tuple[str, ...]]],
              features: Callable[[Graph, Any, Any], Mapping[str, float]] | None = None
              ) -> FeatureBatch:
    """Feature rows of all kernels; `group_of(kernel_type)` -> (group name, feature names);
    `features(graph, kernel, target)` (default `kernel_features`) must depend on nothing the
    configuration key leaves out."""
    from latpred.features import kernel_features

    features = features or kernel_features

    seen: dict[tuple, int] = {}
    interned: dict[tuple, int] = {}
    by_object: dict[int, int] = {}     # id(Tensor) -> its interned id
    op_kinds: dict[tuple, int] = {}
    op_ids: dict[int, int] = {}        # id(Op) -> its interned (type, attrs)
    held: list[Any] = []               # what those ids name, kept alive so no id is reused
    rows: dict[str, list[list[float]]] = {}
    members: dict[str, list[int]] = {}
    config: list[int] = []
    seen_get, kind_of, add_config = seen.get, op_ids.get, config.append
    for g, ks in zip(graphs, kernels):
        sig = _tensor_ids(g, interned, by_object, held)
        at = sig.__getitem__
        ops = g.ops
        for k in ks:   # this loop runs once per kernel: names hoisted, the common case inline
            k_ops = k.ops
            if len(k_ops) == 1:
                op = ops[k_ops[0]]
                kind = kind_of(id(op))   # (type, attrs) as an int: one hash per Op object
                if kind is None:
                    held.append(op)
                    kind = op_ids[id(op)] = op_kinds.setdefault((op.type, op.attrs),
                                                                len(op_kinds))
                key = (k.type, k.part, kind, tuple(map(at, op.inputs)),
                       tuple(map(at, op.outputs)))
            else:
                key = _kernel_key(ops, k, sig)
            cid = seen_get(key)
            if cid is None:
                cid = seen[key] = len(seen)
                group, names = group_of(k.type)
                rows.setdefault(group, []).append(_pick(features(g, k, target), names,
                                                        k.type))
                members.setdefault(group, []).append(cid)
            add_config(cid)
    return FeatureBatch({grp: np.asarray(r, dtype=np.float64) for grp, r in rows.items()},
                        {grp: np.asarray(v, dtype=np.intp) for grp, v in members.items()},
                        np.asarray(config, dtype=np.intp), len(seen))


def predict_batch(batch: FeatureBatch, regressors: Mapping[str, Any]) -> np.ndarray:
    """Latency of every kernel in flat order: one regressor call per group."""
    per_config = np.empty(batch.n_configs, dtype=np.float64)
    for group, X in batch.rows.items():
        per_config[batch.members[group]] = regressors[group].predict(X)
    return per_config[batch.config]


def _tensor_ids(g: Graph, interned: dict[tuple, int], by_object: dict[int, int],
                held: list[Any]) -> list[int]:
    """Per tensor, a small int naming what features can read of it (shape, dtype, constness,
    kept value, quantized or not), shared across graphs; the trailing -1 stands for index -1
    (an absent optional input). Keys of ints hash far faster than nested tuples, and graphs
    that share Tensor objects (chained supernet blocks) look each one up by identity."""
    ids = list(map(by_object.get, map(id, g.tensors)))
    if None in ids:
        for i, t in enumerate(g.tensors):
            if ids[i] is None:
                held.append(t)
                ids[i] = by_object[id(t)] = interned.setdefault(
                    (t.shape, t.dtype, t.is_constant, t.value, t.quantization is not None),
                    len(interned))
    ids.append(-1)
    return ids


def _kernel_key(ops, k: Any, sig: list) -> tuple:
    """The configuration of a kernel of several ops (a single op's is built inline)."""
    inside: dict[int, int] = {}
    parts: list[Any] = [k.type, k.part, len(k.ops)]
    for pos, i in enumerate(k.ops):
        op = ops[i]
        # An input produced inside the kernel is named by its producer's position (as -2 - pos)
        # instead of its tensor id: fusion features count only bytes read from outside.
        ins = tuple(-2 - inside[t] if t in inside else sig[t] for t in op.inputs)
        parts.append((op.type, op.attrs, ins, tuple([sig[t] for t in op.outputs])))
        for t in op.outputs:
            inside[t] = pos
    return tuple(parts)


def _pick(feats: Mapping[str, float], names: tuple[str, ...], ktype: str) -> list[float]:
    from latpred.errors import PredictorError

    try:
        return [feats[f] for f in names]
    except KeyError as err:
        raise PredictorError(f"The {ktype} regressor expects feature {err.args[0]!r}, which "
                             "featurization no longer produces; retrain the predictor.") from None
