"""The `pytorch-cuda` runtime (targets `h100/cuda/fp16`, `h100/cuda/fp32/b32`, ...): the peak
`torch.cuda.max_memory_allocated` of loading the module `latpred.pytorch.to_torch` builds and
running one inference under `torch.no_grad()`, as `latpred.profile.cuda.prepare` does.

The requests, in order, come from `torch_plan` (load, then the forward); `cuda_alloc` replays
them through PyTorch's caching allocator (512-byte blocks, small/large pools, splitting;
`batch_peaks`, for `memory_totals`, replays a whole batch in `compiled_cuda_alloc`); the
process starts in the state measured on the device (`cuda_workspace.PROCESS_START`: the cuBLAS
and cuBLASLt workspaces a first matmul leaves, 32 MiB + 1 MiB); cuDNN's convolution workspaces
and the reductions' scratch are the sizes measured on the H100 for known shapes and learned
for others (`cuda_workspace`).

The breakdown (`MemoryPrediction`), at the moment of the peak: `model_bytes` the weight
blocks (`weights_stored` their unrounded bytes), `arena` the activations (inputs, op outputs,
temporaries such as max-pool indices and padded inputs), `workspace` cuDNN workspaces and
reduction scratch live then plus the persistent cuBLAS/cuBLASLt workspaces; `total` is the
predicted max_memory_allocated, `reserved` the predicted max_memory_reserved.
"""

from __future__ import annotations

import numpy as np

from latpred.graph import Graph
from latpred.memory.cuda_alloc import CachingAllocator
from latpred.memory.prediction import MemoryPrediction, OpMemory
from latpred.memory.torch_plan import Event, forward_events, load_events

_ELEM = {"fp16": 2, "fp32": 4}
_WORKSPACE_KINDS = ("workspace", "scratch")


class _Replay:
    """The allocator plus the bytes in use per kind of request."""

    def __init__(self, alloc: CachingAllocator):
        self.alloc = alloc
        self.blocks: dict[int, tuple] = {}
        self.by_kind: dict[str, int] = {}

    def run(self, events, on_step=None) -> None:
        for e in events:
            if e.action == "alloc":
                b = self.alloc.malloc(e.nbytes)
                self.blocks[e.storage] = (b, e.what)
                self.by_kind[e.what] = self.by_kind.get(e.what, 0) + b.size
            else:
                b, what = self.blocks.pop(e.storage)
                self.by_kind[what] -= b.size
                self.alloc.free(b)
            if on_step is not None:
                on_step(e)


def simulate(graph: Graph, precision: str, batch: int = 1, workspace=None, scratch=None,
             warm: bool = False) -> dict:
    """Replay load + one forward (`warm`: a second forward after the first's output is
    dropped, as a steady-state inference). Returns the figures and per-op rows."""
    from latpred.memory import cuda_workspace
    from latpred.pytorch.batch import with_batch

    g = with_batch(graph, batch)
    elem = _ELEM[precision]
    ws = workspace or cuda_workspace.conv_workspace
    sc = scratch or cuda_workspace.mean_scratch
    alloc = cuda_workspace.process_start()
    base = alloc.allocated.current
    rp = _Replay(alloc)
    load = load_events(g, elem)
    rp.run(load)
    loaded = alloc.allocated.current
    n_ops = len(g.ops)
    first = len(load)
    if warm:
        fwd = forward_events(g, elem, ws, sc, first)
        rp.run(fwd)
        out_ids = [e.storage for e in fwd if e.action == "alloc" and e.storage in rp.blocks
                   and e.what == "output"]
        rp.run([Event("free", s, 0, n_ops, "output") for s in out_ids])   # `del out`
        first += len(fwd)
    alloc.reset_peak()
    fwd = forward_events(g, elem, ws, sc, first)
    state = {"peak": alloc.allocated.current, "kinds": dict(rp.by_kind), "op": -1}
    per_op = {}

    def step(e):
        if e.op >= n_ops:
            return
        cur = alloc.allocated.current
        row = per_op.setdefault(e.op, {"max": 0, "ws": 0, "temp": 0})
        row["max"] = max(row["max"], cur)
        if e.action == "alloc" and e.what in _WORKSPACE_KINDS:
            row["ws"] = max(row["ws"], rp.blocks[e.storage][0].size)
        if e.action == "alloc" and e.what == "temp":
            row["temp"] += rp.blocks[e.storage][0].size
        row["after"] = cur
        if cur > state["peak"]:
            state.update(peak=cur, kinds=dict(rp.by_kind), op=e.op)

    rp.run([e for e in fwd if e.op < n_ops], step)
    peak_reserved = alloc.reserved.peak
    out_bytes = {}
    for e in fwd:
        if e.action == "alloc" and e.what == "output":
            out_bytes[e.op] = out_bytes.get(e.op, 0) + e.nbytes
    return {"graph": g, "elem": elem, "base": base, "loaded": loaded, "peak": state["peak"],
            "peak_op": state["op"], "kinds": state["kinds"], "reserved": peak_reserved,
            "per_op": per_op, "out_bytes": out_bytes}


def batch_peaks(graphs, precision: str, batch: int = 1, tensors=None, kernels=None
                ) -> np.ndarray:
    """`simulate(graph, precision, batch)["peak"]` of each graph, without the per-kind and
    per-op figures (`memory_totals`): the same requests (`cuda_requests`, each op's worked
    out once per configuration), replayed for the whole batch by the compiled allocator
    (`compiled_cuda_alloc`). `tensors`: the latency pass's `predictors.batch.FeatureBatch` of
    these graphs, whose interned tensors spare describing them again."""
    from latpred.memory.compiled_cuda_alloc import batch_peaks as replay
    from latpred.memory.cuda_requests import batch_requests

    return replay(*batch_requests(graphs, _ELEM[precision], batch, tensors, kernels))


def predict_cuda(graph: Graph, target) -> MemoryPrediction:
    """`predict_memory` for a CUDA target (see the module docstring)."""
    sim = simulate(graph, target.precision, target.batch)
    g, elem = sim["graph"], sim["elem"]
    kinds = sim["kinds"]
    weights_raw = sum(e.nbytes for e in load_events(g, elem) if e.what == "weight")
    persistent = sim["base"]
    workspace = sum(kinds.get(k, 0) for k in _WORKSPACE_KINDS) + persistent
    weights = kinds.get("weight", 0)
    arena = sim["peak"] - persistent - weights - (workspace - persistent)
    weight_of = {}
    for k, op in enumerate(g.ops):
        weight_of[k] = sum(g.tensors[i].size * elem for i in op.inputs
                           if i >= 0 and g.tensors[i].is_constant)
    rows = []
    for k, op in enumerate(g.ops):
        r = sim["per_op"].get(k, {"max": 0, "ws": 0, "temp": 0, "after": 0})
        after = r.get("after", rows[-1].arena_live if rows else sim["loaded"])
        rows.append(OpMemory(
            index=k, type=op.type, runs_on="cuda", output_bytes=sim["out_bytes"].get(k, 0),
            weight_bytes=weight_of[k], arena_live=after - weights - persistent,
            arena_extent=max(r["max"], after) - weights - persistent,
            temporaries=r["temp"], workspace_extent=r["ws"],
            sets_peak=k == sim["peak_op"]))
    return MemoryPrediction(
        target=str(target), kernels="pytorch-cuda", weights_stored=weights_raw,
        model_bytes=weights, weights_packed=0, arena=arena, persistent_arena=0,
        workspace=workspace, indirection=0, overhead=0, transient=0,
        peak_op=sim["peak_op"], ops=tuple(rows), reserved=sim["reserved"])
