"""What `predict_memory` returns: Augur's breakdown (parameters, intermediate data, workspace,
section 4.2 of the paper) in the runtime's own terms, and one row per op."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpMemory:
    """One graph op as the runtime holds it.

    `runs_on`: "xnnpack" or "builtin". `output_bytes`: its outputs' sizes. `arena_live`:
    TFLite arena bytes live while it runs (for a delegated op: while its partition runs);
    `arena_extent`: the highest arena byte in use then. `workspace_extent`: for an op XNNPACK
    runs, the highest byte of its partition's workspace plan in use while it runs.
    `sets_peak`: activation memory (arena extent + workspace extent) is highest here (the
    first such op). `packed_weights`, `indirection`: XNNPACK's per-op buffers;
    `temporaries`: TFLite kernel temporaries (im2col, reduce scratch) in the arena.
    """

    index: int
    type: str
    runs_on: str
    output_bytes: int
    weight_bytes: int
    arena_live: int
    arena_extent: int
    packed_weights: int = 0
    indirection: int = 0
    temporaries: int = 0
    workspace_extent: int = 0
    sets_peak: bool = False


@dataclass(frozen=True)
class MemoryPrediction:
    """Peak memory of one model on one target, in bytes.

    `weights_stored`: constant tensors as the model stores them (the runtime keeps the model
    buffer); `model_bytes`: the whole model buffer (weights plus the flatbuffer around them,
    estimated from the graph unless the file was given); `weights_packed`: XNNPACK's repacked
    copies; `arena`: TFLite's activation arena (kTfLiteArenaRw high-water mark, exact as
    the planner computes it); `persistent_arena`: kTfLiteArenaRwPersistent; `workspace`:
    XNNPACK's shared workspace for activations inside delegated partitions; `indirection`:
    XNNPACK's per-operator indirection buffers; `overhead`: per-op and per-tensor runtime
    structures and `transient` the resident leftovers of buffers the runtime outgrew while
    setting up (both fitted, see `latpred/memory/host_cpu.py`).
    `total` is their sum: everything is allocated before the first run and held.
    On a CUDA target (latpred/memory/cuda.py) the fields mean, at the moment of the peak:
    `model_bytes` the weight blocks, `arena` the activations, `workspace` cuDNN workspaces and
    reduction scratch plus the persistent cuBLAS workspaces; `total` is the predicted
    max_memory_allocated and `reserved` max_memory_reserved.
    On LiteRT's GPU accelerator (latpred/memory/gpu_delegate.py): `arena` the delegate's
    intermediate buffers, `persistent_arena` its constant tensors (both as the accelerator
    reports them), `weights_packed` the kernels' own weights (estimated).
    """

    target: str
    kernels: str
    weights_stored: int
    model_bytes: int
    weights_packed: int
    arena: int
    persistent_arena: int
    workspace: int
    indirection: int
    overhead: int
    transient: int
    peak_op: int
    ops: tuple[OpMemory, ...]
    reserved: int = 0      # CUDA: the predicted max_memory_reserved (segments); 0 elsewhere

    @property
    def total(self) -> int:
        return (self.model_bytes + self.weights_packed + self.arena + self.persistent_arena
                + self.workspace + self.indirection + self.overhead + self.transient)

    @property
    def activations(self) -> int:
        """Augur's "intermediate data": the TFLite arena plus XNNPACK's workspace."""
        return self.arena + self.workspace

    def breakdown(self) -> dict[str, int]:
        return {"model_bytes": self.model_bytes, "weights_stored": self.weights_stored,
                "weights_packed": self.weights_packed, "arena": self.arena,
                "persistent_arena": self.persistent_arena, "workspace": self.workspace,
                "indirection": self.indirection, "overhead": self.overhead,
                "transient": self.transient,
                "total": self.total}
