"""Test-retest of labels between two measurements of the same models (dev-only).

Issue 12's noise target is a retest taken at least an hour after the campaign: profile a sample
of a dataset's models again into a fresh dataset, then compare the labels of the models (and
kernels) both hold:

    latpred profile --target host/cpu/fp32/t1 --out /tmp/retest --retest 0 SAMPLE_DIR
    python scripts/compare_labels.py datasets/host-cpu-synthetic /tmp/retest --target host/cpu/fp32/t1

Prints the end-to-end and per-kernel MdAPE, 90th percentile and the median signed difference
(the retest against the label), and the hours between the two measurements. With
`--drift-correct MS` both are first drift-corrected to the machine state in which the drift
reference reads MS milliseconds (`latpred dataset drift-correct --reference-ms MS`), so that
campaigns measured hours apart compare on one scale (a side that is already corrected, such as
a combination of corrected campaigns, is taken as it is).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from latpred.dataset import Dataset
from latpred.profile.drift import drift_correct


def _figures(first: np.ndarray, again: np.ndarray) -> str:
    diff = 100 * (again - first) / first
    return (f"MdAPE {np.median(np.abs(diff)):.2f}%  p90 {np.percentile(np.abs(diff), 90):.2f}%  "
            f"median signed {np.median(diff):+.2f}%  (n={len(diff)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels")
    ap.add_argument("retest")
    ap.add_argument("--target", default="host/cpu/fp32/t1")
    ap.add_argument("--drift-correct", type=float, default=None, metavar="MS",
                    help="drift-correct both to this reference latency first")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [args.labels, args.retest]
        if args.drift_correct is not None:
            for i, src in enumerate(list(paths)):
                if _has_own_drift(Dataset.open(src), args.target):
                    paths[i] = Path(tmp) / f"dc{i}"
                    drift_correct(src, paths[i], (args.target,), args.drift_correct)
        _compare(Dataset.open(paths[0]), Dataset.open(paths[1]), args.target)
    return 0


def _has_own_drift(ds: Dataset, target: str) -> bool:
    """Whether `ds` is one raw campaign with a drift series (a combination of campaigns
    drift-corrected before combining, or a corrected copy, is on its scale already)."""
    entry = ds.manifest["targets"].get(target, {})
    return bool(entry.get("drift", {}).get("series")) and "drift_corrected" not in entry


def _compare(a: Dataset, b: Dataset, target: str) -> None:
    ma, mb = (d.models(target).query("status == 'ok'").set_index("model_id") for d in (a, b))
    common = ma.index.intersection(mb.index)
    if common.empty:
        sys.exit(f"No model of target {target} is measured in both datasets (pass --target).")
    print(f"end to end: {_figures(ma.loc[common, 'latency_ms'].to_numpy(), mb.loc[common, 'latency_ms'].to_numpy())}")
    if "measured_at" in ma and "measured_at" in mb:
        hours = (mb.loc[common, "measured_at"] - ma.loc[common, "measured_at"]) / 3600
        print(f"hours apart: {hours.min():.2f}-{hours.max():.2f} (median {hours.median():.2f})")
    key = ["model_id", "kernel_index"]
    ka, kb = (d.kernels(target).query("status == 'ok' and latency_ms > 0").set_index(key)
              for d in (a, b))
    both = ka.index.intersection(kb.index)
    if len(both):
        print(f"per kernel: {_figures(ka.loc[both, 'latency_ms'].to_numpy(), kb.loc[both, 'latency_ms'].to_numpy())}")


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # `| head` ends the output quietly
    sys.exit(main())
