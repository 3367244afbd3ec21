"""Dev script: realign a host-CPU dataset's kernel rows to today's CPU deduction.

    python scripts/realign_cpu_kernels.py datasets/host-cpu-converter [--check]

Datasets measured before commit 441a13c (XNNPACK folds a zero H/W PAD into the convolution
that alone reads it) hold one kernel row per operation, the folded PAD included (the profiler
read 0 ms for it). Today's deduction makes that PAD part of the convolution's kernel, so those
models no longer align and `latpred evaluate` / `train` use them end to end only (304 of the
400 `host-cpu-converter` models, 7 of the 46 corpus files).

The old CPU deduction was one kernel per operation, so old row `i` is operation `i`. Each kernel
of today's deduction gets the sum of its operations' rows (latency, minimum), the other figures
of its first operation (the convolution), and today's identity and features (`kernel_plans`).
A model whose rows are not one per operation is left as it is and reported. Measurements are
not changed, only regrouped: the PAD rows being folded are checked to be 0 ms.

Rows whose kernels hold the same ops as today's only take today's kernel types, every other
column kept (config hash and features included): so the int8 datasets took the `builtin_*`
types of ops XNNPACK declines in int8 (`--target host/cpu/int8/t1`; their rows come from the
int8 files, whose config hashes a rebuilt fp32 graph would not reproduce), and every host
dataset the `dwconv2d_igemm` type of depthwise convolutions XNNPACK runs as a grouped IGEMM.
When every changed model is of that kind, the table is rewritten in its own row order with
only `kernel_type` changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.dataset import Dataset  # noqa: E402
from latpred.deduce import deduce  # noqa: E402
from latpred.profile.kernels import kernel_plans, kernel_row  # noqa: E402
from latpred.sampler import build_graph  # noqa: E402
from latpred.target import parse_target  # noqa: E402

_SUMMED = ("latency_ms", "latency_min_ms")
_KEPT = ("status", "latency_iqr_ms", "n_runs", "rounds_json")


def realign_model(graph, target, rows: pd.DataFrame) -> list[dict] | None:
    """Today's kernel rows for one model, or None when its rows are already aligned."""
    kernels = deduce(graph, target)
    rows = rows.sort_values("kernel_index")
    types = [k.type for k in kernels]
    if list(rows["kernel_type"]) == types:
        return None
    if list(rows["ops"]) == ["+".join(graph.ops[i].type for i in k.ops) for k in kernels]:
        return rows.assign(kernel_type=types)   # the same rows (and index), retyped
    rows = rows.reset_index(drop=True)
    if len(rows) != len(graph.ops) or list(rows["kernel_index"]) != list(range(len(graph.ops))):
        raise ValueError(f"{len(rows)} rows for {len(graph.ops)} operations: not one per op")
    out = []
    for plan in kernel_plans(graph, target, kernels):
        first, rest = plan.kernel.ops[0], plan.kernel.ops[1:]
        if any(rows.at[i, "latency_ms"] != 0 for i in rest):
            raise ValueError(f"folded op rows {list(rest)} are not 0 ms")
        stats = {c: rows.at[first, c] for c in _KEPT}
        stats.update({c: float(sum(rows.at[i, c] for i in plan.kernel.ops)) for c in _SUMMED})
        out.append(kernel_row(rows.at[first, "model_id"], str(target), plan, stats))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--target", default="host/cpu/fp32/t1")
    ap.add_argument("--check", action="store_true", help="report only, write nothing")
    args = ap.parse_args()
    ds = Dataset.open(args.dataset)
    target = parse_target(args.target)
    models = ds.models(args.target).set_index("model_id")
    kernels = ds.kernels().reset_index(drop=True)   # a unique index: retyped rows keep theirs
    mine = kernels["target"] == args.target
    keep, new_rows, retyped, changed, skipped = [kernels[~mine]], [], [], 0, []
    for mid, rows in kernels[mine].groupby("model_id", sort=False):
        arch = models.at[mid, "arch"] if mid in models.index else ""
        try:
            realigned = realign_model(build_graph(json.loads(arch)), target, rows) \
                if arch else None
        except ValueError as err:
            skipped.append(f"{mid}: {err}")
            realigned = None
        if realigned is None:
            keep.append(rows)
        else:
            if isinstance(realigned, pd.DataFrame):
                retyped.append(realigned)
            else:
                new_rows.extend(realigned)
            changed += 1
    print(f"{changed} models realigned, {len(skipped)} left as they were")
    for line in skipped:
        print("  left:", line)
    if retyped:
        moved = pd.concat(retyped)["kernel_type"]
        was = kernels.loc[moved.index, "kernel_type"]
        for (old, new), n in pd.crosstab(was, moved).stack().items():
            if n and old != new:
                print(f"  {n} rows {old} -> {new}")
    if changed and not args.check:
        if new_rows:
            table = pd.concat([*keep, *retyped, pd.DataFrame(new_rows)], ignore_index=True)
            table = table.sort_values(["model_id", "target", "kernel_index"])
        else:   # kernel types only: the table as it was, in its order
            table = kernels.copy()
            table.loc[moved.index, "kernel_type"] = moved
        ds.replace_table("kernels", table)
        print(f"wrote {len(table)} kernel rows to {ds.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
