"""What TFLite's Prepare decides before a model runs: each tensor's allocation type, and the ops
after which a tensor's shape is known only at run time.

Both the memory planners (which tensors live in the arena) and the GPU path (whether a delegate
is applied at all) need it. LiteRT tag v2.2.0 (= f67457790), which the ai-edge-litert 2.3.0
wheel's TFLite runtime is built from; tflite/kernels/:

- A tensor with a buffer is kTfLiteMmapRo. SHAPE's output is always kTfLitePersistentRo
  (shape.cc:66); STRIDED_SLICE (strided_slice.cc:335), GATHER (gather.cc:139), CONCATENATION
  (concatenation.cc:250) and MUL (mul.cc:131) compute at Prepare into a kTfLitePersistentRo
  output when their inputs are constant or persistent; RESHAPE copies a constant-or-persistent
  input the same way (reshape.cc:136), and with a shape computed at run time returns
  kTfLiteOutputShapeNotKnown (reshape.cc:147); STRIDED_SLICE with run-time bounds makes its
  output dynamic (kTfLiteDynamic). REDUCE_PROD of known data into at most 8 elements runs in
  Prepare too (reduce.cc:402).
- tflite/core/subgraph.cc `PrepareOpsStartingAt`: Prepare stops after a node with a dynamic
  output or one that returned kTfLiteOutputShapeNotKnown, and the graph then "has dynamic
  tensors" (`has_dynamic_tensors_`).
"""

from __future__ import annotations

from typing import Sequence

from latpred.graph import Graph, Op

# Allocation types (TfLiteAllocationType) the planners distinguish.
ARENA, PERSISTENT_ARENA, MMAP, PERSISTENT_RO, DYNAMIC = \
    "arena", "persistent_arena", "mmap", "persistent_ro", "dynamic"
KNOWN = (MMAP, PERSISTENT_RO)      # data known at Prepare

PREPARE_FOLDS = frozenset({"STRIDED_SLICE", "GATHER", "CONCATENATION", "MUL", "RESHAPE"})
REDUCE = frozenset({"MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY",
                    "REDUCE_ALL"})
# Ops whose Prepare may change an output's allocation type or end a prepared chunk.
KIND_SETTERS = PREPARE_FOLDS | {"SHAPE", "REDUCE_PROD"}


def tensor_kinds(graph: Graph, constant: Sequence[bool]
                 ) -> tuple[dict[int, str], set[int], bool]:
    """Each tensor's allocation type after Prepare, the ops that end a prepared chunk (their
    outputs get a shape at run time), and whether Prepare changed a type (else each is the
    reader's: mmap for a tensor the model stores, `constant[t]`, arena for the others)."""
    kinds = dict(enumerate([MMAP if c else ARENA for c in constant]))
    stops: set[int] = set()
    changed = False

    def known(t: int) -> bool:
        return t < 0 or kinds[t] in KNOWN

    for i, op in enumerate(graph.ops):
        if op.type not in KIND_SETTERS:
            continue
        kind = None
        if op.type == "SHAPE":
            kind = PERSISTENT_RO
        elif op.type == "RESHAPE":
            shape_known = len(op.inputs) < 2 or known(op.inputs[1])
            if not shape_known:
                stops.add(i)
            elif known(op.inputs[0]):
                kind = PERSISTENT_RO
        elif op.type == "STRIDED_SLICE":
            if not all_known(kinds, op.inputs[1:4]):
                kind = DYNAMIC
                stops.add(i)
            elif all_known(kinds, op.inputs):
                kind = PERSISTENT_RO
        elif op.type in PREPARE_FOLDS:
            # (all known first: the test that fails fast on an activation input)
            if all_known(kinds, op.inputs) and any(t >= 0 for t in op.inputs):
                kind = PERSISTENT_RO
        elif reduce_noop(graph, op, known):
            kind = PERSISTENT_RO
        if kind is not None:
            kinds[op.outputs[0] if op.outputs else -1] = kind
            changed = True
    return kinds, stops, changed


def all_known(kinds: dict[int, str], tensors) -> bool:
    """Whether every present tensor of `tensors` has its data at Prepare."""
    for t in tensors:
        if t >= 0 and kinds[t] not in KNOWN:
            return False
    return True


def reduce_noop(graph: Graph, op: Op, known) -> bool:
    """REDUCE_PROD of a constant-or-persistent input and axis into at most 8 elements runs in
    Prepare into a kTfLitePersistentRo output (reduce.cc:402, kMaxConstantOutputTensorSize,
    `PrepareProd` :559); MEAN/SUM keep an arena output."""
    return (op.type == "REDUCE_PROD" and known(op.inputs[0]) and known(op.inputs[1])
            and graph.tensors[op.outputs[0]].size <= 8)


def first_run_time_shape(graph: Graph) -> int | None:
    """The first op (in execution order) after which TFLite's Prepare stops because an output's
    shape is known only at run time, or None when every shape is known before the model runs:
    TFLiteConverter's dynamic-batch idiom (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE) is the
    common case."""
    if not any(_reads_a_computed_shape(graph, op) for op in graph.ops):
        return None   # a NAS loop's usual graph: nothing can end a chunk
    _, stops, _ = tensor_kinds(graph, [t.is_constant for t in graph.tensors])
    return min(stops, default=None)


def _reads_a_computed_shape(graph: Graph, op: Op) -> bool:
    """Whether `op` is one of the two that can end a chunk (`tensor_kinds`) and reads its
    shape or bounds from a tensor the model does not store (a cheap necessary condition)."""
    if op.type == "RESHAPE":
        shape = op.inputs[1] if len(op.inputs) > 1 else -1
        return shape >= 0 and not graph.tensors[shape].is_constant
    if op.type == "STRIDED_SLICE":
        return any(t >= 0 and not graph.tensors[t].is_constant for t in op.inputs[1:4])
    return False
