"""LiteRT's ArenaPlanner on a latpred Graph: lifetimes, in-place sharing, temporaries, chunks.

Sources: google-ai-edge/LiteRT tag v2.2.0 (= f67457790 for every file cited here), which the
ai-edge-litert 2.3.0 wheel's TFLite runtime is built from.

- tflite/arena_planner.cc `PlanAllocations`: graph outputs get one extra reference (never
  freed); graph inputs one extra reference and are allocated at node 0; a node's outputs are
  allocated at that node; an input is freed at the node that drops its last reference.
- `IdentifyInPlaceTensors` / `InputTensorCanBeShared`: an op whose registration has
  `inplace_operator` flags may write its output 0 into one of its first three inputs
  (kTfLiteMaxSharableOpInputs) when neither is a graph input/output, the input lives in the
  arena (or has the output's allocation type), and, unless the op leaves data unmodified,
  both have the same byte size > 4 (kScalarTensorBytes) and the input (and its root) has one
  reference. Shared tensors are reference-counted on their root.
- Flags (tflite/kernels/*.cc registrations): ADD, SUB, MUL, DIV: Input0|Input1 shared
  (add.cc:459, sub.cc:498, mul.cc:401, div.cc:331); SOFTMAX: Input0 (activations.cc:1835);
  RESHAPE, SQUEEZE, EXPAND_DIMS, BITCAST: Input0 + DataUnmodified (reshape.cc:239,
  squeeze.cc:122, expand_dims.cc:141, bitcast.cc:112).
- `ExecuteAllocations`: temporaries live at their node only; tflite/core/subgraph.cc
  `PrepareOpsStartingAt` stops after a node with a dynamic output or one whose Prepare
  returned kTfLiteOutputShapeNotKnown, and the arena is planned chunk by chunk (the rest at
  Invoke), which `plan` reproduces.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from latpred.deduce.prepare import ARENA, PERSISTENT_ARENA
from latpred.memory.arena import NEVER, Alloc, SimpleArena, allocation_order

# inplace_operator flags (tflite/core/c/common.h:1173)
DATA_UNMODIFIED, INPUT0, INPUT1 = 1, 4, 8
MAX_SHARABLE_INPUTS = 3        # kTfLiteMaxSharableOpInputs
SCALAR_BYTES = 4               # arena_planner.cc kScalarTensorBytes
INPLACE = {"ADD": INPUT0 | INPUT1, "SUB": INPUT0 | INPUT1, "MUL": INPUT0 | INPUT1,
           "DIV": INPUT0 | INPUT1, "SOFTMAX": INPUT0,
           "RESHAPE": INPUT0 | DATA_UNMODIFIED, "SQUEEZE": INPUT0 | DATA_UNMODIFIED,
           "EXPAND_DIMS": INPUT0 | DATA_UNMODIFIED, "BITCAST": INPUT0 | DATA_UNMODIFIED}



class PlanNode(NamedTuple):
    """One node of the execution plan: a builtin op, or a delegate kernel standing for several.

    `ops`: the graph op indices it runs; `ends_chunk`: Prepare stops after it (dynamic output).
    (A NamedTuple: a NAS loop builds thousands a second, and a frozen dataclass is slower to
    build.)
    """

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    ops: tuple[int, ...]
    label: str
    temporaries: tuple[int, ...] = ()
    inplace: int = 0
    ends_chunk: bool = False


@dataclass(frozen=True)
class PlanInput:
    """What the planner sees: nodes in execution order, byte sizes and allocation types.

    `kinds`: each tensor's allocation type once its node is prepared; `plan_kinds`: at
    `PlanAllocations` time, when only the first chunk's nodes have been prepared.
    `names`: labels of the temporaries (tensor ids past the graph's).
    """

    nodes: tuple[PlanNode, ...]
    sizes: dict[int, int]
    kinds: dict[int, str]
    plan_kinds: dict[int, str]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    names: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ArenaPlan:
    """The arena as LiteRT plans it.

    `arena_bytes`: the kTfLiteArenaRw high-water mark (the buffer size); `persistent_bytes`:
    the kTfLiteArenaRwPersistent arena's. `node_extent[i]`: the highest byte in use while node
    i runs (max end of the allocations live at i); `node_live[i]`: the bytes live at node i.
    `shared`: in-place outputs -> the tensor whose buffer they use. `marks`: the arena's size
    after each prepared chunk (it grows at Invoke when later chunks need more).
    """

    arena_bytes: int
    persistent_bytes: int
    allocs: tuple[Alloc, ...]
    persistent: tuple[Alloc, ...]
    shared: dict[int, int]
    node_extent: tuple[int, ...]
    node_live: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    marks: tuple[int, ...] = ()

    @property
    def peak_node(self) -> int:
        """The first node at which the arena reaches its high-water mark (-1: empty arena)."""
        for i, extent in enumerate(self.node_extent):
            if extent == self.arena_bytes and extent > 0:
                return i
        return -1


def _find(shared: dict[int, int], t: int) -> int:
    return shared.get(t, t)


def _in_place(p: PlanInput, refs: list[int] | dict[int, int]) -> dict[int, int]:
    """`IdentifyInPlaceTensors` with the full reference counts `refs`."""
    shared: dict[int, int] = {}
    inputs, outputs = set(p.inputs), set(p.outputs)
    for node in p.nodes:
        if not node.inplace or not node.outputs:
            continue
        changed = not node.inplace & DATA_UNMODIFIED
        out = node.outputs[0]
        chosen = -1
        for k, t in enumerate(node.inputs[:MAX_SHARABLE_INPUTS]):
            if t < 0 or not node.inplace & (INPUT0 << k):
                continue
            if changed and (p.sizes[t] != p.sizes[out] or p.sizes[t] <= SCALAR_BYTES
                            or refs[t] > 1):
                continue
            if t in inputs or out in outputs:
                continue
            kin, kout = p.plan_kinds[t], p.plan_kinds[out]
            if kin != kout and kin != ARENA:
                continue
            chosen = t
            break
        if chosen < 0:
            continue
        root = _find(shared, chosen)
        if changed and refs[root] > 1:
            continue
        shared[out] = root
    return shared


def plan(p: PlanInput, stats: bool = True) -> ArenaPlan:
    """`PlanAllocations`, then `ExecuteAllocations` chunk by chunk (`stats`: also the per-node
    extent and live bytes, which a NAS loop that wants the total can skip)."""
    # graph outputs and inputs hold one extra reference each: they are never freed
    base: dict[int, int] = {}
    for t in (*p.outputs, *p.inputs):
        base[t] = base.get(t, 0) + 1
    shared = _in_place(p, _references(p, base)) if any(n.inplace for n in p.nodes) else {}
    alloc_node = {t: i for i in range(len(p.nodes) - 1, -1, -1) for t in p.nodes[i].outputs}
    alloc_node.update(dict.fromkeys(p.inputs, 0))    # allocated where first written
    dealloc_node = _dealloc_nodes(p, base, shared, alloc_node)
    node_tensors: list[list[int]] = [[] for _ in p.nodes] or [[]]
    node_tensors[0].extend(t for t in p.inputs)
    for i, node in enumerate(p.nodes):
        node_tensors[i].extend(node.outputs)
        for t in node.temporaries:
            alloc_node[t] = dealloc_node[t] = i
            node_tensors[i].append(t)

    arena, persistent = SimpleArena(), SimpleArena()
    allocs: dict[int, Alloc] = {}
    pallocs: dict[int, Alloc] = {}
    chunks = _chunks(p.nodes)
    marks: list[int] = []
    for c, (lo, hi) in enumerate(chunks):
        if c:
            marks.append(arena.high_water_mark)
        todo = [t for i in range(lo, hi + 1) for t in node_tensors[i]]
        todo = [t for t in todo if p.kinds.get(t) in (ARENA, PERSISTENT_ARENA)
                and p.sizes[t] > 0 and t not in allocs]
        if not todo:
            continue
        if c == 0:
            arena.reset()
        else:
            arena.purge_before(lo)
        last = {t: dealloc_node.get(t, NEVER) for t in todo}
        for t in _order(todo, lo, hi, node_tensors, p.sizes, alloc_node, last):
            root = shared.get(t)
            if root is not None and p.kinds.get(root) == ARENA and p.sizes[root] == p.sizes[t]:
                continue
            if p.kinds[t] == ARENA:
                allocs[t] = arena.allocate(t, p.sizes[t], alloc_node[t], last[t])
            elif t not in pallocs:
                pallocs[t] = persistent.allocate(t, p.sizes[t], alloc_node[t], NEVER)
    extent, live = [], []
    for i in range(len(p.nodes) if stats else 0):
        here = [a for a in allocs.values() if a.first <= i <= a.last]
        extent.append(max((a.end for a in here), default=0))
        live.append(sum(a.size for a in here))
    return ArenaPlan(arena.high_water_mark, persistent.high_water_mark,
                     tuple(allocs.values()), tuple(pallocs.values()), shared, tuple(extent),
                     tuple(live), tuple(chunks), tuple(marks) + (arena.high_water_mark,))


def _references(p: PlanInput, base: dict[int, int]) -> Counter:
    """Each tensor's reference count: `base` plus one per node input (-1, an absent optional
    input, is counted too and never asked for). Counter.update counts in C: an XNNPACK node
    reads every weight of its partition."""
    refs = Counter(base)
    for node in p.nodes:
        refs.update(node.inputs)
    return refs


def _dealloc_nodes(p: PlanInput, base: dict[int, int], shared: dict[int, int],
                   alloc_node: dict[int, int]) -> dict[int, int]:
    """The node at which each tensor's count of references (on its root, for shared ones) drops
    to zero: its root's last reference, when it holds no extra reference (graph inputs and
    outputs) and was allocated by then."""
    if shared:
        last = {shared.get(t, t): i for i, node in enumerate(p.nodes) for t in node.inputs}
    else:
        last = {t: i for i, node in enumerate(p.nodes) for t in node.inputs}
    freed = {}
    for t, first in alloc_node.items():
        i = last.get(t, -1)
        if i >= first and not base.get(t):
            freed[t] = i
    return freed


def _order(todo: list[int], lo: int, hi: int, node_tensors: list[list[int]],
           sizes: dict[int, int], first: dict[int, int], last: dict[int, int]) -> list[int]:
    """`CreateTensorAllocationVector`'s order. Without ties (equal size and allocation node)
    any correct sort gives it; with ties, libstdc++'s: each node's `unordered_set` iteration
    order, concatenated (`GetTensorsToAllocate`), then `std::sort` (`stdsort.py`)."""
    order = allocation_order(todo, sizes, first, last)
    keys = [(sizes[t], first[t]) for t in order if not (first[t] == 0 and last[t] == NEVER)]
    if len(set(keys)) == len(keys):
        return order
    from latpred.memory.stdsort import std_sort, unordered_set_order

    wanted = set(todo)
    seq = [t for i in range(lo, hi + 1) for t in unordered_set_order(node_tensors[i])
           if t in wanted]

    def whole(t: int) -> bool:
        return first[t] == 0 and last[t] == NEVER

    if len(seq) <= 16:
        # std::sort of 16 elements or fewer is one insertion sort, which is stable: the same
        # order as a stable sort by `less`'s key (ties keep their place)
        return sorted(seq, key=lambda t: (0, t, 0) if whole(t) else (1, -sizes[t], first[t]))

    def less(a: int, b: int) -> bool:
        if whole(a):
            return a < b if whole(b) else True
        if whole(b):
            return False
        if sizes[a] != sizes[b]:
            return sizes[a] > sizes[b]
        return first[a] < first[b]

    return std_sort(seq, less)


def _chunks(nodes: tuple[PlanNode, ...]) -> list[tuple[int, int]]:
    """Node ranges `PrepareOpsStartingAt` prepares (and the arena plans) at a time."""
    out, start = [], 0
    for i, node in enumerate(nodes):
        if node.ends_chunk or i == len(nodes) - 1:
            out.append((start, i))
            start = i + 1
    return out or [(0, 0)]
