"""Dev script: turn pytorch-cuda campaign output (scripts/cuda_campaign.py) into datasets.

    python scripts/cuda_assemble.py --kind zoo --out datasets/h100-cuda-zoo RUN_DIR...
    python scripts/cuda_assemble.py --kind synthetic --out datasets/h100-cuda-synthetic RUN_DIR...

A synthetic dataset's models are of the space the calls' env.json names (`--space` of
scripts/cuda_campaign.py; synthetic_cnn for calls made before it had one).

Each RUN_DIR holds a device call's `env.json`, `zoo.jsonl` / `synthetic.jsonl` and
`retest.jsonl`. Per measured model and target: a model row (CUDA-graph replay figures) and one
kernel row per latpred Kernel that `deduce(graph, target)` gives for the `pytorch-cuda` rule set,
whose latency is the sum of the in-context times of the CUDA kernels its ops launched (the
profiler's kernels mapped to graph ops), plus the kernel's features (`f_*`, from the batch-1
graph the predictor sees), `n_launches` (CUDA kernels recorded) and `launches` (their kinds).
`config_hash` is a grouping key: sha256 of the kernel's ops (types, attributes, tensor shapes).
Noise: the retested models' first and second figures, end to end and per kernel. The raw
profiler rows (kernel names and times) ship beside the tables as `cuda_kernels.jsonl.gz`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred import sampler, zoo  # noqa: E402
from latpred.dataset import Dataset  # noqa: E402
from latpred.deduce import deduce  # noqa: E402
from latpred.features import kernel_features  # noqa: E402
from latpred.profile.protocol import retest_mdape  # noqa: E402
from latpred.target import parse_target  # noqa: E402

_KINDS = [(r"^Memset", "memset"), (r"xmma_fprop|implicit_gemm|fprop|convolve_common_engine",
                                    "conv"),
          (r"conv2d_c1_k1|conv2d_", "dwconv"), (r"tensorTransform|nchwToNhwc|nhwcToNchw",
                                                "transform"),
          (r"nvjet|gemm|gemv|cutlass|splitKreduce", "gemm"), (r"CatArray", "cat"),
          (r"reduce_kernel", "reduce"), (r"pool", "pool"), (r"softmax", "softmax"),
          (r"clamp|threshold|hardtanh", "activation"),
          (r"copy|Copy", "copy"), (r"elementwise|Functor|sigmoid|tanh|hardswish", "elementwise")]


def kind_of(name: str) -> str:
    """A CUDA kernel name as a short kind (conv, gemm, elementwise, ...)."""
    for pattern, kind in _KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def graph_of(arch: dict):
    return zoo.build(arch["zoo"], **arch.get("knobs", {})) if arch.get("zoo") \
        else sampler.build_graph(arch)


def config_hash(graph, kernel) -> str:
    parts = []
    for i in kernel.ops:
        op = graph.ops[i]
        shapes = [graph.tensors[t].shape if t >= 0 else None for t in (*op.inputs, *op.outputs)]
        parts.append([op.type, repr(op.attrs), repr(shapes)])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def read(paths: list[Path], name: str) -> list[dict]:
    import gzip

    rows = []
    for p in paths:
        f, gz = p / name, p / (name + ".gz")   # as written, or as --gzip-into brought it back
        text = f.read_text() if f.exists() else \
            gzip.decompress(gz.read_bytes()).decode() if gz.exists() else ""
        if text:
            for line in text.splitlines():
                if line.strip():
                    r = json.loads(line)
                    r["source"] = p.name
                    rows.append(r)
    return rows


def per_op_us(row: dict) -> dict[int, list]:
    out: dict[int, list] = {}
    for op, name, dur in row.get("kernels", []):
        out.setdefault(op, []).append((name, dur))
    return out


def kernel_rows(row: dict, graph, target) -> list[dict]:
    kernels = deduce(graph, target)
    ops = per_op_us(row)
    have = row.get("status") == "ok" and "kernels" in row
    rows = []
    for k, kernel in enumerate(kernels):
        launched = [x for i in kernel.ops for x in ops.get(i, [])]
        ms = sum(d for _, d in launched) / 1000.0
        ok = have and ms > 0
        feats = kernel_features(graph, kernel, target)
        rows.append({"model_id": row["model_id"], "target": str(target), "kernel_index": k,
                     "kernel_type": kernel.type,
                     "ops": "+".join(graph.ops[i].type for i in kernel.ops),
                     "config_hash": config_hash(graph, kernel),
                     "status": "ok" if ok else "failed",
                     "error": "" if ok else ("no kernels recorded" if have else
                                             row.get("error", "not profiled")),
                     "latency_ms": ms if ok else math.nan, "latency_iqr_ms": math.nan,
                     "latency_min_ms": math.nan,
                     "n_runs": int(row.get("n_profile", 3)) if ok else 0,
                     "n_launches": len(launched),
                     "launches": "+".join(kind_of(n) for n, _ in launched),
                     "kernel_source": row.get("kernel_source", ""),
                     **{f"f_{n}": (float(v) if v is not None else math.nan)
                        for n, v in feats.items()}})
    return rows


def model_row(row: dict, space: str) -> dict:
    arch = row["arch"]
    ok = row.get("status") == "ok"
    return {"model_id": row["model_id"], "space": space, "seed": int(arch.get("seed", 0)),
            "arch": json.dumps(arch, sort_keys=True, separators=(",", ":")),
            "file_hash": "", "target": row["target"], "status": row.get("status", "failed"),
            "error": row.get("error", "") or "",
            "latency_ms": row.get("latency_ms", math.nan) if ok else math.nan,
            "latency_iqr_ms": row.get("latency_iqr_ms", math.nan) if ok else math.nan,
            "latency_min_ms": row.get("latency_min_ms", math.nan) if ok else math.nan,
            "n_runs": int(row.get("n_runs", 0)) if ok else 0,
            "latency_spread": row.get("spread", math.nan),
            "gpu_time_ms": row.get("gpu_time_ms", math.nan),
            "kernel_source": row.get("kernel_source", ""),
            # kernel times as exclusive shares of the busy time (latpred.profile.cuda
            # `exclusive_us`, from session 8's calls) or as plain durations (earlier calls)
            "kernel_time": "exclusive" if "overlap_ms" in row else "duration",
            "overlap_ms": row.get("overlap_ms", math.nan),
            "sm_clock_mhz": (row.get("clocks") or {}).get("sm_clock_mhz", math.nan),
            "source": row["source"]}


def noise(main: dict, retest: list[dict], graphs: dict) -> dict:
    e2e, kern = [], []
    for r in retest:
        m = main.get((r["model_id"], r["target"]))
        if m is None or r.get("status") != "ok" or m.get("status") != "ok":
            continue
        e2e.append((m["latency_ms"], r["latency_ms"]))
        target = parse_target(r["target"])
        g = graphs[r["model_id"]]
        a = {x["kernel_index"]: x["latency_ms"] for x in kernel_rows(m, g, target)}
        for x in kernel_rows(r, g, target):
            if x["status"] == "ok" and not math.isnan(a.get(x["kernel_index"], math.nan)):
                kern.append((a[x["kernel_index"]], x["latency_ms"]))
    pct = [abs(b / a - 1) * 100 for a, b in e2e]
    kpct = [abs(b / a - 1) * 100 for a, b in kern]
    p90 = lambda v: round(statistics.quantiles(v, n=10)[-1], 3) if len(v) > 1 else None  # noqa
    return {"e2e_retest_mdape": round(retest_mdape(e2e), 3) if e2e else None,
            "kernel_retest_mdape": round(retest_mdape(kern), 3) if kern else None,
            "e2e_retest_p90": p90(pct), "kernel_retest_p90": p90(kpct),
            "n_retest": len(e2e), "n_kernel_retest": len(kern)}


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("zoo", "synthetic"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    paths = [Path(p) for p in a.runs]
    rows = read(paths, f"{a.kind}.jsonl")
    retest = [r for r in read(paths, "retest.jsonl")
              if (r.get("kind") == "retest-zoo") == (a.kind == "zoo")]
    envs = {p.name: json.loads((p / "env.json").read_text()) for p in paths
            if (p / "env.json").exists()}
    main_rows = {(r["model_id"], r["target"]): r for r in rows}
    graphs = {}
    model_rows, krows = [], []
    space = "zoo" if a.kind == "zoo" else \
        next((e.get("space", "synthetic_cnn") for e in envs.values()), "synthetic_cnn")
    for r in tqdm(rows, desc="assemble", unit="model"):
        g = graphs.get(r["model_id"]) or graphs.setdefault(r["model_id"], graph_of(r["arch"]))
        model_rows.append(model_row(r, space))
        krows += kernel_rows(r, g, parse_target(r["target"]))
    out = Path(a.out)
    ds = Dataset.create(out, name=out.name)
    ds.append_kernels(pd.DataFrame(krows))
    ds.append_models(pd.DataFrame(model_rows))
    summary = {}
    for target in sorted({r["target"] for r in rows}):
        t = parse_target(target)
        mine = [r for r in rows if r["target"] == target]
        env = envs[mine[0]["source"]]      # the call that measured the target's first model
        proto = env["protocol"]
        rt = [r for r in retest if r["target"] == target]
        nz = noise(main_rows, rt, graphs)
        counts = {"models_ok": sum(r.get("status") == "ok" for r in mine),
                  "models": len(mine),
                  "kernel_source_replay": sum(r.get("kernel_source") == "replay" for r in mine),
                  "kernel_source_replay_matched": sum(r.get("kernel_source") == "replay-matched"
                                                      for r in mine),
                  "kernel_time_exclusive": sum("overlap_ms" in r for r in mine)}
        ds.update_manifest(
            target, runtime=t.runtime, runtime_version=env["torch"],
            machine=f"device machine, {env.get('gpu')}, driver {env.get('driver')}",
            cpu_model="(host CPU not used for timing)", threads=1, precision=t.precision,
            batch=t.batch, date=env["date"], warmup=int(proto["warmup"]),
            repeats=int(proto["passes"] * proto["replays"]), protocol=proto,
            kernel_timing="in_context",
            kernel_timing_note=("torch.profiler (CUPTI) kernels mapped to graph ops by "
                                "record_function ranges; times from CUDA-graph replays when "
                                "the replayed kernels are the eager ones (in order or matched "
                                "by name: kernel_source per model), else from eager runs; "
                                "kernel_time per model: 'exclusive' = each instant split "
                                "among the kernels running side by side, 'duration' = plain "
                                "kernel durations (calls before session 8)"),
            torch=env["torch"], cuda=env["cuda"], cudnn=env["cudnn"], gpu=env.get("gpu"),
            sm_clock_max_mhz=env.get("sm_clock_max_mhz"), driver=env.get("driver"),
            cudnn_benchmark=env["cudnn_benchmark"], cudnn_allow_tf32=env["cudnn_allow_tf32"],
            device_calls=sorted({r["source"] for r in mine + rt}), counts=counts, noise=nz)
        summary[target] = {**counts, "noise": nz}
    ds.compact()
    with gzip.open(out / "cuda_kernels.jsonl.gz", "wt") as f:
        for r in rows + retest:
            f.write(json.dumps({k: r.get(k) for k in ("model_id", "target", "kind", "status",
                                                      "latency_ms", "kernel_source", "kernels",
                                                      "overlap_ms", "source")}) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
