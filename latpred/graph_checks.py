"""Validation of a whole graph: tensor references, execution order and every op's output shapes.

`validate_graph(graph)` is what a graph read from a file must pass before later stages trust it:
every tensor id in range, no dynamic dimension, each tensor written once and only read after its
writer ran, and each op's outputs shaped as `latpred.shapes.infer_shapes` says. It holds the
checks that span the graph; the per-op shape rules stay in `latpred/shapes.py`. It raises
`ShapeError` naming the first operation or tensor that does not fit.
"""

from __future__ import annotations

from latpred.errors import ShapeError
from latpred.graph import Graph
from latpred.shapes import infer_shapes


def validate_graph(graph: Graph) -> None:
    """Check tensor references, execution order and every op's output shapes.

    Raises ShapeError naming the first operation or tensor that does not fit.
    """
    n = len(graph.tensors)
    for t in (*graph.inputs, *graph.outputs):
        if not 0 <= t < n:
            raise ShapeError(f"The graph refers to tensor {t}, but it has only {n} tensors.")
    for t in graph.tensors:
        if t.shape and min(t.shape) < 0:
            raise ShapeError(f"Tensor '{t.name}' has a dynamic or negative dimension {t.shape}.")
    produced_by = _check_order(graph)
    for t in graph.outputs:
        if t not in produced_by and t not in graph.inputs and not graph.tensors[t].is_constant:
            raise ShapeError(f"Graph output '{graph.tensors[t].name}' is produced by no "
                             "operation.")
    for i, op in enumerate(graph.ops):
        _check_op(graph, i, op)


def _check_order(graph: Graph) -> dict[int, int]:
    """Each tensor is produced once, and only read after its producer ran."""
    n = len(graph.tensors)
    produced_by: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        for t in op.outputs:
            if not 0 <= t < n:
                raise ShapeError(f"Operation {i} ({op.type}) writes tensor {t}, but the graph "
                                 f"has only {n} tensors.")
            if t in produced_by:
                raise ShapeError(f"Tensor '{graph.tensors[t].name}' is written by operations "
                                 f"{produced_by[t]} and {i}.")
            produced_by[t] = i
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            if not -1 <= t < n:
                raise ShapeError(f"Operation {i} ({op.type}) reads tensor {t}, but the graph "
                                 f"has only {n} tensors.")
            if produced_by.get(t, -1) >= i:
                raise ShapeError(f"Operation {i} ({op.type}) reads tensor "
                                 f"'{graph.tensors[t].name}' before operation {produced_by[t]} "
                                 "writes it, so the operations are not in execution order.")
    return produced_by


def _check_op(graph: Graph, i: int, op) -> None:
    tensors = graph.tensors
    ins = [tensors[t] if t >= 0 else None for t in op.inputs]
    try:
        shapes = infer_shapes(op.type, ins, op.attr_dict)
    except ShapeError as err:
        raise ShapeError(f"Operation {i} ({op.type}): {err}") from None
    if shapes is None:
        return
    if len(shapes) != len(op.outputs):
        raise ShapeError(f"Operation {i} ({op.type}) should have {len(shapes)} outputs but has "
                         f"{len(op.outputs)}.")
    for shape, t in zip(shapes, op.outputs):
        if tensors[t].shape != shape:
            raise ShapeError(f"Operation {i} ({op.type}) should output shape {shape}, but its "
                             f"tensor '{tensors[t].name}' has shape {tensors[t].shape}.")
