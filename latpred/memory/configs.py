"""Memory-aware NAS: the memory totals reuse what the latency prediction already computed.

`LatencyModel.predict_many_batch` interns every tensor by what features read of it (shape,
dtype, constness, ...) and names each kernel's configuration (its op's type and attributes and
those tensor ids) in its FeatureBatch (latpred/predictors/batch.py). A NAS batch repeats both
(1,000 synthetic_cnn candidates: 70,829 tensors of 5,007 kinds, 30,412 ops of 8,807
configurations), so here:

- tensor sizes and constness are computed once per interned tensor and handed to the graphs'
  `tensor_table`;
- what depends on an op's configuration alone, whether XNNPACK takes it
  (`xnnpack_partition.supported`, while every allocation type is the default one) and its
  packed weights and indirection buffers, is computed once per configuration (`OpConfigs`).

The totals are `memory_totals`' (scripts/memory_fast_check.py compares them).
"""

from __future__ import annotations

from math import prod
from typing import Any, Iterator, NamedTuple, Sequence

from latpred.graph import _ITEMSIZE, Graph
from latpred.memory.litert_builtin import set_tensor_table


class OpConfigs(NamedTuple):
    """One graph's ops' configuration ids (-1: an op of a several-op kernel, whose facts are
    computed as without configurations), and the facts found so far per configuration, which
    a batch's graphs share."""

    of_op: list[int]
    supported: dict[int, bool]
    buffers: dict[int, int]


def batch_configs(graphs: Sequence[Graph], kernels: Sequence[Sequence[Any]],
                  batch: Any) -> Iterator[OpConfigs]:
    """Per graph of a FeatureBatch (`kernels[i]`: graph i's deduced kernels), its OpConfigs;
    each graph's tensor table is set on the way."""
    keys = batch.tensor_keys            # (shape, dtype, is_constant, value, quantized)
    nbytes = [prod(k[0]) * _ITEMSIZE[k[1]] for k in keys]
    constant = [k[2] for k in keys]
    config = batch.config.tolist()
    supported: dict[int, bool] = {}
    buffers: dict[int, int] = {}
    start = 0
    for g, ks, ids in zip(graphs, kernels, batch.tensor_ids, strict=True):
        ids = ids[:-1]                  # the last id stands for index -1
        set_tensor_table(g, list(map(nbytes.__getitem__, ids)),
                         list(map(constant.__getitem__, ids)))
        of_op = [-1] * len(g.ops)
        for k, c in zip(ks, config[start:start + len(ks)]):
            if len(k.ops) == 1:
                of_op[k.ops[0]] = c
        start += len(ks)
        yield OpConfigs(of_op, supported, buffers)
