"""How much a model's fastest run depends on the LiteRT instance that runs it (dev-only).

The interleaved protocol's retests read 5-25% away from the labels on small models while the
drift reference moved ~7%: is it the machine, or the instance (where XNNPACK's packed weights
and the arena land in memory: huge pages or not, cache-set aliasing)? For each model, create
`--instances` fresh sessions, interleaved across models, time `--runs` plain runs in each
(pinned, SCHED_FIFO where allowed, as `latpred profile`), and print the per-instance minimum:
the spread across instances against the spread of repeated blocks of one instance.

    .venv/bin/python scripts/instance_variance.py MODEL.tflite ... [--instances 6 --runs 60]

It times the machine: run it alone.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from latpred.profile.litert_cpu import REALTIME_PRIORITY, pinned_cpus, realtime_allowed
from latpred.profile.litert_capi import Session
from latpred.profile.prepare import model_bytes


def _block(session: Session, runs: int) -> float:
    for _ in range(3):
        session.run()
    return min(session.run()[0] for _ in range(runs)) / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--instances", type=int, default=6)
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args(argv)
    cpus = pinned_cpus(1)
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    if realtime_allowed():
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    data = {m: model_bytes(__import__("pathlib").Path(m)) for m in args.models}
    fresh = {m: [] for m in args.models}     # one block per new instance
    same = {m: [] for m in args.models}      # blocks of one kept instance
    kept = {m: Session(d, 1, 0) for m, d in data.items()}
    for _ in range(args.instances):
        for m, d in data.items():
            s = Session(d, 1, 0)
            fresh[m].append(_block(s, args.runs))
            s.close()
            same[m].append(_block(kept[m], args.runs))
    print(f"{'model':40s} {'fresh instances: min..max (spread)':>40s} {'one instance':>28s}")
    for m in args.models:
        f, s = np.array(fresh[m]), np.array(same[m])
        print(f"{os.path.basename(m)[:40]:40s} {f.min():8.3f}..{f.max():8.3f} "
              f"({100 * (f.max() / f.min() - 1):5.1f}%) {s.min():8.3f}..{s.max():8.3f} "
              f"({100 * (s.max() / s.min() - 1):5.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
