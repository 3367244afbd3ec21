"""A graph at another batch size: the same ops, every shape re-inferred from a new batch.

latpred's builder, sampler and zoo make batch-1 graphs; a CUDA target measures batch 1 and 32.
`with_batch(graph, n)` gives the batch-`n` graph (its features and kernels are those of batch
`n`): the inputs' leading dimension becomes `n`, a RESHAPE whose target shape leads with the old
batch leads with `n`, and every op's outputs are re-inferred with `latpred.shapes.infer_shapes`
(ops without a shape rule scale their outputs' leading dimension).
"""

from __future__ import annotations

from dataclasses import replace

from latpred.errors import ShapeError
from latpred.graph import Graph, Tensor
from latpred.shapes import infer_shapes


def graph_batch(graph: Graph) -> int:
    """The batch size of `graph`: the leading dimension of its first input."""
    shape = graph.tensors[graph.inputs[0]].shape
    return shape[0] if shape else 1


def with_batch(graph: Graph, n: int) -> Graph:
    """`graph` with batch size `n` (itself when it already has it)."""
    old = graph_batch(graph)
    if n == old:
        return graph
    if n < 1:
        raise ShapeError(f"batch must be positive, got {n}.")
    tensors: list[Tensor] = list(graph.tensors)
    for i in graph.inputs:
        t = tensors[i]
        tensors[i] = replace(t, shape=(n, *t.shape[1:]))
    for op in graph.ops:
        if op.type == "RESHAPE" and len(op.inputs) > 1 and op.inputs[1] >= 0:
            s = tensors[op.inputs[1]]
            if s.value and s.value[0] == old:
                tensors[op.inputs[1]] = replace(s, value=(n, *s.value[1:]))
        ins = [tensors[t] if t >= 0 else None for t in op.inputs]
        shapes = infer_shapes(op.type, ins, op.attr_dict)
        if op.type == "RESHAPE" and shapes is None:
            shapes = [_reshape_from_attr(tensors, op, old, n)]
        for k, t in enumerate(op.outputs):
            cur = tensors[t]
            if shapes is not None:
                shape = tuple(shapes[k])
            else:
                shape = (cur.shape[0] // old * n, *cur.shape[1:]) if cur.shape else cur.shape
            tensors[t] = replace(cur, shape=shape)
    return Graph(tuple(tensors), graph.ops, graph.inputs, graph.outputs, graph.name)


def _reshape_from_attr(tensors, op, old: int, n: int) -> tuple[int, ...]:
    shape = tuple(op.attr("new_shape", ()) or tensors[op.outputs[0]].shape)
    if shape and shape[0] == old:
        shape = (n, *shape[1:])
    return shape
