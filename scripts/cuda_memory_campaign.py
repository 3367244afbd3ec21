"""Dev script: PyTorch caching-allocator ground truth on the device machine (runs there).

    python scripts/cuda_memory_campaign.py --out $OUT --synthetic 300 --seed 13 --budget-s 300

For each model (the zoo, then `--synthetic` samples of search_space/synthetic_cnn.yaml, seed
`--seed`) and each target of `--targets` (default fp16/fp32 at batch 1 and 32), in one process:

1. `torch.cuda.empty_cache()`, so only the persistent blocks made by the warm-up at the start
   (cuBLAS/cuBLASLt workspaces, ...) stay; `base_*` = memory_allocated / memory_reserved;
2. the allocator's history on (`_record_memory_history(context=None)`, cleared), then
   `latpred.profile.cuda.prepare` (the module of `to_torch` on the GPU in the target's
   precision, random weights, NHWC inputs): `load_*` (`load_stats`: allocated bytes, peak,
   allocations and frees so far, which place each op's entries in the trace);
3. `reset_peak_memory_stats`, one inference under `torch.no_grad()`, synchronize: `cold_*`
   (`max_memory_allocated`, `max_memory_reserved`); a forward hook on every layer records
   (allocated bytes, peak so far, allocations so far, frees so far) after each op;
4. the output dropped, `reset_peak_memory_stats`, a second inference: `warm_*`;
5. the allocator's trace since step 2 (action, address, requested bytes) kept in the row.

Rows are JSON lines in `<out>/memory.jsonl.gz`, flushed per model; `<out>/env.json` holds the
versions and the warm-up's trace. `scripts/cuda_memory_assemble.py` turns them into
datasets/h100-cuda-memory.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import sys
import time
import traceback
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred import sampler, zoo  # noqa: E402
from latpred.profile.cuda import environment, prepare  # noqa: E402
from latpred.target import parse_target  # noqa: E402

SPACE = Path(__file__).resolve().parent.parent / "search_space" / "synthetic_cnn.yaml"
TARGETS = "h100/cuda/fp16,h100/cuda/fp32,h100/cuda/fp16/b32,h100/cuda/fp32/b32"
_ACTIONS = {"alloc": "a", "free_requested": "f", "free_completed": "c", "segment_alloc": "s",
            "segment_free": "S", "segment_map": "m", "segment_unmap": "u", "oom": "o",
            "snapshot": "n", "user_defined": "d"}


def _build(arch: dict):
    try:
        return arch, sampler.build_graph(arch), ""
    except Exception as err:
        return arch, None, f"{type(err).__name__}: {err}"


def _history(torch, on: bool) -> None:
    """The allocator's trace on (cleared, no stack context) or off."""
    mem = torch.cuda.memory
    if not on:
        mem._record_memory_history(None)
        return
    try:
        mem._record_memory_history("all", context=None, stacks="python", clear_history=True)
    except TypeError:      # an older torch without clear_history: off then on clears it
        mem._record_memory_history(None)
        mem._record_memory_history("all", context=None, stacks="python")


def _stats(torch) -> tuple[int, int, int, int]:
    s = torch._C._cuda_memoryStats(0)
    return (s["allocated_bytes"]["all"]["current"], s["allocated_bytes"]["all"]["peak"],
            s["allocation"]["all"]["allocated"], s["allocation"]["all"]["freed"])


def _trace(torch) -> list:
    snap = torch.cuda.memory._snapshot()
    traces = snap["device_traces"][0] if snap["device_traces"] else []
    return [[_ACTIONS.get(e["action"], e["action"]), e["addr"], e["size"]] for e in traces]


def _segments(torch) -> list:
    return [[s["address"], s["total_size"], s["segment_type"],
             [[b["size"], b["state"]] for b in s["blocks"]]]
            for s in torch.cuda.memory._snapshot()["segments"]]


def warm_up(torch) -> dict:
    """Make the process's persistent allocations (cuBLAS / cuBLASLt workspaces, cuDNN handle)
    before any model, each recorded, so every model starts from the same allocator state."""
    import torch.nn.functional as F

    _history(torch, True)
    steps = []
    for dtype in (torch.float16, torch.float32):
        for name, fn in (("linear", lambda: F.linear(torch.randn(4, 64, device="cuda", dtype=dtype),
                                                     torch.randn(32, 64, device="cuda", dtype=dtype),
                                                     torch.randn(32, device="cuda", dtype=dtype))),
                         ("conv", lambda: F.conv2d(torch.randn(1, 8, 16, 16, device="cuda",
                                                               dtype=dtype).to(
                             memory_format=torch.channels_last),
                             torch.randn(8, 8, 3, 3, device="cuda", dtype=dtype).to(
                                 memory_format=torch.channels_last)))):
            before = torch.cuda.memory_allocated()
            with torch.no_grad():
                y = fn()
            torch.cuda.synchronize()
            del y
            steps.append({"step": f"{name}-{dtype}", "before": before,
                          "after": torch.cuda.memory_allocated()})
    trace = _trace(torch)
    _history(torch, False)
    gc.collect()
    torch.cuda.empty_cache()
    return {"steps": steps, "trace": trace, "segments": _segments(torch),
            "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def measure(torch, graph, target) -> dict:
    gc.collect()
    torch.cuda.empty_cache()
    row = {"base_allocated": torch.cuda.memory_allocated(),
           "base_reserved": torch.cuda.memory_reserved()}
    _history(torch, True)
    try:
        module, inputs = prepare(graph, target)
        torch.cuda.synchronize()
        row.update(load_allocated=torch.cuda.memory_allocated(),
                   load_reserved=torch.cuda.memory_reserved(), load_stats=_stats(torch))
        per_op: list = []
        hooks = [layer.register_forward_hook(lambda *_: per_op.append(_stats(torch)))
                 for layer in module.layers]
        with torch.no_grad():
            torch.cuda.reset_peak_memory_stats()
            out = module(*inputs)
            torch.cuda.synchronize()
            row.update(cold_peak_allocated=torch.cuda.max_memory_allocated(),
                       cold_peak_reserved=torch.cuda.max_memory_reserved(),
                       cold_after_allocated=torch.cuda.memory_allocated(), cold_ops=per_op)
            for h in hooks:
                h.remove()
            del out
            torch.cuda.reset_peak_memory_stats()
            out = module(*inputs)
            torch.cuda.synchronize()
            row.update(warm_peak_allocated=torch.cuda.max_memory_allocated(),
                       warm_peak_reserved=torch.cuda.max_memory_reserved(),
                       warm_after_allocated=torch.cuda.memory_allocated())
            del out
        row["trace"] = _trace(torch)
        row["status"] = "ok"
        del module, inputs
    except Exception as err:   # one bad model must not end the campaign
        row.update(status="failed", error=f"{type(err).__name__}: {err}"[:500],
                   trace_back=traceback.format_exc()[-1500:])
    finally:
        _history(torch, False)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", default=TARGETS)
    ap.add_argument("--zoo-models", default="",
                    help="comma-separated zoo names (default all; 'none': no zoo model)")
    ap.add_argument("--synthetic", type=int, default=300)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--procs", type=int, default=12, help="measuring processes (one CUDA "
                    "context and allocator each; cuDNN's first call of a shape is CPU-bound)")
    a = ap.parse_args()
    start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.backends.cudnn.benchmark = False    # as scripts/cuda_campaign.py measures
    targets = [parse_target(t) for t in a.targets.split(",") if t]
    env = {**environment(), "argv": sys.argv[1:], "seed": a.seed, "space": "synthetic_cnn",
           "date": time.strftime("%Y-%m-%d"), "targets": [str(t) for t in targets]}
    env["warm_up"] = warm_up(torch)
    (out / "env.json").write_text(json.dumps(env))
    print(json.dumps({k: v for k, v in env.items() if k != "warm_up"}), flush=True)
    print("warm-up", env["warm_up"]["steps"], env["warm_up"]["allocated"], flush=True)

    names = [n for n in a.zoo_models.split(",") if n] if a.zoo_models != "none" else []
    archs = [zoo.arch(n) for n in (names or ([] if a.zoo_models == "none" else list(zoo.ZOO)))]
    space = sampler.load_space(SPACE)
    archs += [sampler.sample_one(space, a.seed, i) for i in range(a.start, a.start + a.synthetic)]
    n = 0
    ctx = get_context("spawn")
    with gzip.open(out / "memory.jsonl.gz", "at") as f, \
            ctx.Pool(a.procs, initializer=_init, initargs=(a.targets,)) as pool:
        for rows in pool.imap(_one, archs, chunksize=1):
            for row in rows:
                f.write(json.dumps(row) + "\n")
            f.flush()
            n += 1
            row = rows[-1]
            if n % 20 == 0 or row["source"] == "zoo":
                print(f"{time.monotonic() - start:6.1f}s {n} {row['model_id']} {row['status']} "
                      f"{row.get('cold_peak_allocated', 0)} {row.get('time_s')}", flush=True)
            if time.monotonic() - start > a.budget_s:
                print("budget reached", flush=True)
                break
        pool.terminate()
    print(f"done: {n} models in {time.monotonic() - start:.1f}s", flush=True)


_WORKER: dict = {}


def _init(targets: str) -> None:
    """A measuring process: its own CUDA context and allocator, warmed up as the main one."""
    import torch

    torch.backends.cudnn.benchmark = False
    _WORKER["torch"] = torch
    _WORKER["targets"] = [parse_target(t) for t in targets.split(",") if t]
    _WORKER["warm_up"] = warm_up(torch)


def _one(arch: dict) -> list[dict]:
    """The rows of one model, one per target."""
    torch = _WORKER["torch"]
    mid = arch.get("zoo") or sampler.model_id(arch["space"], arch["seed"], arch["index"])
    source = "zoo" if arch.get("zoo") else "synthetic"
    _, graph, err = _build(arch)
    rows = []
    for target in _WORKER["targets"]:
        row = {"model_id": mid, "source": source, "arch": arch, "target": str(target),
               "proc_allocated": _WORKER["warm_up"]["allocated"]}
        if graph is None:
            row.update(status="failed", error=err)
        else:
            t0 = time.perf_counter()
            row.update(measure(torch, graph, target))
            row["time_s"] = round(time.perf_counter() - t0, 3)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
