"""Benchmark: peak memory with latency in one pass (memory-aware NAS).

Times, on the same fresh graphs sampled from search_space/synthetic_cnn.yaml (building them is
not timed): `predict_many` alone, `memory_totals` alone (the arena plan, XNNPACK workspace and
packed weights; no per-op rows) and `predict_many_with_memory` (both), in CPU seconds
(`time.process_time`) and graphs per second: the median over rounds, each of which runs every
case once (every other round in reverse order); and the ratio of latency alone to both within
each round (median and quartiles over the rounds).

Run: .venv/bin/python benchmarks/memory_speed.py [--predictor DIR] [--graphs 2000]
     [--repeats 7] [--target h100/gpu/fp16 | h100/cuda/fp16 | ...] [--new-architectures]

By default every round times the same architectures (fresh Graph objects), so what latpred
keeps per op configuration across calls (CUDA's request templates and cuDNN workspace
estimates) is known after the first round. `--new-architectures` draws new ones for every case
of every round (another seed each), as a NAS loop meets them.
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
    ap.add_argument("--new-architectures", action="store_true",
                    help="new architectures for every case of every round")
    args = ap.parse_args()
    if Path("/tmp/CAMPAIGN_RUNNING").exists():
        sys.exit("A timing campaign is running (/tmp/CAMPAIGN_RUNNING); try later.")
    from latpred.sampler import build_graph

    model = predictor(args)
    archs = _architectures(args, seed=1)
    if len(archs) < args.graphs:
        print(f"{args.graphs - len(archs)} of {args.graphs} sampled models left out: "
              f"{args.target} refuses them")
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
    # Every other round runs the cases in reverse, so no case always comes first.
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    count: dict[str, list[int]] = {name: [] for name in cases}
    for r in range(args.repeats):
        order = list(enumerate(cases.items()))
        for k, (name, fn) in order if r % 2 == 0 else reversed(order):
            if args.new_architectures:
                archs = _architectures(args, seed=1000 + r * len(cases) + k)
            graphs = [build_graph(a) for a in archs]
            gc.collect()
            start = time.process_time()
            fn(graphs)
            cpu[name].append(time.process_time() - start)
            count[name].append(len(graphs))
            del graphs
    rate = {}
    which = "new architectures each" if args.new_architectures else "the same architectures in"
    per_graph = {name: [t / n for t, n in zip(cpu[name], count[name])] for name in cases}
    for name in cases:
        rate[name] = 1.0 / statistics.median(per_graph[name])
        print(f"{name}: median {1e3 / rate[name]:.2f} ms CPU a graph = {rate[name]:,.0f} "
              f"graphs/s ({args.repeats} interleaved rounds, {which} round)", flush=True)
    both, alone = rate["both (predict_many_with_memory)"], rate["latency (predict_many)"]
    # the two cases of one round ran minutes apart at most: their ratio drifts less
    paired = sorted(a / b for a, b in zip(per_graph["latency (predict_many)"],
                                          per_graph["both (predict_many_with_memory)"]))
    q1, med, q3 = (statistics.quantiles(paired, n=4) if len(paired) > 1
                   else [paired[0]] * 3)
    print(f"with memory / latency alone: {both / alone:.0%} (per round: median {med:.0%}, "
          f"quartiles {q1:.0%}-{q3:.0%})")


def _architectures(args, seed: int) -> list:
    """`args.graphs` architectures sampled with `seed`, less those the target refuses."""
    from latpred.sampler import build_graph, sample

    return [a for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", args.graphs, seed)
            if _runs(build_graph(a), args.target)]


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
