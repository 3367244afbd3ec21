"""A/B benchmark: the memory part of `predict_many_with_memory` alone, this tree's
`latpred/memory` against an older one, on the same latency batch.

Per round: new architectures sampled from search_space/synthetic_cnn.yaml (those the target
refuses left out), one latency batch (`predict_many_batch`, with the host's per-graph wiring
hook), then the old and the new memory part on that batch's outputs, in alternating order
(the first to run reads a colder cache); CPU seconds per graph. The old tree's
`latpred/memory` is imported beside this one as `memory_ab.py` does. Both must give the same
peaks. Prints each side's median and the per-round gain's median and quartiles: far steadier
on this VM than timing `predict_many_with_memory` end to end, whose latency pass moves by more
than the memory part weighs.

    git archive HEAD latpred | tar -x -C /tmp/old
    .venv/bin/python benchmarks/memory_part_ab.py --old /tmp/old [--target h100/gpu/fp16]
        [--graphs 500] [--repeats 10]

Not while /tmp/CAMPAIGN_RUNNING exists.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory_ab import old_memory  # noqa: E402
from memory_speed import _architectures  # noqa: E402
from predict_speed import add_predictor_arguments, predictor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a tree holding latpred/memory to compare")
    add_predictor_arguments(ap, graphs=500, repeats=10)
    args = ap.parse_args()
    if Path("/tmp/CAMPAIGN_RUNNING").exists():
        sys.exit("A timing campaign is running (/tmp/CAMPAIGN_RUNNING); try later.")
    import latpred.memory as new
    from latpred.gc_pause import paused_gc
    from latpred.sampler import build_graph

    old = old_memory(Path(args.old))
    model = predictor(args)
    target = new._check_target(model.target)
    mods = {"old": old, "new": new}
    parts = {name: _part(mod, target) for name, mod in mods.items()}
    # on the host, the new tree records the wiring in the latency batch's hook, as
    # `predict_many_with_memory` does; the old tree's own Wiring walks it outside the timing
    host = target.processor == "cpu"
    wirings = {name: importlib.import_module(f"{mod.__name__}.flat_arrays").Wiring
               for name, mod in mods.items()}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.repeats + 1):        # round 0 warms both up, untimed
        graphs = [build_graph(a) for a in _architectures(args, seed=500 + r)]
        gc.collect()
        with paused_gc():
            wiring = wirings["new"]() if host else None
            visit = {"visit": wiring.collect} if host else {}
            _, graphs, deduced, batch = model.predict_many_batch(graphs, allow_fallback=True,
                                                                 **visit)
            peaks = {}
            for name in ("old", "new") if r % 2 else ("new", "old"):
                w = wirings["old"]().walk(graphs) if host and name == "old" else wiring
                start = time.process_time()
                peaks[name] = parts[name](graphs, deduced, batch, w)
                if r:
                    cpu[name].append((time.process_time() - start) / len(graphs))
            if not np.array_equal(peaks["old"], peaks["new"]):
                sys.exit("the old and new memory parts give different peaks")
        del graphs, deduced, batch
    gain = sorted(a - b for a, b in zip(cpu["old"], cpu["new"]))
    q1, med, q3 = statistics.quantiles(gain, n=4) if len(gain) > 1 else gain * 3
    print(f"{args.target}: old {statistics.median(cpu['old']) * 1e6:.1f} us, new "
          f"{statistics.median(cpu['new']) * 1e6:.1f} us a graph; old - new per round: median "
          f"{med * 1e6:.1f} us (quartiles {q1 * 1e6:.1f} to {q3 * 1e6:.1f}), {len(gain)} rounds")


def _part(mod, target):
    """The memory part of `predict_many_with_memory` after its latency batch, on the target,
    from the memory package `mod`: (graphs, kernels, batch, wiring) -> peaks."""
    sub = {name: importlib.import_module(f"{mod.__name__}.{name}")
           for name in ("flat", "gpu_flat", "cuda")}
    if target.processor == "cpu":
        return lambda g, d, b, w: sub["flat"].xnnpack_totals(g, d, b, w,
                                                            int8=target.precision == "int8")
    if target.processor == "gpu":
        return lambda g, d, b, w: sub["gpu_flat"].delegate_totals(g, target, b)
    return lambda g, d, b, w: sub["cuda"].batch_peaks(g, target.precision, target.batch,
                                                      tensors=b, kernels=d)


if __name__ == "__main__":
    main()
