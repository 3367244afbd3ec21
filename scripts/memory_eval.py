"""Score `latpred.predict_memory` on datasets/host-cpu-memory (docs/memory.md's figures).

    python scripts/memory_eval.py --data datasets/host-cpu-memory [--json out/memory_eval.json]
        [--cpu-level avx2]

`--cpu-level` sizes XNNPACK's buffers as the measuring CPU did when that is not this one
(`xnnpack_configs.LEVELS`): host-cpu-memory was measured on an AVX2/FMA3 CPU ("avx2"),
host-cpu-memory-vm3 on an AVX-512 one ("amx").

Graphs are rebuilt from the stored architecture JSON (the committed file for corpus models);
the model buffer is the measured file's size. Pure Python: no runtime runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latpred.memory import largest_layer, naive_sum, predict_memory  # noqa: E402
from latpred.memory import xnnpack  # noqa: E402
from latpred.memory.xnnpack_configs import LEVELS, for_cpu  # noqa: E402
from latpred.memory.host_cpu import arena_plan, estimate_model_bytes  # noqa: E402
from latpred.memory.measure import baseline_bytes  # noqa: E402
from latpred.sampler import build_graph  # noqa: E402
from latpred.tflite import read_tflite  # noqa: E402

TARGET = "host/cpu/fp32/t1"


def graph_of(row) -> object:
    if row["file"]:
        return read_tflite(ROOT / row["file"])
    return build_graph(json.loads(row["arch"]))


def score(df: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    base = baseline_bytes(TARGET)    # the fixed overhead is relative to this model
    recs = []
    for _, row in df.iterrows():
        g = graph_of(row)
        pb = predict_memory(g, TARGET, "builtin")
        px = predict_memory(g, TARGET, "xnnpack", model_bytes=int(row["file_bytes"]))
        measured = int(row["rss_delta"]) + base
        n_xnn = sum(r.runs_on == "xnnpack" for r in px.ops)
        ap, _ = arena_plan(g, "xnnpack")
        marks = ap.marks
        outgrown = max((a for a, b in zip(marks, marks[1:]) if b > a), default=0)
        regrowth = xnnpack.workspace_plan(g, xnnpack.delegated_input(g), False)[2]
        recs.append({"model_id": row["model_id"], "source": row["source"],
                     "n_ops": row["n_ops"], "n_xnn_ops": n_xnn,
                     "n_tensors": len(g.tensors), "measured": measured,
                     "arena_builtin": row["arena_builtin"], "pred_arena_builtin": pb.arena,
                     "arena_xnnpack": row["arena_xnnpack"], "pred_arena_xnnpack": px.arena,
                     "pred_total": px.total,
                     "pred_no_overhead": px.total - px.overhead - px.transient,
                     "outgrown": outgrown, "regrowth": regrowth,
                     "file_bytes": int(row["file_bytes"]), "est_file": estimate_model_bytes(g),
                     "pred_total_no_file": px.total - px.model_bytes + estimate_model_bytes(g),
                     "naive": naive_sum(g), "largest": largest_layer(g),
                     **{f"part_{k}": v for k, v in px.breakdown().items()}})
    r = pd.DataFrame(recs)
    ape = lambda col: (r[col] - r["measured"]).abs() / r["measured"] * 100  # noqa: E731
    r["ape_total"], r["ape_naive"], r["ape_largest"] = ape("pred_total"), ape("naive"), \
        ape("largest")
    r["ape_total_no_file"] = ape("pred_total_no_file")
    ok_b = r["arena_builtin"] >= 0
    ok_x = r["arena_xnnpack"] >= 0
    figures = {
        "models": len(r),
        "arena_builtin_exact": int((r.loc[ok_b, "arena_builtin"] ==
                                    r.loc[ok_b, "pred_arena_builtin"]).sum()),
        "arena_builtin_measured": int(ok_b.sum()),
        "arena_xnnpack_exact": int((r.loc[ok_x, "arena_xnnpack"] ==
                                    r.loc[ok_x, "pred_arena_xnnpack"]).sum()),
        "arena_xnnpack_measured": int(ok_x.sum()),
        "total_within_5pct": float((r["ape_total"] <= 5).mean() * 100),
        "total_mdape": float(r["ape_total"].median()),
        "total_mape": float(r["ape_total"].mean()),
        "total_p90": float(np.percentile(r["ape_total"], 90)),
        "total_no_file_within_5pct": float((r["ape_total_no_file"] <= 5).mean() * 100),
        "total_no_file_mdape": float(r["ape_total_no_file"].median()),
        "file_estimate_mdape": float(((r["est_file"] - r["file_bytes"]).abs() /
                                      r["file_bytes"] * 100).median()),
        "naive_mdape": float(r["ape_naive"].median()),
        "largest_mdape": float(r["ape_largest"].median()),
        "naive_mape": float(r["ape_naive"].mean()),
        "largest_mape": float(r["ape_largest"].mean()),
    }
    figures["beats_naive_x"] = figures["naive_mdape"] / max(figures["total_mdape"], 1e-9)
    figures["beats_largest_x"] = figures["largest_mdape"] / max(figures["total_mdape"], 1e-9)
    per_source = r.groupby("source")["ape_total"].agg(["count", "median", "max"])
    figures["per_source"] = {s: {"n": int(v["count"]), "mdape": float(v["median"]),
                                 "max": float(v["max"])} for s, v in per_source.iterrows()}
    return r, figures


def fit_overhead(r: pd.DataFrame) -> dict:
    """Non-negative least squares of what the buffers leave unexplained (measured minus the
    prediction without overhead and leftovers) on [1, tensors, outgrown arena, outgrown
    workspace], fitted on every other model (sorted by id) and scored on the rest."""
    from scipy.optimize import nnls

    r = r.sort_values("model_id").reset_index(drop=True)
    X = np.stack([np.ones(len(r)), r["n_tensors"], r["outgrown"], r["regrowth"]], 1)
    X = X.astype(float)
    y = (r["measured"] - r["pred_no_overhead"]).to_numpy(float)
    train = np.arange(len(r)) % 2 == 0
    coef, _ = nnls(X[train], y[train])
    pred = r["pred_no_overhead"].to_numpy(float) + X @ coef
    ape = np.abs(pred - r["measured"]) / r["measured"] * 100
    return {"fixed": float(coef[0]), "per_tensor": float(coef[1]),
            "arena_regrowth_resident": float(coef[2]),
            "workspace_regrowth_resident": float(coef[3]),
            "held_out_within_5pct": float((ape[~train] <= 5).mean() * 100),
            "held_out_mdape": float(np.median(ape[~train])),
            "held_out_p90": float(np.percentile(ape[~train], 90)),
            "train_within_5pct": float((ape[train] <= 5).mean() * 100)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/host-cpu-memory")
    ap.add_argument("--json", default=None, help="Write the figures here.")
    ap.add_argument("--rows", default=None, help="Write per-model rows (CSV) here.")
    ap.add_argument("--fit", action="store_true",
                    help="Also fit the per-op/per-tensor overhead (held-out half scored).")
    ap.add_argument("--cpu-level", choices=sorted(LEVELS), default=None,
                    help="The measuring CPU's x86 level, when not this CPU's.")
    args = ap.parse_args()
    df = pd.read_parquet(Path(args.data) / "models.parquet")
    if args.cpu_level:
        with for_cpu(args.cpu_level):
            rows, figures = score(df)
    else:
        rows, figures = score(df)
    if args.fit:
        figures["overhead_fit"] = fit_overhead(rows)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.rows:
        rows.to_csv(args.rows, index=False)


if __name__ == "__main__":
    main()
