"""The framework-neutral graph IR every stage of latpred works on.

A `Graph` is a frozen value: tensors, operations and the graph's inputs and outputs, all referring
to tensors by their index in `Graph.tensors`. Operation types are canonical TFLite builtin names
(`CONV_2D`, `DEPTHWISE_CONV_2D`, ...; a custom op is `CUSTOM:<code>`). Layout is NHWC, as in
TFLite. Attribute names are shared by the reader, the writer, the builder and every later stage;
`docs/interfaces.md` lists them per op type.

Nothing here mutates: derived views (producers, consumers, topological order) are computed on
demand and cached on the instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from latpred.errors import ShapeError

# Attribute values must be hashable so that Ops (and Graphs) are values: ints, floats, strs,
# bools, None and tuples of those.
AttrValue = Any

DTYPES = ("float32", "float16", "int8", "uint8", "int16", "int32", "int64", "bool", "string")

# Fused activation function names, as TFLite's ActivationFunctionType spells them.
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")


@dataclass(frozen=True)
class Quantization:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per channel `axis`."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1


@dataclass(frozen=True)
class Tensor:
    """A tensor: static shape, element type, optional quantization.

    `is_constant` means the model stores its data (weights, biases, shape/axis operands).
    `value` holds the data of small integer constants that carry meaning (reshape shapes, axes,
    paddings, permutations, slice bounds); weights are never kept: they do not change latency
    and the writer makes seeded random ones.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    quantization: Quantization | None = None
    is_constant: bool = False
    value: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


_ITEMSIZE = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
             "int64": 8, "bool": 1, "string": 1}


def freeze_attrs(attrs: Mapping[str, AttrValue]) -> tuple[tuple[str, AttrValue], ...]:
    """Attributes as a sorted tuple of pairs, lists turned into tuples, so Ops hash and compare."""
    return tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))


def _freeze(v: AttrValue) -> AttrValue:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True)
class Op:
    """One operation: a canonical TFLite builtin name, tensor indices and parsed attributes.

    An optional input that is absent (TFLite's -1, e.g. a convolution without bias) is -1 here
    too. Use `Op.make` to build one from a dict of attributes.
    """

    type: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()

    @staticmethod
    def make(type: str, inputs: Iterable[int], outputs: Iterable[int], **attrs: AttrValue) -> "Op":
        return Op(type, tuple(inputs), tuple(outputs), freeze_attrs(attrs))

    @cached_property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        return self.attr_dict.get(name, default)

    @property
    def activation(self) -> str:
        """The fused activation ("NONE" when the op has none)."""
        return self.attr_dict.get("activation", "NONE")


@dataclass(frozen=True)
class Graph:
    """A single-subgraph model: tensors, ops in execution order, graph inputs and outputs."""

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str = ""
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    # -- derived views -------------------------------------------------------------------------
    @property
    def producers(self) -> dict[int, int]:
        """Tensor index -> index of the op that writes it (graph inputs and constants have none)."""
        if "producers" not in self._cache:
            if "joined" in self._cache:
                self._join_maps()
            else:
                self._cache["producers"] = {t: i for i, op in enumerate(self.ops)
                                            for t in op.outputs}
        return self._cache["producers"]

    @property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Tensor index -> indices of the ops that read it, in op order (each op once)."""
        if "consumers" not in self._cache and "joined" in self._cache:
            self._join_maps()
        if "consumers" not in self._cache:
            cons: dict[int, list[int]] = {}
            for i, op in enumerate(self.ops):
                for t in dict.fromkeys(op.inputs):
                    if t >= 0:
                        cons.setdefault(t, []).append(i)
            self._cache["consumers"] = {t: tuple(v) for t, v in cons.items()}
        return self._cache["consumers"]

    @property
    def segments(self) -> tuple[tuple[tuple[Op, ...], tuple[Tensor, ...]], ...] | None:
        """How a graph `latpred.pytorch.compose.chain` made is joined (None for other graphs):
        per part in order, its ops (the very Op objects: together they are `ops`) and its
        tensors, whose values (all but the name) `tensors` repeats: the first part's all, each
        next part's all but its input (that is the tensor before them, the previous part's
        output). Deduction and featurization look parts up by identity instead of every op and
        tensor (NAS candidates chained from cached blocks share them). Such a graph's
        `producers` and `consumers` are joined from its parts' maps on first use, and
        `producer` and `consumers_of` read them without joining."""
        return self._cache.get("segments")

    def _join_maps(self) -> None:
        """A chained graph's maps, joined from its parts' (`latpred.pytorch.compose`)."""
        self._cache["consumers"], self._cache["producers"] = self._cache["joined"].maps()

    def producer(self, tensor: int) -> int | None:
        if "producers" not in self._cache and "joined" in self._cache:
            return self._cache["joined"].producer(tensor)   # without joining the whole map
        return self.producers.get(tensor)

    def consumers_of(self, tensor: int) -> tuple[int, ...]:
        if "consumers" not in self._cache and "joined" in self._cache:
            return self._cache["joined"].consumers_of(tensor)
        return self.consumers.get(tensor, ())

    def topological_order(self) -> tuple[int, ...]:
        """Op indices in a dependency order (Kahn's algorithm, ties broken by op index).

        Raises ShapeError if the ops form a cycle or read a tensor nothing produces.
        """
        if "topo" in self._cache:
            return self._cache["topo"]
        import heapq

        available = set(self.inputs) | {i for i, t in enumerate(self.tensors) if t.is_constant}
        missing: dict[int, int] = {}
        waiting: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            need = {t for t in op.inputs if t >= 0 and t not in available}
            missing[i] = len(need)
            for t in need:
                waiting.setdefault(t, []).append(i)
        ready = [i for i, n in missing.items() if n == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for t in self.ops[i].outputs:
                for j in waiting.pop(t, ()):
                    missing[j] -= 1
                    if missing[j] == 0:
                        heapq.heappush(ready, j)
        if len(order) != len(self.ops):
            stuck = sorted(set(range(len(self.ops))) - set(order))
            raise ShapeError(f"Operations {stuck[:5]} depend on tensors that no operation "
                             "produces or on each other in a cycle.")
        self._cache["topo"] = tuple(order)
        return self._cache["topo"]

    # -- convenience ---------------------------------------------------------------------------
    def input_tensor(self, op: Op, k: int = 0) -> Tensor:
        return self.tensors[op.inputs[k]]

    def output_tensor(self, op: Op, k: int = 0) -> Tensor:
        return self.tensors[op.outputs[k]]

    def op_types(self) -> dict[str, int]:
        """How many ops of each type, in first-seen order."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.type] = counts.get(op.type, 0) + 1
        return counts
