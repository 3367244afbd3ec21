"""Import TFLite `benchmark_model` op-profiling output (phones) into a Dataset.

Rows of the profile's "Run Order" table are mapped to the model's kernels (`deduce` for the
target): an operator row ("[outputs]:<node index>", or in older tools its position) to the
kernel holding that operation, checking that the operation types agree; the rows a delegate
adds for its own kernels ("Delegate/<kernel>:<k>": XNNPACK operators, GPU dispatches) in run
order to the kernels no operator row covers. Counts that do not agree are an error, never a
guess, except for XNNPACK operators: XNNPACK adds operators of its own (a "Static Reshape" after
a MEAN) and drops some (a 1x1 stride-1 pool), so when they are not one per kernel they are
aligned with the ops by type, as the in-context profiler's are (`op_attribution`). The tool prints averages, so `latency_ms` of an imported kernel is its average over the
profiled runs and its IQR and minimum are NaN; the model's latency is the regular run's median
when the tool printed one (newer versions), its average otherwise.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from latpred.deduce.kernel import Kernel
from latpred.graph import Graph
from latpred.profile.benchmark_parse import (BenchmarkOutputError, BenchmarkReport, NodeRow,
                                             parse_benchmark_output)
from latpred.profile.kernels import kernel_plans, kernel_row
from latpred.profile.op_attribution import _XNNPACK_OPS
from latpred.profile.runner import load_entry, open_dataset

_NODE_INDEX = re.compile(r"^\[.*\]:(\d+)$", re.S)


@dataclass(frozen=True)
class ImportReport:
    """What an import stored."""

    model_id: str
    target: str
    kernels: int
    latency_ms: float
    profiled_runs: int


def builtin_op_names() -> frozenset[str]:
    """TFLite's builtin operator names (from the schema LiteRT ships)."""
    from ai_edge_litert import schema_py_generated as fb

    return frozenset(k for k in vars(fb.BuiltinOperator) if not k.startswith("_"))


def read_outputs(paths: Sequence[str | os.PathLike]) -> BenchmarkReport:
    """Parse one or more output files of one run (the log and/or the CSV) into one report.

    Node rows come from the last file that has them, so pass the CSV after the log to use its
    extra digits; end-to-end figures are merged from all files.
    """
    if not paths:
        raise BenchmarkOutputError("Give at least one benchmark_model output file.")
    reports = []
    for path in paths:
        p = Path(path)
        try:
            text = p.read_text(errors="replace")
        except OSError as err:
            raise BenchmarkOutputError(f"Cannot read {p}: {err.strerror}.") from None
        reports.append(parse_benchmark_output(text, source=str(p)))
    e2e: dict[str, float] = {}
    for r in reports:
        e2e.update(r.e2e)
    last = reports[-1]
    runs = next((r.profiled_runs for r in reversed(reports) if r.profiled_runs), None)
    return BenchmarkReport(last.run_order, last.by_type, runs, e2e)


def map_rows(report: BenchmarkReport, graph: Graph, kernels: Sequence[Kernel],
             source: str = "the profile") -> dict[int, float]:
    """Kernel index -> average milliseconds per run, from the primary graph's Run Order rows."""
    builtin = builtin_op_names()
    rows = [r for r in report.run_order if r.subgraph == 0]
    op_rows = [r for r in rows if not r.name.startswith("Delegate/")
               and r.type.split("/")[0] in builtin]
    delegate_rows = [r for r in rows if r.name.startswith("Delegate/")]
    kernel_of = {op: k for k, kernel in enumerate(kernels) for op in kernel.ops}
    times: dict[int, float] = {}
    for position, row in enumerate(op_rows):
        op = _op_index(row, position, graph, source)
        if op not in kernel_of:
            raise BenchmarkOutputError(f"{source}: operation {op} ({row.type}) belongs to no "
                                       "kernel deduced for this target.")
        times[kernel_of[op]] = times.get(kernel_of[op], 0.0) + row.avg_ms
    rest = [k for k in range(len(kernels)) if k not in times]
    if len(delegate_rows) != len(rest) and delegate_rows and all(
            r.type.split(" (")[0] in _XNNPACK_OPS for r in delegate_rows):
        return _align_xnnpack(op_rows, delegate_rows, graph, kernels, source)
    if len(delegate_rows) != len(rest):
        what = (f"{len(delegate_rows)} delegate kernel rows" if delegate_rows
                else "no delegate kernel rows")
        raise BenchmarkOutputError(
            f"{source} has {len(op_rows)} operator rows and {what}, but the target's "
            f"{len(kernels)} kernels leave {len(rest)} to match: the output is not from this "
            "model and target, or the delegate split the model differently.")
    times.update({k: row.avg_ms for k, row in zip(rest, delegate_rows)})
    return times


def _align_xnnpack(op_rows: list[NodeRow], delegate_rows: list[NodeRow], graph: Graph,
                   kernels: Sequence[Kernel], source: str) -> dict[int, float]:
    """XNNPACK operators that are not one per op (an internal "Static Reshape", a dropped
    1x1 pool): aligned with the ops as the in-context profiler's are (`op_attribution`)."""
    from latpred.profile.litert_profiler import OpProfile, OpTiming
    from latpred.profile.op_attribution import attribute_to_graph

    def timing(index: int, name: str, where: str, ms: float) -> OpTiming:
        return OpTiming(index, name, where, ms * 1e3, 0.0, ms * 1e3, 1, ms * 1e3)

    events = [timing(_op_index(r, i, graph, source), r.type.split("/")[0], "tflite", r.avg_ms)
              for i, r in enumerate(op_rows)]
    events += [timing(k, r.type, "xnnpack", r.avg_ms) for k, r in enumerate(delegate_rows)]
    attributed = attribute_to_graph(graph, OpProfile(tuple(events), 0.0, 0.0, 0.0, 1, 1))
    by_op = {a.op_index: a.mean_us / 1e3 for a in attributed}
    return {k: sum(by_op[op] for op in kernel.ops) for k, kernel in enumerate(kernels)}


def _op_index(row: NodeRow, position: int, graph: Graph, source: str) -> int:
    """The model operation a row belongs to: its ':<node index>' suffix, else its position."""
    m = _NODE_INDEX.match(row.name)
    op = int(m.group(1)) if m else position
    op_type = row.type.split("/")[0]
    if op >= len(graph.ops) or graph.ops[op].type != op_type:
        have = graph.ops[op].type if op < len(graph.ops) else "nothing"
        raise BenchmarkOutputError(f"{source}: row {row.name!r} is a {op_type} but the model's "
                                   f"operation {op} is {have}; the output is not from this model.")
    return op


def e2e_fields(report: BenchmarkReport) -> dict:
    """The model row's latency columns from the tool's end-to-end figures."""
    e = report.e2e
    us = e.get("median", e.get("inference:Inference (avg)", e.get("inference:Inference",
                                                                    e.get("avg"))))
    if us is None:
        raise BenchmarkOutputError("The output has no end-to-end timings ('count=... avg=...' or "
                                   "'Inference timings in us'); pass the printed log too.")
    count = int(e.get("count", report.profiled_runs or 0))
    return {"status": "ok", "latency_ms": us / 1000.0, "latency_iqr_ms": math.nan,
            "latency_min_ms": e["min"] / 1000.0 if "min" in e else math.nan, "n_runs": count}


def import_benchmark(outputs: Sequence[str | os.PathLike], model: str | os.PathLike, target,
                     out: str | os.PathLike, measured_at: float | None = None) -> ImportReport:
    """Store one model's benchmark_model profile for `target` in the dataset at `out`
    (`measured_at`: the run's Unix time, where known, as the interleaved protocol's rows hold
    it; drift correction reads it)."""
    from latpred.deduce import deduce
    from latpred.tflite import read_tflite

    report = read_outputs(outputs)
    entry = load_entry(model)
    data = entry.path.read_bytes()
    graph = read_tflite(data)
    kernels = deduce(graph, target)
    times = map_rows(report, graph, kernels, source=str(outputs[-1]))
    model_fields = e2e_fields(report)
    target_name = str(target)
    ds = open_dataset(out, target_name, _manifest_fields(target, model_fields["n_runs"]))
    runs = report.profiled_runs or model_fields["n_runs"]
    rows = [kernel_row(entry.model_id, target_name, plan,
                       {"status": "ok", "latency_ms": times[plan.index],
                        "latency_iqr_ms": math.nan, "latency_min_ms": math.nan, "n_runs": runs})
            for plan in kernel_plans(graph, target, kernels)]
    ds.append_kernels(pd.DataFrame(rows))
    ds.append_models(pd.DataFrame([{
        "model_id": entry.model_id, "space": entry.space, "seed": entry.seed, "arch": entry.arch,
        "file_hash": hashlib.sha256(data).hexdigest(), "target": target_name, "error": "",
        **model_fields, "measured_at": math.nan if measured_at is None else measured_at}]))
    return ImportReport(entry.model_id, target_name, len(rows), model_fields["latency_ms"], runs)


def _manifest_fields(target, repeats: int) -> dict:
    device = getattr(target, "device", None)
    return {"runtime": f"{getattr(target, 'runtime', 'tflite')} (benchmark_model)",
            "runtime_version": str(getattr(target, "runtime_version", "")),
            "machine": str(getattr(device, "display_name", "") or getattr(device, "name", "")),
            "cpu_model": str(getattr(device, "soc", "")),
            "threads": int(getattr(target, "threads", 1)), "repeats": int(repeats),
            "precision": getattr(target, "precision", "fp32"), "date": time.strftime("%Y-%m-%d"),
            "source": "benchmark_model --enable_op_profiling=true"}
