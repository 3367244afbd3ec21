"""Chain graphs end to end: `chain([stem, block1, block2, head])` is the graph of running them in
sequence, each graph's single output feeding the next one's single input.

A supernet's subnets share their blocks: converting each distinct block once (`from_torch` of
the block on its input shape) and chaining the cached graphs gives the subnet's graph without
exporting it, as long as the converter would not fuse across the block boundaries (a block that
starts with a ReLU after a convolution ending the previous one would be fused by the converter;
blocks of conv-BN-activation do not meet that). benchmarks/torch_subnets.py checks the chained
graphs against whole-subnet exports.
"""

from __future__ import annotations

from typing import Sequence

from latpred.errors import ShapeError
from latpred.graph import Graph, Op, Tensor


def chain(graphs: Sequence[Graph], name: str = "") -> Graph:
    """The graphs run one after the other (each has one input and one output)."""
    if not graphs:
        raise ShapeError("chain needs at least one graph.")
    tensors: list[Tensor] = []
    ops: list[Op] = []
    prev_out = -1
    first_in = -1
    for k, g in enumerate(graphs):
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise ShapeError(f"chain needs one input and one output per graph; graph {k} "
                             f"({g.name}) has {len(g.inputs)} and {len(g.outputs)}.")
        (gin,), (gout,) = g.inputs, g.outputs
        ids: dict[int, int] = {-1: -1}
        if k:
            want, got = tensors[prev_out].shape, g.tensors[gin].shape
            if want != got:
                raise ShapeError(f"chain: graph {k} ({g.name}) takes {got} but the graph "
                                 f"before it gives {want}.")
            ids[gin] = prev_out
        for i, t in enumerate(g.tensors):
            if i in ids:
                continue
            ids[i] = len(tensors)
            tensors.append(Tensor(f"b{k}/{t.name}", t.shape, t.dtype, t.quantization,
                                  t.is_constant, t.value))
        if not k:
            first_in = ids[gin]
        ops.extend(Op(op.type, tuple(ids[t] for t in op.inputs),
                      tuple(ids[t] for t in op.outputs), op.attrs) for op in g.ops)
        prev_out = ids[gout]
    return Graph(tuple(tensors), tuple(ops), (first_in,), (prev_out,), name)
