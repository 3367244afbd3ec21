"""Score `latpred.predict_memory` on datasets/h100-cuda-memory (docs/memory.md's H100 figures).

    python scripts/cuda_memory_eval.py --data datasets/h100-cuda-memory \
        --json datasets/h100-cuda-memory/figures.json

Per (model, target) row: the predicted max_memory_allocated of loading the module and one
forward (`latpred.memory.cuda.simulate`) against the measured `cold_peak_allocated`, and
max_memory_reserved against `cold_peak_reserved`; the second forward (`warm_*`) likewise.
Workspaces, three ways: `table` (the shipped table of measured cuDNN workspaces, in-sample),
`heldout` (two folds by model: each model's convolutions looked up in a table built from the
other fold's models only, unseen ones estimated: what a new model gets), `zero` (no cuDNN
workspace at all). Baselines on the same (batched, precision-sized) graph: the naive sum of
every tensor and the largest layer (weights + the widest op's inputs and outputs), each plus
the persistent cuBLAS workspaces that the measured process holds. Pure Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latpred.memory import cuda_workspace  # noqa: E402
from latpred.memory.cuda import simulate  # noqa: E402
from latpred.pytorch.batch import with_batch  # noqa: E402
from latpred.sampler import build_graph  # noqa: E402

_ELEM = {"fp16": 2, "fp32": 4}


def fold(model_id: str) -> int:
    return int(hashlib.md5(model_id.encode()).hexdigest(), 16) % 2


def baselines(graph, elem: int) -> tuple[int, int]:
    """(naive sum of all tensors, largest layer) at `elem` bytes per element."""
    nb = [t.size * elem for t in graph.tensors]
    naive = sum(nb)
    weights = sum(n for t, n in zip(graph.tensors, nb) if t.is_constant)
    widest = max((sum(nb[t] for t in (*op.inputs, *op.outputs)
                      if t >= 0 and not graph.tensors[t].is_constant) for op in graph.ops),
                 default=0)
    return naive, weights + widest


def heldout_tables(obs: pd.DataFrame) -> dict[int, tuple[dict, object]]:
    """Per fold f: the workspace table of fold f's models only and the estimator fitted on it
    (a model of the other fold looks its convolutions up there)."""
    tables: dict[int, dict] = {0: {}, 1: {}}
    for mid, key, nbytes in zip(obs["model_id"], obs["key"], obs["workspace"]):
        tables[fold(mid)][tuple(json.loads(key))] = int(nbytes)
    out = {}
    for f, tab in tables.items():
        keys = sorted(tab)
        out[f] = (tab, cuda_workspace.fit_estimator(keys, [tab[k] for k in keys]))
    return out


def score(df: pd.DataFrame, modes=("table", "heldout", "zero"), per_model_tables=None):
    recs = []
    persistent = int(df["base_allocated"].iloc[0])
    for _, r in df.iterrows():
        g0 = build_graph(json.loads(r["arch"]))
        g = with_batch(g0, int(r["batch"]))
        elem = _ELEM[r["precision"]]
        rec = {"model_id": r["model_id"], "source": r["source"], "target": r["target"],
               "measured": int(r["cold_peak_allocated"]),
               "measured_reserved": int(r["cold_peak_reserved"]),
               "measured_warm": int(r["warm_peak_allocated"])}
        for mode in modes:
            if mode == "table":
                ws = None
            elif mode == "zero":
                def ws(gg, op, e):
                    return 0
            else:
                other, booster = per_model_tables[1 - fold(r["model_id"])]

                def ws(gg, op, e, other=other, booster=booster):
                    key = cuda_workspace.conv_key(gg, op, e)
                    return other[key] if key in other else cuda_workspace.estimate(key, booster)
            s = simulate(g0, r["precision"], int(r["batch"]), workspace=ws)
            rec[f"pred_{mode}"] = s["peak"]
            if mode == "table":
                rec["pred_reserved"] = s["reserved"]
                rec["pred_warm"] = simulate(g0, r["precision"], int(r["batch"]),
                                            warm=True)["peak"]
                rec["peak_op_from_end"] = len(g.ops) - 1 - s["peak_op"]
        naive, largest = baselines(g, elem)
        rec["naive"], rec["largest"] = naive + persistent, largest + persistent
        recs.append(rec)
    r = pd.DataFrame(recs)

    def ape(col, ref="measured"):
        return (r[col] - r[ref]).abs() / r[ref] * 100

    figures = {"rows": len(r), "models": int(r.model_id.nunique())}
    for mode in modes:
        e = ape(f"pred_{mode}")
        r[f"ape_{mode}"] = e
        figures[mode] = {"exact": int((r[f"pred_{mode}"] == r["measured"]).sum()),
                         "within_5pct": float((e <= 5).mean() * 100),
                         "within_1pct": float((e <= 1).mean() * 100),
                         "mdape": float(e.median()), "mape": float(e.mean()),
                         "p99": float(np.percentile(e, 99)), "max": float(e.max())}
    for col in ("naive", "largest"):
        e = ape(col)
        r[f"ape_{col}"] = e
        figures[col] = {"within_5pct": float((e <= 5).mean() * 100),
                        "mdape": float(e.median()), "mape": float(e.mean())}
    figures["reserved_exact"] = int((r["pred_reserved"] == r["measured_reserved"]).sum())
    figures["warm_exact"] = int((r["pred_warm"] == r["measured_warm"]).sum())
    figures["peak_at_last_op_pct"] = float((r["peak_op_from_end"] == 0).mean() * 100)
    e = (r["pred_heldout"] - r["measured"]) / r["measured"] * 100 if "heldout" in modes else None
    if e is not None:
        figures["heldout_signed_mean_pct"] = float(e.mean())
        figures["heldout_under_5pct"] = int((e < -5).sum())
        figures["heldout_over_5pct"] = int((e > 5).sum())
    base = "heldout" if "heldout" in modes else modes[0]
    for col in ("naive", "largest"):   # MdAPE is 0 for most rows: compare means
        figures[f"beats_{col}_x_mape"] = figures[col]["mape"] / max(figures[base]["mape"], 1e-9)
        figures[f"beats_{col}_x_mean_abs_bytes"] = float(
            (r[col] - r["measured"]).abs().mean() /
            max((r[f"pred_{base}"] - r["measured"]).abs().mean(), 1e-9))
    by = {}
    for (src, tgt), grp in r.groupby(["source", "target"]):
        by[f"{src} {tgt}"] = {"n": len(grp), **{
            m: {"within_5pct": float((grp[f"ape_{m}"] <= 5).mean() * 100),
                "mdape": float(grp[f"ape_{m}"].median())} for m in modes}}
    figures["per_source_target"] = by
    return r, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/h100-cuda-memory")
    ap.add_argument("--json", default=None, help="Write the figures here.")
    ap.add_argument("--rows", default=None, help="Write per-row results (CSV) here.")
    ap.add_argument("--limit", type=int, default=0, help="Score only the first N rows.")
    args = ap.parse_args()
    data = Path(args.data)
    df = pd.read_parquet(data / "models.parquet")
    df = df[df.status == "ok"]
    if args.limit:
        df = df.head(args.limit)
    tables = heldout_tables(pd.read_parquet(data / "conv_workspaces.parquet"))
    rows, figures = score(df, per_model_tables=tables)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.rows:
        rows.to_csv(args.rows, index=False)


if __name__ == "__main__":
    main()
