"""Memory-aware NAS: peak memory with latency in one pass.

    preds, peaks = predict_many_with_memory(model, graphs)   # Prediction list, bytes array

`memory_totals` computes only the totals (the same arena plan, without the per-op table), so a
NAS loop can use memory as a constraint next to latency. `predict_many_with_memory` also reuses
what the latency prediction computed: tensor sizes and per-configuration op facts (`configs`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from latpred.gc_pause import paused_gc
from latpred.graph import Graph
from latpred.memory import xnnpack
from latpred.memory import xnnpack_operators as xnn_ops
from latpred.memory.configs import OpConfigs, batch_configs
from latpred.memory.host_cpu import (eight_bit_operators, estimate_model_bytes,
                                     for_precision, overhead, transient)
from latpred.memory.litert_builtin import builtin_input
from latpred.memory.litert_plan import plan


def memory_total(graph: Graph, kernels: str = "xnnpack", configs: OpConfigs | None = None) -> int:
    """`predict_memory(graph, host target, kernels).total` without building the per-op rows
    (`configs`: facts known per op configuration, `configs.batch_configs`)."""
    if kernels == "builtin":
        p = builtin_input(graph)
        ap = plan(p, stats=False)
        extra = overhead(len(graph.tensors)) + transient(ap.marks, 0)
    else:
        layout = xnnpack.delegated_input(graph, configs)
        p = layout.plan_input
        ap = plan(p, stats=False)
        workspace, _, regrowth = xnnpack.workspace_plan(graph, layout, False)
        extra = workspace + transient(ap.marks, regrowth) + overhead(
            len(graph.tensors), eight_bit_operators(graph, layout.delegated_ops))
        extra += xnn_ops.buffers_total(graph, layout.delegated_ops, configs)
    return estimate_model_bytes(graph) + ap.arena_bytes + ap.persistent_bytes + extra


def memory_totals(graphs: Sequence[Graph], target: Any = "host/cpu/fp32/t1",
                  kernels: str = "xnnpack") -> np.ndarray:
    """Peak bytes of each graph on `target` (LiteRT on the CPU, LiteRT's GPU accelerator, or a
    CUDA target: the caching allocator's max_memory_allocated), as `predict_memory` totals."""
    with paused_gc():
        return _memory_totals(graphs, target, kernels)


def _memory_totals(graphs: Sequence[Graph], target: Any, kernels: str) -> np.ndarray:
    from latpred.memory import _check_target

    t = _check_target(target)
    if t.processor == "cuda":
        from latpred.memory.cuda import batch_peaks

        return batch_peaks(graphs, t.precision, t.batch)
    if t.processor == "gpu":
        from latpred.memory.gpu_flat import delegate_totals

        return delegate_totals(graphs, t)
    if kernels == "xnnpack" and _compiled():
        from latpred.memory.flat import graph_totals

        # int8: float graphs planned as their int8 models (`for_precision`), see flat_int8
        return graph_totals(graphs, int8=t.precision == "int8")
    graphs = [for_precision(g, t.precision) for g in graphs]
    return np.array([memory_total(g, kernels) for g in graphs], dtype=np.int64)


def predict_many_with_memory(model: Any, graphs: Sequence[Graph], *, kernels: str = "xnnpack",
                             allow_fallback: bool = False) -> tuple[list[Any], np.ndarray]:
    """`model.predict_many(graphs)` and the graphs' peak memory on the model's target."""
    with paused_gc():
        return _with_memory(model, graphs, kernels, allow_fallback)


def _with_memory(model: Any, graphs: Sequence[Graph], kernels: str, allow_fallback: bool
                 ) -> tuple[list[Any], np.ndarray]:
    from latpred.memory import _check_target

    batched = getattr(model, "predict_many_batch", None)
    t = _check_target(model.target)
    if batched is None:
        preds = model.predict_many(graphs, allow_fallback=allow_fallback)
        return preds, memory_totals(graphs, model.target, kernels)
    if kernels == "xnnpack" and _compiled() and t.processor == "cpu":
        from latpred.memory.flat import xnnpack_totals
        from latpred.memory.flat_arrays import Wiring

        wiring = Wiring()
        preds, graphs, deduced, batch = batched(graphs, allow_fallback=allow_fallback,
                                                visit=wiring.collect)
        # int8: the memory of the int8 models (`for_precision`), not of the float graphs the
        # latency batch holds (flat_int8)
        return preds, xnnpack_totals(graphs, deduced, batch, wiring,
                                     int8=t.precision == "int8")
    if t.processor == "cuda":
        from latpred.memory.cuda import batch_peaks

        # the latency batch's configurations key each op's requests (`batch_peaks`)
        preds, graphs, deduced, batch = batched(graphs, allow_fallback=allow_fallback)
        return preds, batch_peaks(graphs, t.precision, t.batch, tensors=batch, kernels=deduced)
    if t.processor == "gpu":
        from latpred.memory.gpu_flat import delegate_totals

        # tensor sizes from the latency batch's interned tensors. Flattening each graph in
        # the batch's per-graph hook instead (as the host path records its wiring) showed no
        # gain here: +45 us a graph, paired IQR -59..+100 (session 33)
        preds, graphs, _, batch = batched(graphs, allow_fallback=allow_fallback)
        return preds, delegate_totals(graphs, t, batch)
    if t.precision == "int8":
        preds, graphs = batched(graphs, allow_fallback=allow_fallback)[:2]
        return preds, memory_totals(graphs, model.target, kernels)
    preds, graphs, deduced, batch = batched(graphs, allow_fallback=allow_fallback)
    configs = batch_configs(graphs, deduced, batch)
    return preds, np.array([memory_total(g, kernels, c) for g, c in zip(graphs, configs)],
                           dtype=np.int64)


def _compiled() -> bool:
    """Whether numba is installed (a dependency; without it the Python planners run)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True
