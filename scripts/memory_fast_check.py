"""Dev check for the memory NAS path: every memory figure must stay identical while the host
planners are optimised.

    .venv/bin/python scripts/memory_fast_check.py save [--out /tmp/memory_fast_ref.pkl]
    .venv/bin/python scripts/memory_fast_check.py check [--out /tmp/memory_fast_ref.pkl]

`save` (run on the code before a change) records, for 1,853 graphs (1,200 sampled from
search_space/synthetic_cnn.yaml with the seed benchmarks/memory_speed.py uses, 100 from each
other space, the zoo, the committed converter fixtures): `memory_totals` with XNNPACK and with
the built-in kernels, every `predict_memory` field and per-op row (both kernels), the arena
plan (offsets, chunks, marks, per-node extent), and the XNNPACK layout (plan nodes, sizes,
kinds, partitions' internal tensors, workspace plan). `check` recomputes them with the
current code and compares them exactly, and also checks that `predict_many_with_memory`
returns `predict_many`'s predictions (same process, a small GBDT on simulated data) and the
saved totals, on freshly built graphs (it reads tensor sizes from the latency batch unless a
graph already has them): the synthetic ones without fallback, all of them with it. On the GPU
targets (LiteRT's GPU accelerator and PyTorch on CUDA, fp16 and fp32) it records every
`predict_memory` field and per-op row, or the refusal's message, and `memory_totals` of the
graphs each runs; on the GPU accelerator's it also checks `predict_many_with_memory` (a small
Lasso on simulated data) against those totals. It is a dev script, not a test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = "host/cpu/fp32/t1"
GPU_TARGETS = ("h100/gpu/fp16", "h100/gpu/fp32", "h100/cuda/fp16", "h100/cuda/fp32")
OTHER_SPACES = ("converter_cnn", "converter_small", "converter_large", "converter_scaled",
                "mnasnet_residual", "regnet_cnn")


def graphs() -> list:
    from latpred import zoo
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite

    space = ROOT / "search_space"
    out = [build_graph(a) for a in sample(space / "synthetic_cnn.yaml", 1200, 1)]
    for name in OTHER_SPACES:
        out += [build_graph(a) for a in sample(space / f"{name}.yaml", 100, 7)]
    out += [zoo.build(name) for name in sorted(zoo.ZOO)]
    out += [read_tflite(p) for p in sorted((ROOT / "tests/fixtures/corpus").glob("*.tflite"))]
    return out


def figures(gs: list) -> dict:
    """Everything the memory planners compute that the check compares."""
    from latpred.memory import memory_totals, predict_memory, xnnpack
    from latpred.memory.host_cpu import arena_plan

    out = {}
    for kernels in ("xnnpack", "builtin"):
        out[f"totals/{kernels}"] = memory_totals(gs, TARGET, kernels).tolist()
        out[f"predict/{kernels}"] = [dataclasses.astuple(predict_memory(g, TARGET, kernels))
                                     for g in gs]
        plans = []
        for g in gs:
            ap, _ = arena_plan(g, kernels)
            plans.append((ap.arena_bytes, ap.persistent_bytes, ap.allocs, ap.persistent,
                          sorted(ap.shared.items()), ap.node_extent, ap.node_live, ap.chunks,
                          ap.marks))
        out[f"plan/{kernels}"] = plans
    layouts = []
    for g in gs:
        lay = xnnpack.delegated_input(g)
        p = lay.plan_input
        nodes = [(n.inputs, n.outputs, n.ops, n.label, n.temporaries, n.inplace, n.ends_chunk)
                 for n in p.nodes]
        layouts.append((nodes, sorted(p.sizes.items()), sorted(p.kinds.items()),
                        sorted(p.plan_kinds.items()), p.inputs, p.outputs,
                        sorted(p.names.items()), sorted(lay.delegated_ops), lay.internal,
                        xnnpack.workspace_plan(g, lay)))
    out["layout/xnnpack"] = layouts
    out.update(gpu_figures(gs))
    return out


def gpu_figures(gs: list) -> dict:
    """Per GPU target: each graph's `predict_memory` (or the refusal) and the totals of those
    it runs."""
    from latpred.errors import LatpredError
    from latpred.memory import memory_totals, predict_memory

    out = {}
    for target in GPU_TARGETS:
        rows, runs = [], []
        for g in gs:
            try:
                rows.append(dataclasses.astuple(predict_memory(g, target)))
                runs.append(g)
            except LatpredError as e:
                rows.append(str(e))
        out[f"predict/{target}"] = rows
        out[f"totals/{target}"] = memory_totals(runs, target).tolist()
    return out


def check_latency_path(totals: list) -> list[str]:
    """`predict_many_with_memory` == (`predict_many`, the saved totals), same model, on
    graphs built afresh."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    from latpred.memory import predict_many_with_memory
    from latpred.predictors import LatencyModel

    data = simulate(Path(tempfile.mkdtemp()) / "sim", TARGET, n_models=60).root
    model = LatencyModel.fit(data, TARGET, family="gbdt", search="latpred")
    sampled = graphs()[:1200]        # the fallback-free synthetic graphs
    expected = model.predict_many(sampled)
    preds, peaks = predict_many_with_memory(model, graphs()[:1200])
    bad = []
    if [(p.total_ms, p.overhead_ms, p.kernels, p.fallback_types, p.name) for p in preds] != \
            [(p.total_ms, p.overhead_ms, p.kernels, p.fallback_types, p.name)
             for p in expected] or \
            not all(np.array_equal(a.kernel_ms, b.kernel_ms)
                    for a, b in zip(preds, expected)):
        bad.append("predict_many_with_memory predictions != predict_many")
    if peaks.dtype != np.int64 or peaks.tolist() != totals[:1200]:
        bad.append("predict_many_with_memory peaks != saved totals")
    if predict_many_with_memory(model, graphs(), allow_fallback=True)[1].tolist() != totals:
        bad.append("predict_many_with_memory peaks (with fallback) != saved totals")
    return bad


def check_gpu_latency_path(ref: dict) -> list[str]:
    """`predict_many_with_memory` on the GPU accelerator's targets (parts flattened as the
    latency batch deduces each graph, tensor sizes from its interned tensors) == the saved
    `memory_totals` of the graphs each runs, on graphs built afresh."""
    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    from latpred.memory import predict_many_with_memory
    from latpred.predictors import LatencyModel

    bad = []
    for target in GPU_TARGETS[:2]:
        data = simulate(Path(tempfile.mkdtemp()) / "sim", target, n_models=12).root
        model = LatencyModel.fit(data, target, family="lasso", search="none")
        runs = [g for g, row in zip(graphs(), ref[f"predict/{target}"])
                if not isinstance(row, str)]
        peaks = predict_many_with_memory(model, runs, allow_fallback=True)[1]
        if peaks.tolist() != ref[f"totals/{target}"]:
            bad.append(f"predict_many_with_memory peaks on {target} != saved totals")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("save", "check"))
    ap.add_argument("--out", default="/tmp/memory_fast_ref.pkl")
    args = ap.parse_args()
    start = time.time()
    gs = graphs()
    got = figures(gs)
    if args.mode == "save":
        Path(args.out).write_bytes(pickle.dumps(got))
        print(f"saved {len(gs)} graphs' figures to {args.out} ({time.time() - start:.0f} s)")
        return
    ref = pickle.loads(Path(args.out).read_bytes())
    bad = [k for k in ref if ref[k] != got[k]]
    for k in bad:
        diffs = [i for i, (a, b) in enumerate(zip(ref[k], got[k])) if a != b]
        print(f"DIFFERENT {k}: {len(diffs)} graphs, first {diffs[:5]}")
    bad += check_latency_path(ref["totals/xnnpack"]) + check_gpu_latency_path(ref)
    print("IDENTICAL" if not bad else f"FAILED: {bad}",
          f"({len(gs)} graphs, {time.time() - start:.0f} s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
