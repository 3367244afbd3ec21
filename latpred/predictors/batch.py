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
    rows: dict[str, list[list[float]]] = {}
    members: dict[str, list[int]] = {}
    config: list[int] = []
    for g, ks in zip(graphs, kernels):
        sig = _tensor_ids(g, interned)
        ops = g.ops
        for k in ks:
            if len(k.ops) == 1:  # the common case, inlined: this loop runs once per kernel
                op = ops[k.ops[0]]
                key = (k.type, k.part, op.type, op.attrs, tuple([sig[t] for t in op.inputs]),
                       tuple([sig[t] for t in op.outputs]))
            else:
                key = _kernel_key(ops, k, sig)
            cid = seen.get(key)
            if cid is None:
                cid = seen[key] = len(seen)
                group, names = group_of(k.type)
                rows.setdefault(group, []).append(_pick(features(g, k, target), names,
                                                        k.type))
                members.setdefault(group, []).append(cid)
            config.append(cid)
    return FeatureBatch({grp: np.asarray(r, dtype=np.float64) for grp, r in rows.items()},
                        {grp: np.asarray(v, dtype=np.intp) for grp, v in members.items()},
                        np.asarray(config, dtype=np.intp), len(seen))


def predict_batch(batch: FeatureBatch, regressors: Mapping[str, Any]) -> np.ndarray:
    """Latency of every kernel in flat order: one regressor call per group."""
    per_config = np.empty(batch.n_configs, dtype=np.float64)
    for group, X in batch.rows.items():
        per_config[batch.members[group]] = regressors[group].predict(X)
    return per_config[batch.config]


def _tensor_ids(g: Graph, interned: dict[tuple, int]) -> list[int]:
    """Per tensor, a small int naming what features can read of it (shape, dtype, constness,
    kept value, quantized or not), shared across graphs; the trailing -1 stands for index -1
    (an absent optional input). Keys of ints hash far faster than nested tuples."""
    ids = [interned.setdefault((t.shape, t.dtype, t.is_constant, t.value,
                                t.quantization is not None), len(interned))
           for t in g.tensors]
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
