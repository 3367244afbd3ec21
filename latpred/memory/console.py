"""Printing memory predictions (`latpred inspect --memory`, `latpred predict --memory`)."""

from __future__ import annotations

from typing import Any

from latpred.graph import Graph
from latpred.memory.prediction import MemoryPrediction


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def memory_report(pred: MemoryPrediction) -> dict[str, Any]:
    """JSON-ready: the breakdown, the op that sets the arena's peak, one row per op."""
    return {"target": pred.target, "kernels": pred.kernels, "breakdown": pred.breakdown(),
            "peak_op": pred.peak_op, "reserved": pred.reserved,
            "ops": [{"index": r.index, "type": r.type, "runs_on": r.runs_on,
                     "output_bytes": r.output_bytes, "weight_bytes": r.weight_bytes,
                     "arena_live": r.arena_live, "arena_extent": r.arena_extent,
                     "packed_weights": r.packed_weights, "indirection": r.indirection,
                     "temporaries": r.temporaries, "workspace_extent": r.workspace_extent,
                     "sets_peak": r.sets_peak}
                    for r in pred.ops]}


def print_memory(name: str, pred: MemoryPrediction, graph: Graph | None = None,
                 per_op: bool = True) -> None:
    """The breakdown and, with `per_op`, the per-op table (the peak op marked)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    b = pred.breakdown()
    if pred.kernels == "pytorch-cuda":
        _print_cuda(console, name, pred, per_op)
        return
    console.print(f"[bold]{name}[/bold] on {pred.target} ({pred.kernels}): peak "
                  f"{_mb(pred.total)} MB = model {_mb(b['model_bytes'])} (weights "
                  f"{_mb(b['weights_stored'])}) + packed weights {_mb(b['weights_packed'])} + "
                  f"arena {_mb(b['arena'])} + workspace {_mb(b['workspace'])} + indirection "
                  f"{_mb(b['indirection'])} + persistent {_mb(b['persistent_arena'])} + "
                  f"overhead {_mb(b['overhead'])}")
    if pred.peak_op >= 0:
        op = pred.ops[pred.peak_op]
        console.print(f"Activation memory peaks at op {op.index} ({op.type}): arena "
                      f"{_mb(op.arena_extent)} MB + workspace {_mb(op.workspace_extent)} MB.")
    if not per_op:
        return
    table = Table(title=f"memory per op ({pred.kernels})")
    for col in ("#", "op", "runs on", "out KB", "arena live KB", "arena extent KB",
                "workspace KB", "packed KB", "indir. KB", "temp KB", "peak"):
        table.add_column(col, justify="left" if col in ("op", "runs on") else "right")
    for r in pred.ops:
        table.add_row(str(r.index), r.type, r.runs_on, f"{r.output_bytes / 1e3:.1f}",
                      f"{r.arena_live / 1e3:.1f}", f"{r.arena_extent / 1e3:.1f}",
                      f"{r.workspace_extent / 1e3:.1f}", f"{r.packed_weights / 1e3:.1f}", f"{r.indirection / 1e3:.1f}",
                      f"{r.temporaries / 1e3:.1f}", "<- peak" if r.sets_peak else "")
    console.print(table)


def _print_cuda(console, name: str, pred: MemoryPrediction, per_op: bool) -> None:
    """A CUDA target: max_memory_allocated's parts at the peak and the allocator per op."""
    from rich.table import Table

    console.print(f"[bold]{name}[/bold] on {pred.target} (PyTorch caching allocator): peak "
                  f"allocated {_mb(pred.total)} MB = weights {_mb(pred.model_bytes)} + "
                  f"activations {_mb(pred.arena)} + workspace {_mb(pred.workspace)} "
                  f"(cuBLAS/cuBLASLt and cuDNN); reserved {_mb(pred.reserved)} MB")
    if pred.peak_op >= 0:
        op = pred.ops[pred.peak_op]
        console.print(f"The peak is reached in op {op.index} ({op.type}): activations "
                      f"{_mb(op.arena_extent)} MB, its workspace {_mb(op.workspace_extent)} MB.")
    if not per_op:
        return
    table = Table(title="CUDA memory per op (activations above weights and workspaces)")
    for col in ("#", "op", "out KB", "live after KB", "highest in op KB", "workspace KB",
                "temp KB", "peak"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for r in pred.ops:
        table.add_row(str(r.index), r.type, f"{r.output_bytes / 1e3:.1f}",
                      f"{r.arena_live / 1e3:.1f}", f"{r.arena_extent / 1e3:.1f}",
                      f"{r.workspace_extent / 1e3:.1f}", f"{r.temporaries / 1e3:.1f}",
                      "<- peak" if r.sets_peak else "")
    console.print(table)
