"""Dev script: turn `scripts/cuda_memory_campaign.py` output into datasets/h100-cuda-memory and
the measured cuDNN workspace table and its estimator, package data read by
latpred.memory.cuda_workspace (`latpred/memory/data/h100_workspaces.json.gz`, gzipped JSON
with a header naming this script, the dataset and the runs' torch / CUDA / cuDNN versions).

    python scripts/cuda_memory_assemble.py --runs out/cudamem/run1 out/cudamem/run2 \
        --out datasets/h100-cuda-memory --table latpred/memory/data/h100_workspaces.json.gz

Each run directory holds `env.json` and `memory.jsonl.gz`. Per (model, target) row the
dataset keeps the allocator's figures (`models.parquet`); the allocator trace is kept for the
zoo rows only (`traces.parquet`: action, address, requested bytes, per entry) and each op's
(allocated, peak, allocations, frees) after it for every row, so a test can place every
request of a zoo model and check the replay against it; `conv_workspaces.parquet` holds every
convolution call's measured workspace (model, target, op, `conv_key`, bytes). Convolution workspaces are read from
the trace: the allocation a CONV_2D / DEPTHWISE_CONV_2D makes and frees inside its own call.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latpred.memory.cuda_workspace import conv_key  # noqa: E402
from latpred.pytorch.batch import with_batch  # noqa: E402
from latpred.sampler import build_graph  # noqa: E402
from latpred.target import parse_target  # noqa: E402


def read_run(d: Path) -> tuple[dict, list[dict]]:
    env = json.loads((d / "env.json").read_text())
    rows = [json.loads(line) for line in gzip.open(d / "memory.jsonl.gz", "rt")]
    return env, rows


def op_windows(row: dict, n_before: int) -> tuple[int, list[list]]:
    """(allocations of the load, the trace entries of each op of the first forward).
    `n_before`: the process's allocations before this row's trace began."""
    tr = row["trace"]
    aidx = [i for i, e in enumerate(tr) if e[0] == "a"]
    ends = [st[2] - n_before for st in row["cold_ops"]]
    n_load = ends[-1] - (len(aidx) - ends[-1])     # the warm forward repeats the cold one
    out, prev = [], n_load
    for e in ends:
        i0 = aidx[prev] if prev < len(aidx) else len(tr)
        i1 = aidx[e] if e < len(aidx) else len(tr)
        out.append([x for x in tr[i0:i1] if x[0] in "af"])
        prev = e
    return n_load, out


def allocations_before(env: dict, rows: list[dict]) -> list[int]:
    """The process's allocation count when each row's trace began: from `load_stats` where
    recorded (allocations so far at the load's end; the trace holds the load, the first
    forward and the second, which repeats the first), else by counting the traces of one
    process in order from the warm-up's."""
    out, n = [], sum(1 for e in env["warm_up"]["trace"] if e[0] == "a")
    for r in rows:
        if r.get("status") != "ok":
            out.append(-1)
            continue
        n_trace = sum(1 for e in r["trace"] if e[0] == "a")
        if "load_stats" in r:
            forward = r["cold_ops"][-1][2] - r["load_stats"][2]
            out.append(r["load_stats"][2] - (n_trace - 2 * forward))
        else:
            out.append(n)
            n += n_trace
    return out


def conv_workspaces(rows: list[dict], befores: list[int], observations: list | None = None
                    ) -> dict:
    """{conv_key: set of measured workspace bytes}; `observations` gets one
    (model_id, target, op index, key, bytes) per convolution call."""
    table: dict = {}
    for r, nb in zip(rows, befores):
        if r.get("status") != "ok":
            continue
        t = parse_target(r["target"])
        g = with_batch(build_graph(r["arch"]), t.batch)
        elem = 2 if t.precision == "fp16" else 4
        _, wins = op_windows(r, nb)
        for k, (op, ents) in enumerate(zip(g.ops, wins)):
            if op.type not in ("CONV_2D", "DEPTHWISE_CONV_2D") or k == len(g.ops) - 1:
                continue
            freed = {e[1] for e in ents if e[0] == "f"}
            temps = [e[2] for e in ents if e[0] == "a" and e[1] in freed]
            key, nbytes = conv_key(g, op, elem), temps[-1] if temps else 0
            table.setdefault(key, set()).add(nbytes)
            if observations is not None:
                observations.append({"model_id": r["model_id"], "target": r["target"],
                                     "op": k, "key": json.dumps(key), "workspace": nbytes})
    return table


def model_rows(env: dict, rows: list[dict], befores: list[int], run: str) -> list[dict]:
    out = []
    for r, nb in zip(rows, befores):
        t = parse_target(r["target"])
        rec = {"model_id": r["model_id"], "source": r["source"], "target": r["target"],
               "precision": t.precision, "batch": t.batch, "run": run,
               "arch": json.dumps(r["arch"], sort_keys=True), "status": r["status"],
               "error": r.get("error", "")}
        for k in ("base_allocated", "base_reserved", "load_allocated", "load_reserved",
                  "cold_peak_allocated", "cold_peak_reserved", "cold_after_allocated",
                  "warm_peak_allocated", "warm_peak_reserved", "warm_after_allocated"):
            rec[k] = int(r.get(k, -1))
        rec["n_ops"] = len(r.get("cold_ops", []))
        rec["allocs_before"] = int(nb)
        rec["cold_ops"] = json.dumps(r.get("cold_ops", []))
        rec["time_s"] = float(r.get("time_s", 0.0))
        out.append(rec)
    return out


def table_header(envs: list[dict], dataset: Path) -> dict:
    """What the shipped table records about its making: this script, the dataset, the runs'
    library versions and device (the first run's; all runs of one table share them)."""
    env = envs[0]
    return {
        "generated_by": "scripts/cuda_memory_assemble.py (do not edit)",
        "dataset": f"datasets/{dataset.name}", "date": env["date"],
        "gpu": env["gpu"], "driver": env.get("driver"), "torch": env["torch"],
        "cuda": env["cuda"], "cudnn": env["cudnn"],
        "cudnn_benchmark": env.get("cudnn_benchmark", False),
        "conv": ("[key, bytes]: the workspace cuDNN took for one call of a convolution with "
                 "key = latpred.memory.cuda_workspace.conv_key (precision bytes, N, C, H, W, "
                 "output channels, kh, kw, stride h/w, dilation h/w, groups, padding h/w); the "
                 "largest measured where calls differed"),
        "model": "latpred.memory.cuda_workspace.fit_estimator on every key (LightGBM text)",
    }


def write_table(path: Path, table: dict, header: dict) -> None:
    """The table ({conv_key: set of bytes}, the largest kept) and the estimator fitted on all
    of it, as the gzipped JSON `latpred.memory.cuda_workspace.shipped_table` reads."""
    from latpred.memory.cuda_workspace import dump_table, fit_estimator

    keys = sorted(table)
    booster = fit_estimator(keys, [max(table[k]) for k in keys])
    path.parent.mkdir(parents=True, exist_ok=True)
    dump_table(path, {k: max(table[k]) for k in keys}, booster.model_to_string(), header)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--out", default="datasets/h100-cuda-memory")
    ap.add_argument("--table", default="latpred/memory/data/h100_workspaces.json.gz",
                    help="where the workspace table (gzipped JSON package data) is written")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    recs, traces, table, envs, observations = [], [], {}, [], []
    for d in a.runs:
        env, rows = read_run(Path(d))
        befores = allocations_before(env, rows)
        recs += model_rows(env, rows, befores, Path(d).name)
        for key, vals in conv_workspaces(rows, befores, observations).items():
            table.setdefault(key, set()).update(vals)
        for r, nb in zip(rows, befores):
            if r["status"] == "ok" and r["source"] == "zoo":
                traces.append({"model_id": r["model_id"], "target": r["target"],
                               "allocs_before": nb, "trace": json.dumps(r["trace"])})
        envs.append({k: v for k, v in env.items() if k != "warm_up"} |
                    {"warm_up_steps": env["warm_up"]["steps"],
                     "warm_up_segments": env["warm_up"]["segments"]})
    df = pd.DataFrame(recs)
    df.to_parquet(out / "models.parquet", index=False)
    pd.DataFrame(traces).to_parquet(out / "traces.parquet", index=False)
    pd.DataFrame(observations).to_parquet(out / "conv_workspaces.parquet", index=False)
    conflicting = sum(len(v) > 1 for v in table.values())
    write_table(Path(a.table), table, table_header(envs, out))
    ok = df[df.status == "ok"]
    manifest = {
        "format_version": 1, "name": out.name, "runtime": "pytorch-cuda",
        "runtime_version": envs[0]["torch"], "cuda": envs[0]["cuda"],
        "cudnn": envs[0]["cudnn"], "gpu": envs[0]["gpu"], "driver": envs[0].get("driver"),
        "targets": sorted(df.target.unique().tolist()), "date": envs[0]["date"],
        "assembled": time.strftime("%Y-%m-%d"),
        "models": int(ok.model_id.nunique()), "rows": int(len(ok)),
        "failed_rows": int((df.status != "ok").sum()),
        "sources": {s: int(n) for s, n in ok.groupby("source").model_id.nunique().items()},
        "synthetic_space": "search_space/synthetic_cnn.yaml", "seed": envs[0]["seed"],
        "protocol": ("one process per run (run2: 14 processes, one CUDA context each); per "
                     "(model, target): empty_cache, to_torch(...).to('cuda', dtype) and NHWC "
                     "inputs (latpred.profile.cuda.prepare, random weights), reset_peak_memory_"
                     "stats, one forward under no_grad (cold_*), output dropped, reset, a second "
                     "forward (warm_*). Before any model each process ran a matmul and a conv "
                     "in fp16 and fp32 (cuBLAS/cuBLASLt workspaces: base_allocated)."),
        "conv_workspace_keys": len(table), "conv_workspace_conflicts": conflicting,
        "columns": {
            "base_allocated": "memory_allocated before the model (the persistent workspaces)",
            "load_allocated": "after loading the module and its inputs",
            "cold_peak_allocated": "max_memory_allocated over the first forward "
                                   "(after reset_peak_memory_stats)",
            "cold_peak_reserved": "max_memory_reserved over the first forward",
            "warm_peak_allocated": "the same over a second forward",
            "cold_ops": "per op of the first forward: [allocated, peak so far, allocations, "
                        "frees] after it (allocation counts are the process's)",
            "allocs_before": "the process's allocation count where the row's trace starts"},
        "runs": envs,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps({k: manifest[k] for k in ("models", "rows", "failed_rows", "sources",
                                               "conv_workspace_keys",
                                               "conv_workspace_conflicts")}))


if __name__ == "__main__":
    main()
