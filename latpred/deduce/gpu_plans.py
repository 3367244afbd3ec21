"""What the GPU delegate does with one op, decided once per distinct op and reused across graphs.

Whether the delegate accepts an op (`gpu_support.unsupported_reason`) and how it lowers it (the
kernel type and the rule that decided it, the convolution kernel selection, whether the op can be
linked into its producer) depend on the op (type, attributes) and the tensors it touches (shape,
dtype, constness, kept value) only, never on the rest of the graph. NAS candidates repeat the
same few hundred ops (chained supernet blocks share the very Op and Tensor objects), so
`deduce_gpu` keeps them per Op object (`OpEntry`), valid wherever the op's tensors have the same
values, checked per graph with C-level maps rather than a Python loop per op. A new op is keyed
by value (its type and attributes, its tensors' interned values), so equal ops of other graphs
share one verdict and one plan. Kernels, immutable, are shared too: candidates hold the same
(ops, rule) kernels over and over.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress, repeat
from operator import attrgetter, call, itemgetter, ne
from typing import Any

from latpred.deduce import conv_selection as cs
from latpred.deduce.fusion import GpuNode
from latpred.deduce.gpu_support import unsupported_reason
from latpred.deduce.kernel import Kernel
from latpred.deduce.optypes import bhwc, kernel_type, spatial_zero_pad
from latpred.deduce.rulesets import GpuRuleSet
from latpred.graph import Graph, Op
from latpred.device_profile import GpuSpec

# Entries kept per table before the tables start again: a supernet's chained subnets need tens
# of thousands (one per Op object: a block placed at another offset has new ones); graphs that
# share no objects add their ops and tensors each (tens of MB at the cap).
_CAP = 1 << 16
_ONCE_CAP = 1 << 12  # ops of graphs kept nothing of: a few graphs back is enough
_MISSING = object()


@dataclass(frozen=True, slots=True)
class OpPlan:
    """How the delegate lowers one op it accepts, before the graph's passes and fusion.

    - `type`, `rule`, `linkable`: its kernel (a convolution's: the selected kind and its rule);
    - `shape`: its output as the delegate sees it (BHWC);
    - `reorder`: an ADD/MUL that puts its most recently written input first (the rule set's
      `associative_reorder`, two or more inputs, none broadcast);
    - `zero_pad`: a zero PAD of height/width, merged into the convolution or pooling reading it;
    - `identity_reshape`: a RESHAPE that keeps the BHWC shape, removed when a kernel writes its
      input;
    - `conv`: (geometry, choice) of a convolution that becomes several kernels (Winograd, split
      groups); None otherwise.
    """

    type: str
    rule: str
    linkable: bool
    shape: tuple[int, ...]
    reorder: bool = False
    zero_pad: bool = False
    identity_reshape: bool = False
    conv: tuple[cs.ConvGeom, cs.ConvChoice] | None = None
    plain: bool = field(init=False)  # one node reading the op's inputs as they are (most ops)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", not (self.reorder or self.zero_pad
                                               or self.identity_reshape or self.conv))


@lru_cache(maxsize=16)
def plans_for(rules: GpuRuleSet, gpu: GpuSpec, precision: str) -> "Plans":
    return Plans(rules, gpu, precision)


class OpEntry:
    """One Op object's facts, valid in any graph where its tensors have the same values (the
    interned value ids `sig`, fetched from a graph's by `fetch`): its value key, why the
    delegate rejects it, its runtime inputs and outputs, and its OpPlan once lowered."""

    __slots__ = ("op", "type", "fetch", "sig", "key", "reason", "ins", "outs", "plan")

    def __init__(self, op: Op, fetch: Any, sig: Any, key: tuple, reason: str | None,
                 ins: tuple[int, ...]):
        self.op, self.type, self.fetch, self.sig, self.key = op, op.type, fetch, sig, key
        self.reason, self.ins, self.outs, self.plan = reason, ins, op.outputs, None


class Plans:
    """Op entries, acceptance reasons, OpPlans and Kernels of one rule set and GPU.

    A cache of pure functions of their keys: results are the same with it or without it."""

    def __init__(self, rules: GpuRuleSet, gpu: GpuSpec, precision: str):
        self.rules, self.gpu = rules, gpu
        self.fc_pixels = cs.fc_max_pixels(rules.conv_as_fc, gpu, precision)
        self._clear()

    def _clear(self) -> None:
        self._entries: dict[int, OpEntry] = {}  # id(Op) -> its entry (which keeps the Op alive)
        self._tensor_of: dict[int, int] = {}    # id(Tensor) -> interned value
        self._held: list[Any] = []              # those Tensors, kept alive so no id is reused
        self._once: dict[int, weakref.ref] = {}  # id(Op) -> the Op, of graphs kept nothing of
        # Of chained graphs' parts (`Graph.segments`), each kept with the objects it is for:
        self._part_values: dict[int, tuple] = {}   # id(tensors) -> their values
        self._templates: dict[tuple, tuple] = {}   # (id(tensors), input value) -> entry parts
        self._placed: dict[tuple, tuple] = {}      # (id(ops), input value) -> their entries
        self._tensors: dict[tuple, int] = {}
        self._ops: dict[tuple, int] = {}        # (type, attrs) -> interned kind
        self._reasons: dict[tuple, str | None] = {}
        self._plans: dict[tuple, OpPlan] = {}
        self._kernels: dict[tuple, Kernel] = {}

    def entries(self, graph: Graph) -> list[OpEntry]:
        """Per op, its entry. Ops and Tensors seen before (chained supernet blocks share them)
        are looked up and checked with C-level maps, not a Python loop per op; only new or
        changed ops are worked on.

        Entries are kept only for graphs that share an Op object with an earlier one: a graph
        built anew (a sampled model, a file read) gets its ops' verdicts and plans by value, and
        leaves no objects behind that would only cost memory and garbage collections."""
        if max(len(self._entries), len(self._held), len(self._reasons), len(self._kernels),
               len(self._placed)) > _CAP:
            self._clear()
        if graph.segments is not None:
            return self._chained_entries(graph, graph.segments)
        ops = graph.ops
        entries = list(map(self._entries.get, map(id, ops), repeat(_UNSEEN)))
        if entries.count(_UNSEEN) == len(ops) and not self._recurs(ops):
            tid = self._tensor_values(graph.tensors)
            return [self._entry(graph, op, tid, keep=False) for op in ops]
        tid = self._tensor_ids(graph)
        seen = list(map(call, map(_FETCH, entries), repeat(tid)))
        if seen != list(map(_SIG, entries)):
            for i in compress(range(len(ops)), map(ne, seen, map(_SIG, entries))):
                entries[i] = self._entry(graph, ops[i], tid, keep=True)
        return entries

    def _chained_entries(self, graph: Graph, segments: tuple) -> list[OpEntry]:
        """Entries of a chained graph, part by part (`Graph.segments`). A part's entries depend
        on its ops and the values of its tensors, and those are its own but for its input (the
        previous part's output): a part placed at the same offsets again (the same Op objects)
        with an input of the same value finds its entries with one lookup."""
        tid, inputs = self._segment_values(segments)
        placed, out = self._placed, []
        for (ops, tensors), at in zip(segments, inputs):
            key = (id(ops), tid[at])
            found = placed.get(key)
            if found is None or found[0] is not ops:
                found = placed[key] = (ops, self._part_entries(graph, ops, tensors, at, tid))
            out += found[1]
        return out

    def _part_entries(self, graph: Graph, ops: tuple[Op, ...], tensors: tuple, at: int,
                      tid: list[int]) -> list[OpEntry]:
        """Entries of a part's ops whose input is tensor `at` (its tensor j is at + j). Placed
        at other offsets, with an input of the same value, the part's ops have the same keys
        and verdicts, and their runtime inputs are the same tensors shifted: worked out once
        per part and input value, then shifted."""
        key = (id(tensors), tid[at])
        found = self._templates.get(key)
        if found is None or found[0] is not tensors:
            made = [self._entry(graph, op, tid, keep=False) for op in ops]
            self._templates[key] = (tensors, [(e.key, e.reason, tuple([t - at for t in e.ins]))
                                              for e in made])
            return made
        return [OpEntry(op, None, None, k, why, tuple([t + at for t in ins]))
                for op, (k, why, ins) in zip(ops, found[1])]

    def _segment_values(self, segments: tuple) -> tuple[list[int], list[int]]:
        """`_tensor_values` of a chained graph, joined from its parts' (interned once per
        part), and the index of each part's input tensor."""
        tid: list[int] = []
        inputs = []
        known, values = self._part_values, self._tensors
        for _, tensors in segments:
            found = known.get(id(tensors))
            if found is None or found[0] is not tensors:
                found = known[id(tensors)] = (tensors, [values.setdefault(
                    (t.shape, t.dtype, t.is_constant, t.value), len(values)) for t in tensors])
            inputs.append(len(tid) - 1 if tid else 0)
            tid += found[1][1:] if tid else found[1]
        tid.append(-1)
        return tid, inputs

    def _recurs(self, ops: tuple[Op, ...]) -> bool:
        """Whether an Op object of a graph we kept nothing of comes back (then `ops` are
        noted, weakly, for the next graph to find)."""
        once = self._once
        if any(ref is not None and ref() is op for ref, op in zip(map(once.get, map(id, ops)),
                                                                 ops)):
            return True
        if len(once) > _ONCE_CAP:
            once.clear()
        once.update(zip(map(id, ops), map(weakref.ref, ops)))
        return False

    def _tensor_values(self, tensors: tuple) -> list[int]:
        """Per tensor, an int naming its value as deduction reads it; -1 last (index -1)."""
        values = self._tensors
        ids = [values.setdefault((t.shape, t.dtype, t.is_constant, t.value), len(values))
               for t in tensors]
        ids.append(-1)
        return ids

    def _tensor_ids(self, graph: Graph) -> list[int]:
        """`_tensor_values`, looked up by object identity (kept alive, so no id is reused)."""
        ids = list(map(self._tensor_of.get, map(id, graph.tensors)))
        if None in ids:
            values = self._tensors
            for n, t in enumerate(graph.tensors):
                if ids[n] is None:
                    self._held.append(t)
                    ids[n] = self._tensor_of[id(t)] = values.setdefault(
                        (t.shape, t.dtype, t.is_constant, t.value), len(values))
        ids.append(-1)
        return ids

    def _entry(self, graph: Graph, op: Op, tid: list[int], keep: bool) -> OpEntry:
        kind = self._ops.setdefault((op.type, op.attrs), len(self._ops))
        key = (kind, len(op.inputs), *[tid[t] for t in op.inputs], *[tid[t] for t in op.outputs])
        why = self._reasons.get(key, _MISSING)
        if why is _MISSING:
            why = self._reasons[key] = unsupported_reason(
                graph, op, self.rules.supported, self.rules.spatial_mean_only)
        ins = tuple([t for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant])
        if not keep:
            return OpEntry(op, None, None, key, why, ins)
        refs = [t for t in (*op.inputs, *op.outputs) if t >= 0]
        fetch = itemgetter(*refs) if refs else _no_tensors
        entry = self._entries[id(op)] = OpEntry(op, fetch, fetch(tid), key, why, ins)
        return entry

    def plan(self, graph: Graph, i: int, entry: OpEntry) -> OpPlan:
        """The plan of accepted op `i` (made on first use: only the ops the delegate lowers)."""
        plan = self._plans.get(entry.key)
        if plan is None:
            plan = self._plans[entry.key] = plan_op(graph, graph.ops[i], self.rules, self.gpu,
                                                    self.fc_pixels)
        entry.plan = plan
        return plan

    def kernels(self, nodes: list[GpuNode], entries: list[OpEntry]) -> list[Kernel]:
        """The Kernels of fused nodes, shared with earlier graphs' equal ones: found by the
        node's type, ops, rule and stage, and the types of the ops fused in (which its rule
        text names), without writing the text again."""
        out, known = [], self._kernels
        for n in nodes:
            ops = n.ops
            key = (n.type, ops, n.rule, n.part) if len(ops) == 1 else \
                (n.type, ops, n.rule, n.part, *[entries[i].type for i in ops[1:]])
            k = known.get(key)
            if k is None:
                rule = n.rule
                if len(ops) > 1:
                    fused = ", ".join([f"{entries[i].type}#{i}" for i in ops[1:]])
                    rule = f"{rule}; fused {fused}"
                k = known[key] = Kernel(n.type, ops, "gpu", rule, False, n.part)
            out.append(k)
        return out


def _no_tensors(tensors: Any) -> tuple:
    return ()


# The entry of an Op not seen yet: what it fetches never equals what it holds.
_UNSEEN = OpEntry.__new__(OpEntry)
_UNSEEN.fetch, _UNSEEN.sig = _no_tensors, None
_FETCH, _SIG = attrgetter("fetch"), attrgetter("sig")


def plan_op(graph: Graph, op: Op, rules: GpuRuleSet, gpu: GpuSpec, fc_pixels: int) -> OpPlan:
    """The OpPlan of an op the delegate accepts."""
    g, label = graph, rules.label
    shape = bhwc(g.tensors[op.outputs[0]].shape)
    if op.type == "CONV_2D":
        geom = cs.conv_geom(g, op)
        choice = cs.select_conv(geom, gpu, rules.winograd, label, fc_pixels,
                                rules.grouped_as_depthwise)
        several = choice.kind in ("winograd", "split_groups")
        return OpPlan(choice.kind, choice.rule, False, shape,
                      conv=(geom, choice) if several else None)
    inputs = [t for t in op.inputs if t >= 0 and not g.tensors[t].is_constant]
    reorder = (op.type in ("ADD", "MUL") and rules.associative_reorder and len(inputs) >= 2
               and not _broadcasts(g, inputs, shape))
    ktype = kernel_type(g, op)
    rule = f"{ktype}: {op.type} ({label})"
    if op.type == "AVERAGE_POOL_2D" and _global_pool(g, op):
        ktype, rule = "mean", f"mean: global average pooling runs as a reduce ({label})"
    return OpPlan(ktype, rule, op.type in rules.linkable and len(op.outputs) == 1, shape,
                  reorder, op.type in ("PAD", "PADV2") and spatial_zero_pad(g, op),
                  op.type == "RESHAPE" and bhwc(g.tensors[op.inputs[0]].shape) == shape)


def _broadcasts(graph: Graph, inputs: list[int], shape: tuple[int, ...]) -> bool:
    """Whether an input is broadcast to the output (IsAssociativeLinkableOp then keeps the
    order). Read from the op's own tensors: an input that the delegate's passes replace (a
    removed reshape's) has the same BHWC shape."""
    for t in inputs:
        src = bhwc(graph.tensors[t].shape)
        if any(s == 1 and d != 1 for s, d in zip(src, shape)):
            return True
    return False


def _global_pool(graph: Graph, op: Op) -> bool:
    """IsGlobalPooling: the window covers the whole input and the output is 1x1."""
    _, h, w, _ = graph.tensors[op.inputs[0]].shape
    _, oh, ow, _ = graph.tensors[op.outputs[0]].shape
    return (oh, ow) == (1, 1) and tuple(op.attr("filter", (0, 0))) == (h, w)
