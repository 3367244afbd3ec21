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


def chain(graphs: Sequence[Graph], name: str = "", rename: bool = True) -> Graph:
    """The graphs run one after the other (each has one input and one output).

    Tensor k of graph i keeps its name prefixed "b<i>/" (`rename=False` keeps the names as they
    are and reuses the tensor values: faster, names may repeat; no stage but tracing reads
    them)."""
    if not graphs:
        raise ShapeError("chain needs at least one graph.")
    tensors: list[Tensor] = []
    ops: list[Op] = []
    prev_out = first_in = -1
    for k, g in enumerate(graphs):
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise ShapeError(f"chain needs one input and one output per graph; graph {k} "
                             f"({g.name}) has {len(g.inputs)} and {len(g.outputs)}.")
        (gin,), (gout,) = g.inputs, g.outputs
        if k and tensors[prev_out].shape != g.tensors[gin].shape:
            raise ShapeError(f"chain: graph {k} ({g.name}) takes {g.tensors[gin].shape} but "
                             f"the graph before it gives {tensors[prev_out].shape}.")
        base = len(tensors)
        # tensor i -> base + i, less one past a dropped input; the input -> what came before
        drop = k > 0
        ids = [base + i - (drop and i > gin) for i in range(len(g.tensors))]
        if drop:
            ids[gin] = prev_out
        ids.append(-1)                     # ids[-1]: an absent optional input stays -1
        kept = g.tensors if not drop else g.tensors[:gin] + g.tensors[gin + 1:]
        if rename:
            kept = [Tensor(f"b{k}/{t.name}", t.shape, t.dtype, t.quantization, t.is_constant,
                           t.value) for t in kept]
        tensors.extend(kept)
        if not k:
            first_in = ids[gin]
        ops.extend([_op(op.type, tuple([ids[t] for t in op.inputs]),
                        tuple([ids[t] for t in op.outputs]), op.attrs) for op in g.ops])
        prev_out = ids[gout]
    return Graph(tuple(tensors), tuple(ops), (first_in,), (prev_out,), name)


def _op(kind: str, inputs: tuple[int, ...], outputs: tuple[int, ...], attrs: tuple) -> Op:
    """Op(kind, inputs, outputs, attrs) without the frozen dataclass's per-field setattr (a
    supernet loop chains hundreds of thousands of ops; the values are the same)."""
    op = object.__new__(Op)
    op.__dict__.update(type=kind, inputs=inputs, outputs=outputs, attrs=attrs)
    return op
