"""Dev script: power, energy and hardware counters on the device machine's H100 (runs there).

    python scripts/power_campaign.py models --out $OUT --zoo h100/cuda/fp16,h100/cuda/fp16/b32 \
        --synthetic 120 --budget-s 330
    python scripts/power_campaign.py kernels --out $OUT --start 0 --count 400 --budget-s 200
    python scripts/power_campaign.py ncu --out $OUT --start 0 --count 400 --budget-s 380

`models`: idle power (nothing running, 2 s between counter edges), then each zoo model on each
`--zoo` target and the synthetic models `synthetic_cnn-s13-<i>` (a subset of
datasets/h100-cuda-synthetic) under sustained CUDA-graph replay (latpred.profile.energy:
`--warm-s` then a window of at least `--window-s` between two edges of NVML's energy counter),
then every zoo model of the first target and `--retest` synthetic models again, then idle again.
One JSON line per model in `<out>/energy.jsonl`.

`kernels`: the per-kernel workloads (`workloads()`: distinct latpred kernels of the synthetic
models, by config hash, stratified by kernel type): each kernel's ops cut out of its model
(`kernel_subgraph`), batch 1, fp16, captured `copies` times in one CUDA graph so that a replay
lasts about `--replay-ms`, replayed as above. `<out>/kernel_power.jsonl`. At the end, one
torch.profiler session runs each measured workload once and records its CUDA kernel names
(`<out>/kernel_names.jsonl`), which tie the workloads to ncu's kernel list.

`ncu`: Nsight Compute's `--set full` on the same workloads, in chunks of `--chunk` workloads,
each one eager call inside an NVTX range `w<index>` (only those calls are profiled:
`--profile-from-start off`), until `--budget-s`; each chunk's raw page as CSV, appended to
`<out>/ncu_raw.csv.gz` (gzip members, one per chunk, each with its header).

`scripts/power_assemble.py` turns the files into datasets.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred import sampler, zoo  # noqa: E402
from latpred.target import parse_target  # noqa: E402

SPACE = Path(__file__).resolve().parent.parent / "search_space" / "synthetic_cnn.yaml"
KERNEL_TARGET = "h100/cuda/fp16"
# Share of the workloads per kernel type (round-robin weights); other types weigh 1.
TYPE_WEIGHT = {"conv2d": 4, "dwconv2d": 2, "grouped_conv2d": 2}


def workloads(count: int, seed: int = 13, pool_models: int = 80) -> list[dict]:
    """The first `count` per-kernel workloads: distinct kernels (config hash) of the synthetic
    models seed `seed`, indices 0..pool_models-1, in a fixed round-robin over kernel types
    (weights TYPE_WEIGHT). Deterministic: the same list on every machine."""
    import hashlib

    from latpred.deduce import deduce
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cuda_assemble import config_hash

    target = parse_target(KERNEL_TARGET)
    space = sampler.load_space(SPACE)
    by_type: dict[str, list[dict]] = {}
    seen = set()
    for i in range(pool_models):
        arch = sampler.sample_one(space, seed, i)
        graph = sampler.build_graph(arch)
        for k, kernel in enumerate(deduce(graph, target)):
            h = config_hash(graph, kernel)
            if h in seen:
                continue
            seen.add(h)
            by_type.setdefault(kernel.type, []).append(
                {"model_id": sampler.model_id("synthetic_cnn", seed, i), "index": i,
                 "seed": seed, "kernel_index": k, "kernel_type": kernel.type,
                 "config_hash": h})
    for items in by_type.values():   # a fixed shuffle: order by a hash of the config
        items.sort(key=lambda w: hashlib.sha256(w["config_hash"].encode()).hexdigest())
    out: list[dict] = []
    pos = {t: 0 for t in by_type}
    while len(out) < count and any(pos[t] < len(v) for t, v in by_type.items()):
        for t in sorted(by_type):
            for _ in range(TYPE_WEIGHT.get(t, 1)):
                if pos[t] < len(by_type[t]) and len(out) < count:
                    out.append(by_type[t][pos[t]])
                    pos[t] += 1
    for j, w in enumerate(out):
        w["workload"] = j
    return out


def _workload_module(w: dict):
    """(module, inputs) of one workload: the kernel's ops alone, batch 1, fp16, on the GPU."""
    import torch

    from latpred.deduce import deduce
    from latpred.profile.submodel import kernel_subgraph
    from latpred.pytorch import to_torch

    graph = sampler.build_graph(sampler.sample_one(sampler.load_space(SPACE), w["seed"],
                                                   w["index"]))
    kernel = deduce(graph, parse_target(KERNEL_TARGET))[w["kernel_index"]]
    sub = kernel_subgraph(graph, kernel, name=f"w{w['workload']}")
    module = to_torch(sub, batch=1, seed=None).eval().to("cuda", torch.float16)
    inputs = [torch.randn(s, device="cuda", dtype=torch.float16) for s in module.input_shapes()]
    return module, inputs


def _idle(nvml, label: str) -> dict:
    from latpred.profile.energy import idle_power

    r = {"kind": "idle", "label": label, **idle_power(nvml)}
    print(json.dumps(r), flush=True)
    return r


def _env(a) -> dict:
    from latpred.profile.cuda import environment

    return {**environment(), "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d"),
            "time": time.strftime("%H:%M:%S")}


def run_models(a) -> None:
    import torch

    from latpred.profile.cuda import CudaProtocol, prepare, time_replay
    from latpred.profile.energy import Nvml, sustained_power

    start = time.monotonic()
    out = Path(a.out)
    nvml = Nvml()
    (out / "env_models.json").write_text(json.dumps(_env(a), indent=1))
    f = open(out / "energy.jsonl", "a")
    f.write(json.dumps(_idle(nvml, "start")) + "\n")
    proto = CudaProtocol(warmup=5, replay_warmup=10, passes=3, replays=30, sleep_s=0.0)
    space = sampler.load_space(SPACE)
    targets = [parse_target(t) for t in a.zoo.split(",") if t]
    # the first zoo target, the synthetic models, then the other zoo targets
    jobs = [("zoo", zoo.arch(n), t) for t in targets[:1] for n in zoo.ZOO]
    jobs += [("synthetic", sampler.sample_one(space, 13, i), parse_target(KERNEL_TARGET))
             for i in range(a.synthetic)]
    jobs += [("zoo", zoo.arch(n), t) for t in targets[1:] for n in zoo.ZOO]
    retest = [("retest-zoo", zoo.arch(n), targets[0]) for n in zoo.ZOO] if targets else []
    retest += [("retest", sampler.sample_one(space, 13, i), parse_target(KERNEL_TARGET))
               for i in range(0, a.synthetic, max(1, a.synthetic // max(1, a.retest)))][:a.retest]
    graphs: dict = {}
    for kind, arch, target in jobs + retest:
        limit = a.budget_s + (a.retest_s if kind.startswith("retest") else 0)
        if time.monotonic() - start > limit:
            continue
        mid = arch.get("zoo") or sampler.model_id("synthetic_cnn", arch["seed"], arch["index"])
        row = {"kind": kind, "model_id": mid, "arch": arch, "target": str(target),
               "t": round(time.monotonic() - start, 2)}
        try:
            graph = graphs.get(mid) or graphs.setdefault(
                mid, zoo.build(arch["zoo"]) if arch.get("zoo") else sampler.build_graph(arch))
            with torch.no_grad():
                module, inputs = prepare(graph, target, seed=None)
                e2e, g = time_replay(module, inputs, proto)
                row.update(status="ok", replay_latency_ms=e2e["latency_ms"],
                           **sustained_power(g.replay, e2e["latency_ms"], nvml,
                                             window_s=a.window_s, warm_s=a.warm_s))
            del module, inputs, g
        except Exception as err:   # one bad model must not end the campaign
            row.update(status="failed", error=f"{type(err).__name__}: {err}"[:500])
        torch.cuda.empty_cache()
        f.write(json.dumps(row) + "\n")
        f.flush()
        print(f"{time.monotonic() - start:6.1f}s {kind} {target} {mid} {row['status']} "
              f"{row.get('power_w', 0):.1f} W {row.get('latency_ms', 0):.4f} ms "
              f"{row.get('sm_clock_mhz', '')} MHz util {row.get('util_gpu', '')} "
              f"{row.get('error', '')}", flush=True)
    f.write(json.dumps(_idle(nvml, "end")) + "\n")
    f.close()


def run_kernels(a) -> None:
    import torch

    from latpred.profile.energy import Nvml, capture, replay_ms, sustained_power

    start = time.monotonic()
    out = Path(a.out)
    nvml = Nvml()
    (out / "env_kernels.json").write_text(json.dumps(_env(a), indent=1))
    f = open(out / "kernel_power.jsonl", "a")
    f.write(json.dumps(_idle(nvml, "kernels-start")) + "\n")
    ws = workloads(a.start + a.count)[a.start:]
    if a.retest_every:
        ws = ws[::a.retest_every]
    done = []
    for w in ws:
        if time.monotonic() - start > a.budget_s:
            break
        row = {"kind": "retest" if a.retest_every else "kernel", **w,
               "t": round(time.monotonic() - start, 2)}
        try:
            with torch.no_grad():
                module, inputs = _workload_module(w)
                one = capture(lambda: module(*inputs), 1)
                t1 = replay_ms(one, 20)
                copies = int(min(a.max_copies, max(1, math.ceil(a.replay_ms / max(t1, 1e-4)))))
                del one
                g = capture(lambda: module(*inputs), copies, warmup=1)
                est = replay_ms(g, 5)
                r = sustained_power(g.replay, est, nvml, window_s=a.window_s, warm_s=a.warm_s)
                row.update(status="ok", copies=copies, single_replay_ms=t1, **r,
                           kernel_ms=r["latency_ms"] / copies)
                done.append((w, module, inputs))
            del g
        except Exception as err:
            row.update(status="failed", error=f"{type(err).__name__}: {err}"[:500])
        torch.cuda.empty_cache()
        f.write(json.dumps(row) + "\n")
        f.flush()
        print(f"{time.monotonic() - start:6.1f}s w{w['workload']} {w['kernel_type']} "
              f"{row['status']} {row.get('power_w', 0):.1f} W {row.get('kernel_ms', 0):.5f} ms "
              f"x{row.get('copies', 0)} {row.get('error', '')}", flush=True)
    f.close()
    if not a.retest_every:
        _names(out, done)


def _names(out: Path, done: list) -> None:
    """CUDA kernels each workload launches (torch.profiler, one eager call each)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from latpred.profile.cuda_trace import RUN_RANGE, find_range, gpu_kernels, named_ranges

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU,
                                              ProfilerActivity.CUDA]) as prof:
        for j, (w, module, inputs) in enumerate(done):
            with record_function(f"latpred_model{j}_run0"):
                module(*inputs)
        torch.cuda.synchronize()
    path = out / "trace.json"
    prof.export_chrome_trace(str(path))
    evs = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    path.unlink()
    runs = named_ranges(evs, RUN_RANGE)
    starts = [r[0] for r in runs]
    launch = {e["args"].get("correlation"): e["ts"] for e in evs
              if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    names: dict[int, list] = {}
    for k in gpu_kernels(evs):
        ts = launch.get(k.get("args", {}).get("correlation"))
        g = find_range(runs, starts, ts) if ts is not None else None
        if g is not None:
            names.setdefault(int(g[0]), []).append([k.get("cat"), k["name"][:200],
                                                    float(k["dur"])])
    with open(out / "kernel_names.jsonl", "a") as f:
        for j, (w, _, _) in enumerate(done):
            f.write(json.dumps({"workload": w["workload"], "kernels": names.get(j, [])}) + "\n")


def run_ncu_worker(a) -> None:
    """Inside ncu: each workload once, in an NVTX range, between cudaProfilerStart/Stop."""
    import torch

    ws = workloads(a.start + a.count)[a.start:]
    built = []
    with torch.no_grad():
        for w in ws:
            try:
                module, inputs = _workload_module(w)
                for _ in range(2):
                    module(*inputs)
                built.append((w, module, inputs))
            except Exception as err:
                print(f"w{w['workload']} failed: {err}", flush=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for w, module, inputs in built:
            torch.cuda.nvtx.range_push(f"w{w['workload']}")
            module(*inputs)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()


def run_ncu(a) -> None:
    start = time.monotonic()
    out = Path(a.out)
    tmp = Path("/tmp/ncu")
    tmp.mkdir(exist_ok=True)
    ver = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout
    (out / "env_ncu.json").write_text(json.dumps({**_env(a), "ncu": ver.strip()}, indent=1))
    per_chunk = None
    for c0 in range(a.start, a.start + a.count, a.chunk):
        left = a.budget_s - (time.monotonic() - start)
        if per_chunk is not None and left < per_chunk * 1.1:
            break
        n = min(a.chunk, a.start + a.count - c0)
        rep = tmp / f"c{c0}"
        t0 = time.monotonic()
        cmd = ["ncu", "--profile-from-start", "off", "--nvtx", "--set", "full",
               "--target-processes", "all", "-f", "-o", str(rep), sys.executable,
               __file__, "ncu-worker", "--out", str(tmp), "--start", str(c0), "--count", str(n)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, left))
            print(f"{time.monotonic() - start:6.1f}s chunk {c0}+{n} rc {p.returncode} "
                  f"{p.stdout[-600:]} {p.stderr[-600:]}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"chunk {c0} ran out of time", flush=True)
            break
        imports = (("ncu_raw.csv.gz", [["--page", "raw"]]),
                   ("ncu_nvtx.csv.gz", [["--page", "raw", "--print-nvtx-rename", "kernel"],
                                        ["--page", "raw", "--nvtx", "--print-nvtx-rename",
                                         "kernel"]]))
        for name, variants in imports:
            for page in variants:
                q = subprocess.run(["ncu", "--import", f"{rep}.ncu-rep", "--csv", *page],
                                   capture_output=True, text=True)
                if q.returncode == 0 and q.stdout:
                    with gzip.open(out / name, "at") as f:
                        f.write(f"# chunk {c0} {n}\n" + q.stdout)
                    break
                print(f"import {name} {page}: rc {q.returncode} {q.stderr[-400:]}", flush=True)
        per_chunk = time.monotonic() - t0
        print(f"{time.monotonic() - start:6.1f}s chunk done in {per_chunk:.1f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("models", "kernels", "ncu", "ncu-worker", "list"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--zoo", default="h100/cuda/fp16,h100/cuda/fp16/b32")
    ap.add_argument("--synthetic", type=int, default=120)
    ap.add_argument("--retest", type=int, default=20)
    ap.add_argument("--retest-s", type=float, default=90)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--warm-s", type=float, default=0.3)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--retest-every", type=int, default=0,
                    help="kernels: re-measure every n-th workload only (a retest pass)")
    ap.add_argument("--replay-ms", type=float, default=0.5)
    ap.add_argument("--max-copies", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=50)
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.phase == "list":
        for w in workloads(a.count):
            print(json.dumps(w))
        return
    import torch

    torch.backends.cudnn.benchmark = False
    {"models": run_models, "kernels": run_kernels, "ncu": run_ncu,
     "ncu-worker": run_ncu_worker}[a.phase](a)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
