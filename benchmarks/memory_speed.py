"""Benchmark: peak memory with latency in one pass (memory-aware NAS).

Times, on the same fresh graphs sampled from search_space/synthetic_cnn.yaml (building them is
not timed): `predict_many` alone, `memory_totals` alone (the arena plan, XNNPACK workspace and
packed weights; no per-op rows) and `predict_many_with_memory` (both), in CPU seconds
(`time.process_time`) and graphs per second: the median over rounds, each of which runs every
case once.

Run: .venv/bin/python benchmarks/memory_speed.py [--predictor DIR] [--graphs 2000]
     [--repeats 7] [--target h100/gpu/fp16 | h100/cuda/fp16 | ...]
Without --predictor a GBDT predictor is trained on a simulated dataset (as predict_speed.py).
Models the target refuses (a GPU accelerator's grouped convolutions) are left out.
Not while /tmp/CAMPAIGN_RUNNING exists.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from predict_speed import add_predictor_arguments, predictor  # noqa: E402

from latpred.memory import memory_totals, predict_many_with_memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_predictor_arguments(ap, graphs=2000, repeats=7)
    args = ap.parse_args()
    if Path("/tmp/CAMPAIGN_RUNNING").exists():
        sys.exit("A timing campaign is running (/tmp/CAMPAIGN_RUNNING); try later.")
    from latpred.sampler import build_graph, sample

    model = predictor(args)
    archs = [a for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", args.graphs, 1)
             if _runs(build_graph(a), args.target)]
    if len(archs) < args.graphs:
        print(f"{args.graphs - len(archs)} of {args.graphs} sampled models left out: "
              f"{args.target} refuses them")
    args.graphs = len(archs)
    warm = [build_graph(a) for a in archs[:50]]
    # a small predictor of a GPU target may lack a kernel type: the flagged fallback prices it
    # (a no-op where none is missing)
    predict_many_with_memory(model, warm, allow_fallback=True)
    cases = {"latency (predict_many)": lambda g: model.predict_many(g, allow_fallback=True),
             "memory (memory_totals)": lambda g: memory_totals(g, args.target),
             "both (predict_many_with_memory)":
                 lambda g: predict_many_with_memory(model, g, allow_fallback=True)}
    # Interleaved rounds (each case once per round, on fresh graphs): this VM's speed drifts by
    # 5-15% within minutes, which separate blocks of repeats per case read as a difference.
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            graphs = [build_graph(a) for a in archs]
            gc.collect()
            start = time.process_time()
            fn(graphs)
            cpu[name].append(time.process_time() - start)
            del graphs
    rate = {}
    for name in cases:
        med = statistics.median(cpu[name])
        rate[name] = args.graphs / med
        print(f"{name}: median {med:.2f} s CPU for {args.graphs} graphs = "
              f"{rate[name]:,.0f} graphs/s ({args.repeats} interleaved rounds)", flush=True)
    both, alone = rate["both (predict_many_with_memory)"], rate["latency (predict_many)"]
    print(f"with memory / latency alone: {both / alone:.0%}")


def _runs(graph, target: str) -> bool:
    """Whether the target's runtime runs the model (a GPU accelerator refuses some grouped
    convolutions)."""
    from latpred import deduce
    from latpred.errors import DelegateRefusedError

    try:
        deduce(graph, target)
    except DelegateRefusedError:
        return False
    return True


if __name__ == "__main__":
    main()
