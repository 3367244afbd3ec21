"""Chain graphs end to end: `chain([stem, block1, block2, head])` is the graph of running them in
sequence, each graph's single output feeding the next one's single input.

A supernet's subnets share their blocks: converting each distinct block once (`from_torch` of
the block on its input shape) and chaining the cached graphs gives the subnet's graph without
exporting it, as long as the converter would not fuse across the block boundaries (a block that
starts with a ReLU after a convolution ending the previous one would be fused by the converter;
blocks of conv-BN-activation do not meet that). benchmarks/torch_subnets.py checks the chained
graphs against whole-subnet exports.

A NAS loop chains thousands of subnets a second, so each graph is prepared once (`_Part`, kept
in the graph's cache): its tensors reordered to put its input first and its output last, so
that in a chain its tensor t becomes t + offset (its input, t = 0, lands on the output of the
graph before it, the last tensor so far). The part's ops shifted to an offset, and their
consumer and producer maps (`Graph.consumers`/`producers`) shifted to an offset and an op
offset, are kept per offsets: in a supernet a block sits at few offsets (they depend on how
many tensors and ops the blocks before it have, not on their kernel sizes or widths), so
chaining mostly joins lists of existing ops. The chained graph says how it is joined
(`Graph.segments`: each part's placed ops and its tensors), which deduction and featurization
look up per part, and joins the parts' maps only when asked for them whole; a lookup of one
tensor (`Graph.producer`, `consumers_of`, what GPU deduction asks) reads the parts' maps.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from latpred.errors import ShapeError
from latpred.graph import Graph, Op, Tensor


_PLACED_CAP = 512   # offsets kept per part; past that the part's cache starts again


@dataclass(frozen=True)
class _Part:
    """A graph ready for chaining: tensors input first and output last, ops renumbered to
    match, the flat form of their tensor references, and the part placed at offsets so far."""

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    refs: np.ndarray                  # all ops' inputs then outputs, concatenated, int64
    absent: tuple[int, ...]           # positions in refs of absent optional inputs (-1)
    bounds: tuple[tuple[int, int, int], ...]    # per op: its inputs refs[a:b], outputs [b:c]
    protos: tuple[dict, ...]          # per op: its type, attrs and attr_dict
    consumers: dict[int, tuple[int, ...]]   # of `ops` (Graph's derivation), shifted to place
    producers: dict[int, int]
    placed: dict = field(default_factory=dict)  # (offset, op offset) -> _Placed


@dataclass(frozen=True)
class _Placed:
    """A part's ops and maps at one tensor offset and op offset, and its entry in a chained
    graph's `segments` (made once: a chain joins existing objects)."""

    ops: tuple[Op, ...]
    consumers: dict[int, tuple[int, ...]]
    producers: dict[int, int]
    segment: tuple[tuple[Op, ...], tuple[Tensor, ...]]


def chain(graphs: Sequence[Graph], name: str = "", rename: bool = True) -> Graph:
    """The graphs run one after the other (each has one input and one output).

    Tensor k of graph i keeps its name prefixed "b<i>/" (`rename=False` keeps the names as they
    are and reuses the tensor values: faster, names may repeat; no stage but tracing reads
    them)."""
    if not graphs:
        raise ShapeError("chain needs at least one graph.")
    tensors: list[Tensor] = []
    ops: list[Op] = []
    placed_parts: list[_Placed] = []
    starts: list[int] = []            # per part: the index of its input tensor
    for k, g in enumerate(graphs):
        part = _part(g, k)
        if k and tensors[-1].shape != part.tensors[0].shape:
            raise ShapeError(f"chain: graph {k} ({g.name}) takes {part.tensors[0].shape} but "
                             f"the graph before it gives {tensors[-1].shape}.")
        offset = len(tensors) - 1 if k else 0
        placed = _placed(part, offset, len(ops))
        kept = part.tensors[1:] if k else part.tensors
        if rename:
            kept = [Tensor(f"b{k}/{t.name}", t.shape, t.dtype, t.quantization, t.is_constant,
                           t.value) for t in kept]
        tensors.extend(kept)
        ops.extend(placed.ops)
        placed_parts.append(placed)
        starts.append(offset)
    out = Graph(tuple(tensors), tuple(ops), (0,), (len(tensors) - 1,), name)
    # How the graph is joined (`Graph.segments`); its maps are joined from the parts' when
    # asked for (`_Joined`).
    out._cache.update(segments=tuple([p.segment for p in placed_parts]),
                      joined=_Joined(placed_parts, starts))
    return out


class _Joined:
    """A chained graph's consumer and producer maps (what Graph would derive), from its parts'
    placed maps: whole when Graph.consumers or producers is asked for, or one tensor at a time
    (Graph.producer, consumers_of: GPU deduction asks for a few tensors a graph, so most
    chained graphs never join the whole maps)."""

    __slots__ = ("placed", "starts")

    def __init__(self, placed: list[_Placed], starts: list[int]):
        self.placed, self.starts = placed, starts

    def maps(self) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
        consumers: dict[int, tuple[int, ...]] = {}
        producers: dict[int, int] = {}
        for k, (placed, offset) in enumerate(zip(self.placed, self.starts)):
            joint = consumers.get(offset) if k else None   # read inside the graph before, too
            consumers.update(placed.consumers)
            if joint is not None and offset in placed.consumers:
                consumers[offset] = joint + placed.consumers[offset]
            producers.update(placed.producers)
        return consumers, producers

    # Part k's tensors are starts[k] (its input, the previous part's output) to starts[k + 1]:
    # a tensor is in the maps of the part it is inside, and of the next part too when it is
    # that one's input (a later part's entry comes last, as in `maps`).

    def producer(self, t: int) -> int | None:
        starts, placed = self.starts, self.placed
        if t < 0:   # an absent output (-1): any part may write it, the last one counts
            return next((p.producers[t] for p in reversed(placed) if t in p.producers), None)
        k = bisect_left(starts, t)
        found = placed[k - 1].producers.get(t) if k else None
        if k < len(starts) and starts[k] == t:
            found = placed[k].producers.get(t, found)
        return found

    def consumers_of(self, t: int) -> tuple[int, ...]:
        starts, placed = self.starts, self.placed
        k = bisect_left(starts, t)
        found = placed[k - 1].consumers.get(t, ()) if k else ()
        if k < len(starts) and starts[k] == t:
            return found + placed[k].consumers.get(t, ())
        return found


def _part(g: Graph, k: int) -> _Part:
    part = g._cache.get("chain_part")
    if part is None:
        if len(g.inputs) != 1 or len(g.outputs) != 1 or g.inputs == g.outputs:
            raise ShapeError(f"chain needs one input and one output per graph, not the same "
                             f"tensor; graph {k} ({g.name}) has {len(g.inputs)} and "
                             f"{len(g.outputs)}.")
        part = g._cache["chain_part"] = _prepare(g)
    return part


def _prepare(g: Graph) -> _Part:
    (gin,), (gout,) = g.inputs, g.outputs
    order = [gin] + [t for t in range(len(g.tensors)) if t not in (gin, gout)] + [gout]
    new = {old: i for i, old in enumerate(order)}
    new[-1] = -1
    ops = tuple(Op(op.type, tuple(new[t] for t in op.inputs), tuple(new[t] for t in op.outputs),
                   op.attrs) for op in g.ops)
    refs, bounds = [], []
    for op in ops:
        a = len(refs)
        refs.extend(op.inputs)
        b = len(refs)
        refs.extend(op.outputs)
        bounds.append((a, b, len(refs)))
    protos = tuple({"type": op.type, "attrs": op.attrs, "attr_dict": op.attr_dict}
                   for op in ops)
    view = Graph((), ops, (), ())
    return _Part(tuple(g.tensors[t] for t in order), ops, np.asarray(refs, dtype=np.int64),
                 tuple(i for i, t in enumerate(refs) if t < 0), tuple(bounds), protos,
                 view.consumers, view.producers)


def _placed(part: _Part, offset: int, op_offset: int) -> _Placed:
    placed = part.placed.get((offset, op_offset))
    if placed is None:
        if len(part.placed) >= _PLACED_CAP:
            part.placed.clear()
        ops = tuple(_shifted(part, offset)) if offset else part.ops
        # The maps Graph would derive from `ops`: the part's, every tensor shifted by offset
        # (but an absent output, -1, which stays) and every op by op_offset, in the same order.
        placed = part.placed[(offset, op_offset)] = _Placed(
            ops, {t + offset: tuple([i + op_offset for i in v])
                  for t, v in part.consumers.items()},   # readers of tensors >= 0 only
            {t + offset if t >= 0 else t: i + op_offset for t, i in part.producers.items()},
            (ops, part.tensors))
    return placed


def _shifted(part: _Part, offset: int) -> list[Op]:
    """The part's ops with every tensor reference t >= 0 made t + offset.

    Ops are made without the frozen dataclass's per-field setattr, and share their template's
    attrs and parsed attr_dict."""
    refs = (part.refs + offset).tolist()
    for i in part.absent:
        refs[i] = -1
    new = object.__new__
    out = []
    for (a, b, c), proto in zip(part.bounds, part.protos):
        op = new(Op)
        d = op.__dict__
        d.update(proto)
        d["inputs"] = tuple(refs[a:b])
        d["outputs"] = tuple(refs[b:c])
        out.append(op)
    return out
