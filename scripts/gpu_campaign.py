"""Measure synthetic models end to end and per kernel with LiteRT's GPU accelerator.

Three steps, because the models are too big to carry to the device machine (a 7x7 convolution
with 400 channels alone holds 31 MB of weights) but are regenerated there byte for byte from
their seeds:

  plan      (here)    sample the space, write each model and its kernels' sub-models in memory,
                      record file hashes and config hashes -> plan.json (small, carried)
  measure   (device)  rebuild every model from the plan, check its hash, measure: several
                      worker processes compile while one at a time times, alone on the GPU
                      (latpred.profile.gpu_lock.GpuLock);
                      each distinct kernel configuration once; then a seeded 5% of the models
                      again, for the noise floor -> results.jsonl + summary.json under --out
  assemble  (here)    plan + results -> a latpred dataset (features computed here)

  python scripts/gpu_campaign.py plan --n 320 --seed 7 --out .gpu_campaign/plan.json
  . scripts/device_gpu.sh && python3 scripts/gpu_campaign.py measure \
        --plan .gpu_campaign/plan.json --out $OUT --workers 12 --budget-s 480
  python scripts/gpu_campaign.py assemble --plan .gpu_campaign/plan.json \
        --results out/results.jsonl --summary out/summary.json --out datasets/h100-gpu-synthetic
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from latpred.profile import litert_gpu as lg  # noqa: E402
from latpred.profile.gpu_lock import GpuLock  # noqa: E402
from latpred.profile.worker import Worker  # noqa: E402

TARGET = "h100/gpu/fp16"
WRITE_SEED = 0  # weights of every model file; latency does not depend on their values


# -- building models from the plan (here and on the device) ---------------------------------------
def model_bytes(arch: dict) -> bytes:
    from latpred.sampler import build_graph
    from latpred.tflite import write_tflite

    return write_tflite(build_graph(arch), precision="fp32", seed=WRITE_SEED)


def plans_of(data: bytes, target_name: str, with_features: bool = False):
    """The kernel plans of a model file, exactly as the CPU profiler cuts them (read back)."""
    from latpred.profile.kernels import kernel_plans
    from latpred.target import parse_target
    from latpred.tflite import read_tflite

    return kernel_plans(read_tflite(data), parse_target(target_name), with_features=with_features)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- plan -------------------------------------------------------------------------------------------
def plan(space_path: str, n: int, seed: int, target_name: str, out: Path) -> None:
    from tqdm import tqdm


    models, seen = [], set()
    for index, (model_id, space_name, arch) in enumerate(tqdm(_planned_archs(space_path, n, seed),
                                                             desc="plan", unit="model")):
        data = model_bytes(arch)
        kernels = []
        for p in plans_of(data, target_name):
            kernels.append({"index": p.index, "type": p.kernel.type, "ops": p.ops,
                            "config_hash": p.config_hash, "first": p.config_hash not in seen})
            seen.add(p.config_hash)
        models.append({"model_id": model_id, "seed": seed,
                       "index": index, "space": space_name, "arch": arch,
                       "file_hash": sha256(data), "bytes": len(data), "kernels": kernels})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target": target_name, "space": space_path, "seed": seed,
                               "write_seed": WRITE_SEED, "models": models}))
    n_k = sum(len(m["kernels"]) for m in models)
    print(f"{len(models)} models, {n_k} kernels, {len(seen)} distinct configurations -> {out}")


def _planned_archs(space_path: str, n: int, seed: int):
    """(model_id, space name, arch) of the models to plan: n samples of a space, or the zoo."""
    from latpred import sampler, zoo

    if space_path == "zoo":  # every real-world model, as datasets/host-cpu-zoo holds them
        return [(name, "zoo", zoo.arch(name)) for name in sorted(zoo.ZOO)]
    space = sampler.load_space(space_path)
    return [(sampler.model_id(space.name, seed, i), space.name, sampler.sample_one(space, seed, i))
            for i in range(n)]


# -- measure: what one worker process does ----------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _environment():
    # One LiteRT environment (one GPU device) per worker process, reused for every batch.
    return lg.new_environment()


def build_items(req: dict) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """Rebuild one model and pick the wanted items (e2e and/or kernels); notes on hash drift."""
    data = model_bytes(req["arch"])
    items: list[tuple[str, bytes]] = []
    notes: dict[str, str] = {}
    if req["e2e"]:
        items.append((f"e2e:{req['model_id']}", data))
        if sha256(data) != req["file_hash"]:
            notes[items[-1][0]] = "file hash differs from the plan"
    if req["kernels"]:
        wanted = dict(req["kernels"])
        for p in plans_of(data, req["target"]):
            if p.index in wanted:
                items.append((f"cfg:{wanted[p.index]}", p.model_bytes))
                if p.config_hash != wanted[p.index]:
                    notes[items[-1][0]] = "config hash differs from the plan"
    return items, notes


def measure_items(req: dict, items: list[tuple[str, bytes]], notes: dict[str, str]) -> list[dict]:
    """Measure built items as one batch in this process; one result row per item."""
    protocol = lg.GpuProtocol(**req["protocol"])
    with GpuLock(req["lock"]).shared():  # creating the environment opens a GPU device
        environment = _environment()
    results = lg.measure_batch(items, protocol, lock_path=req["lock"], precision=req["precision"],
                               accelerator=req["accelerator"], environment=environment,
                               together=req["mode"] == "together")
    rows = []
    for r in results:
        row = {"item": r.key, "tag": req["tag"], **lg.stats_row(r)}
        if r.estimates is not None:
            row.update(pass_mean_median_ms=r.estimates.pass_mean_median_ms,
                       trimmed_mean_ms=r.estimates.trimmed_mean_ms,
                       pass_means_ms=list(r.estimates.pass_means_ms))
        if r.key in notes:
            row["hash_note"] = notes[r.key]
        rows.append(row)
    return rows


def measure_request(req: dict) -> list[dict]:
    """What a worker process does with one request: build its items and measure them."""
    return measure_items(req, *build_items(req))


# -- measure: the driver ----------------------------------------------------------------------------
def batches(models: list[dict], tag: str, all_kernels: bool,
            done: set[str] = frozenset()) -> list[dict]:
    """One request per model: its e2e model and its kernels' configurations.

    In the main pass a configuration goes with the first model that holds it, and items in
    `done` (measured by an earlier call) are left out; a retest takes all of a model's items.
    """
    out, taken = [], set(done)
    for m in models:
        kernels = []
        for k in m["kernels"]:
            key = f"cfg:{k['config_hash']}"
            if all_kernels or key not in taken:
                if key not in {f"cfg:{h}" for _, h in kernels}:
                    kernels.append((k["index"], k["config_hash"]))
                taken.add(key)
        e2e = all_kernels or f"e2e:{m['model_id']}" not in done
        if e2e or kernels:
            out.append({"model_id": m["model_id"], "arch": m["arch"],
                        "file_hash": m["file_hash"], "e2e": e2e, "kernels": kernels,
                        "tag": tag})
    return out


def done_items(paths: list[Path]) -> dict[str, list[str]]:
    """item -> tags of the rows earlier calls wrote (results.jsonl files)."""
    done: dict[str, list[str]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done.setdefault(row["item"], []).append(row.get("tag", "main"))
    return done


def singletons(req: dict) -> list[dict]:
    """A failed batch split into one request per item, so one bad model fails alone."""
    out = []
    if req["e2e"]:
        out.append({**req, "kernels": []})
    out.extend({**req, "e2e": False, "kernels": [k]} for k in req["kernels"])
    return out


def item_keys(req: dict) -> list[str]:
    keys = [f"e2e:{req['model_id']}"] if req["e2e"] else []
    return keys + [f"cfg:{h}" for _, h in req["kernels"]]


class Campaign:
    """Feeds requests to `workers` worker processes and appends every row to a JSONL file."""

    def __init__(self, out: Path, workers: int, common: dict, timeout_s: float):
        self.common, self.timeout_s, self.n_workers = common, timeout_s, workers
        self.sink = (out / "results.jsonl").open("a")
        self.lock = threading.Lock()
        self.local = threading.local()  # each pool thread drives its own worker process
        self.workers: list[Worker] = []
        self.pool = ThreadPoolExecutor(workers)
        self.counts = {"rows": 0, "failed": 0, "timeout": 0, "split": 0}
        self.recorded: set[str] = set()
        self.deadline = float("inf")

    def _worker(self):
        if not hasattr(self.local, "worker"):
            self.local.worker = Worker(measure_request, timeout_s=self.timeout_s)
            with self.lock:
                self.workers.append(self.local.worker)
        return self.local.worker

    def _run(self, req: dict) -> list[dict] | None:
        if time.time() > self.deadline:  # queued past the deadline: leave it for the next call
            return None
        outcome = self._worker().call({**self.common, **req})
        if outcome.ok:
            return outcome.value
        if len(item_keys(req)) > 1:  # retry item by item: only the culprit fails
            with self.lock:
                self.counts["split"] += 1
            return [row for single in singletons(req) for row in self._run(single) or []]
        return [{"item": key, "tag": req["tag"], "status": outcome.status,
                 "error": outcome.error} for key in item_keys(req)]

    def _record(self, rows: list[dict]) -> None:
        with self.lock:
            for row in rows:
                self.recorded.add(row["item"])
                self.sink.write(json.dumps(row) + "\n")
                self.counts["rows"] += 1
                if row["status"] in ("failed", "timeout"):
                    self.counts[row["status"]] += 1
            self.sink.flush()

    def run(self, requests: list[dict], deadline: float, label: str) -> int:
        """Run requests until done or `deadline` (time.time()); returns how many were run."""
        self.deadline = deadline
        pending, ran, done, t0 = set(), 0, 0, time.time()
        queue = list(requests)
        while queue or pending:
            while queue and len(pending) < 2 * self.n_workers and time.time() < deadline:
                pending.add(self.pool.submit(self._run, queue.pop(0)))
            if not pending:
                break
            finished, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            for fut in finished:
                rows = fut.result()
                done += 1
                if rows is None:
                    continue
                self._record(rows)
                ran += 1
                if done % 10 == 0 or done == len(requests):
                    rate = done / max(time.time() - t0, 1e-9)
                    eta = (len(requests) - done) / rate if rate else float("nan")
                    print(f"{label}: {done}/{len(requests)} requests, {self.counts}, "
                          f"eta {eta:.0f} s", flush=True)
        return ran

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for w in self.workers:
            w.close()
        self.sink.close()


def measure(plan_path: Path, out: Path, workers: int, budget_s: float, retest: float,
            reserve_s: float, protocol: lg.GpuProtocol, accelerator: str, limit: int | None,
            timeout_s: float, mode: str, done_paths: list[Path]) -> None:
    from latpred.profile.machine import machine_fields
    from latpred.profile.noise import retest_sample

    start = time.time()
    plan_data = json.loads(plan_path.read_text())
    models = plan_data["models"][:limit] if limit else plan_data["models"]
    out.mkdir(parents=True, exist_ok=True)
    common = {"target": plan_data["target"], "precision": plan_data["target"].split("/")[2],
              "accelerator": accelerator, "protocol": protocol.as_dict(), "mode": mode,
              "lock": os.path.join(tempfile.gettempdir(), f"latpred-gpu-{os.getpid()}.lock")}
    earlier = done_items(done_paths)
    main_done = {k for k, tags in earlier.items() if "main" in tags}
    camp = Campaign(out, workers, common, timeout_s)
    try:
        requests = batches(models, "main", all_kernels=False, done=main_done)
        n_main = camp.run(requests, start + budget_s - reserve_s, "main")
        finished = main_done | camp.recorded
        ran = [m["model_id"] for m in models if f"e2e:{m['model_id']}" in finished]
        sample = set(retest_sample(ran, retest, plan_data["seed"]))
        again = [m for m in models if m["model_id"] in sample
                 and "retest" not in earlier.get(f"e2e:{m['model_id']}", [])]
        n_again = camp.run(batches(again, "retest", all_kernels=True) if retest > 0 else [],
                           start + budget_s, "retest")
    finally:
        camp.close()
    summary = {"target": plan_data["target"], "accelerator": accelerator, "mode": mode,
               "runtime_version": lg.runtime_version(), "protocol": protocol.as_dict(),
               "workers": workers, "models_planned": len(plan_data["models"]),
               "items_done_before": len(main_done), "requests": n_main,
               "retest_requests": n_again, "retest_models": sorted(sample),
               "counts": camp.counts, "wall_s": round(time.time() - start, 1),
               "gpu": _nvidia_smi(), **machine_fields(),
               "date": time.strftime("%Y-%m-%d")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "retest_models"}))


def _nvidia_smi() -> str:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no nvidia-smi"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--space", default="search_space/synthetic_cnn.yaml",
                   help="a search-space YAML, or 'zoo' for every real-world model")
    p.add_argument("--n", type=int, default=320)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--target", default=TARGET)
    p.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("measure")
    m.add_argument("--plan", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    m.add_argument("--budget-s", type=float, default=480)
    m.add_argument("--reserve-s", type=float, default=60, help="time kept for the retest")
    m.add_argument("--retest", type=float, default=0.05)
    m.add_argument("--accelerator", default="gpu", choices=lg.ACCELERATORS)
    m.add_argument("--limit", type=int, default=None, help="only the first N models")
    m.add_argument("--done", type=Path, nargs="*", default=[],
                   help="results.jsonl of earlier calls: their items are not measured again")
    m.add_argument("--timeout-s", type=float, default=90)
    m.add_argument("--mode", default="together", choices=("together", "alone"),
                   help="time a model's items interleaved (together) or one at a time")
    m.add_argument("--warmup", type=int, default=10)
    m.add_argument("--warmup-s", type=float, default=0.0,
                   help="seconds of untimed back-to-back calls before timing (GPU clocks ramp up)")
    m.add_argument("--rewarm-s", type=float, default=0.0,
                   help="the same for a model timed right after another of its batch")
    m.add_argument("--passes", type=int, default=5)
    m.add_argument("--calls", type=int, default=10)
    m.add_argument("--pass-ms", type=float, default=10.0)
    m.add_argument("--max-calls", type=int, default=4000)
    m.add_argument("--estimator", default=lg.GpuProtocol.estimator, choices=lg.ESTIMATORS)
    a = sub.add_parser("assemble")
    a.add_argument("--plan", type=Path, required=True)
    a.add_argument("--results", type=Path, nargs="+", required=True)
    a.add_argument("--summary", type=Path, nargs="+", required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--contended-call-ms", type=float, default=0.15,
                   help="a kernel whose host submission took longer was disturbed")
    args = ap.parse_args()
    if args.cmd == "plan":
        plan(args.space, args.n, args.seed, args.target, args.out)
    elif args.cmd == "measure":
        protocol = lg.GpuProtocol(warmup=args.warmup, warmup_s=args.warmup_s,
                                  rewarm_s=args.rewarm_s, passes=args.passes,
                                  calls=args.calls,
                                  pass_ms=args.pass_ms, max_calls=args.max_calls,
                                  estimator=args.estimator)
        measure(args.plan, args.out, args.workers, args.budget_s, args.retest, args.reserve_s,
                protocol, args.accelerator, args.limit, args.timeout_s, args.mode, args.done)
    else:
        from gpu_assemble import assemble

        assemble(args.plan, args.results, args.summary, args.out, args.contended_call_ms)


if __name__ == "__main__":
    main()
