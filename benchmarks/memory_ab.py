"""A/B benchmark: `predict_many_with_memory` of this tree against an older `latpred/memory`, in
one process, interleaved on the same fresh graphs (this VM's load moves separate runs by
5-15%).

    git archive 50a04d8 latpred | tar -x -C /tmp/old14
    .venv/bin/python benchmarks/memory_ab.py --old /tmp/old14 [--graphs 1000] [--repeats 5]

The old `latpred/memory` is copied to a temporary package (`latpred_old_memory`, its imports
renamed) and runs with this tree's latency model, as `memory_speed.py` builds it (GBDT on
simulated data unless --predictor). Per repeat, fresh graphs for each of: `predict_many`
alone, old and new `predict_many_with_memory`, old and new `memory_totals` (old and new in
alternating order); CPU seconds (`time.process_time`); medians. The memory part is the call
minus `predict_many` alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from predict_speed import add_predictor_arguments, predictor  # noqa: E402


def old_memory(tree: Path):
    """The `latpred.memory` of an archived tree, importable beside this one."""
    root = Path(tempfile.mkdtemp())
    shutil.copytree(tree / "latpred" / "memory", root / "latpred_old_memory")
    for path in (root / "latpred_old_memory").rglob("*.py"):
        path.write_text(path.read_text().replace("latpred.memory", "latpred_old_memory"))
    sys.path.insert(0, str(root))
    return importlib.import_module("latpred_old_memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a tree holding latpred/memory to compare")
    add_predictor_arguments(ap, graphs=1000, repeats=5)
    args = ap.parse_args()
    from latpred.memory import memory_totals, predict_many_with_memory
    from latpred.sampler import build_graph, sample

    old = old_memory(Path(args.old))
    model = predictor(args)
    archs = list(sample(ROOT / "search_space" / "synthetic_cnn.yaml", args.graphs, 1))
    cases = {"latency": lambda g: model.predict_many(g),
             "old": lambda g: old.predict_many_with_memory(model, g),
             "new": lambda g: predict_many_with_memory(model, g),
             "old totals": lambda g: old.memory_totals(g, args.target),
             "new totals": lambda g: memory_totals(g, args.target)}
    warm = [build_graph(a) for a in archs[:50]]
    for fn in cases.values():
        fn(warm)
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.repeats):
        order = ["latency", "old", "new", "old totals", "new totals"]
        if rep % 2:
            order = ["latency", "new", "old", "new totals", "old totals"]
        for name in order:
            graphs = [build_graph(a) for a in archs]
            gc.collect()
            start = time.process_time()
            cases[name](graphs)
            cpu[name].append((time.process_time() - start) / args.graphs)
            del graphs
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1] * 1e6:.0f} us" for k, v in cpu.items()),
              flush=True)
    med = {name: statistics.median(v) for name, v in cpu.items()}
    for name in ("old", "new"):
        part = [b - a for a, b in zip(cpu["latency"], cpu[name])]
        print(f"{name}: {1 / med[name]:,.0f} graphs/s with memory, {1 / med['latency']:,.0f} "
              f"latency alone ({med['latency'] / med[name]:.0%}); memory part "
              f"{statistics.median(part) * 1e6:.0f} us a graph (median of repeats)")
        print(f"{name} memory_totals alone: {med[name + ' totals'] * 1e6:.0f} us a graph")


if __name__ == "__main__":
    main()
