"""Dev script: a pytorch-cuda measuring campaign on the device machine (runs there).

    python scripts/cuda_campaign.py --out $OUT --zoo h100/cuda/fp16,h100/cuda/fp16/b32 \
        --synthetic 1200 --synthetic-target h100/cuda/fp16 --seed 13 --budget-s 500 --retest 50

Order: environment -> zoo models on each `--zoo` target -> sampled models of
`search_space/synthetic_cnn.yaml` (seed `--seed`, indices from `--start`) until `--budget-s`
seconds have passed -> `--retest` of the measured synthetic models (spread over the run) and
every zoo model of the first zoo target measured again, for the test-retest noise figures.
Graphs are built by `--workers` processes. Each model is one JSON line (figures, kernels per op,
clocks, architecture) appended and flushed at once, so a killed run keeps what it measured:
`<out>/zoo.jsonl`, `synthetic.jsonl`, `retest.jsonl`, and `env.json`. `--space regnet_cnn` samples another space of
`search_space/` (the JSON lines still say "synthetic": sampled, not zoo). `scripts/cuda_assemble.py`
turns them into datasets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred import sampler, zoo  # noqa: E402
from latpred.profile.cuda import (CudaProtocol, environment, measure_many,  # noqa: E402
                                  protocol_dict)
from latpred.target import parse_target  # noqa: E402

SPACES = Path(__file__).resolve().parent.parent / "search_space"


def _build(arch: dict):
    try:
        return arch, sampler.build_graph(arch), ""
    except Exception as err:
        return arch, None, f"{type(err).__name__}: {err}"


def _model_id(arch: dict) -> str:
    return arch.get("zoo") or sampler.model_id(arch["space"], arch["seed"], arch["index"])


def _run(f, items, target, protocol, start, kind, kernels=True) -> list[dict]:
    """Measure [(arch, graph)] on `target` as one profiled group; append their JSON lines."""
    ok = [(a, g) for a, g in items if g is not None]
    try:
        results = measure_many([g for _, g in ok], target, protocol, kernels=kernels)
    except Exception as err:
        results = [{"status": "failed", "error": f"{type(err).__name__}: {err}"[:500],
                    "trace": traceback.format_exc()[-1500:]}] * len(ok)
    by_id = {id(g): r for (_, g), r in zip(ok, results)}
    rows = []
    for arch, graph in items:
        row = {"model_id": _model_id(arch), "arch": arch, "target": str(target), "kind": kind,
               "t": round(time.monotonic() - start, 2)}
        row.update(by_id.get(id(graph)) if graph is not None else
                   {"status": "failed", "error": "build failed"})
        for k in row.get("kernels", []):
            k[1] = k[1][:200]       # templated names: the first 200 characters tell them apart
        f.write(json.dumps(row) + "\n")
        rows.append(row)
    f.flush()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--zoo", default="", help="comma-separated CUDA targets for the zoo")
    ap.add_argument("--zoo-models", default="", help="comma-separated zoo names (default all)")
    ap.add_argument("--zoo-retest", action="store_true",
                    help="the zoo pass re-measures models shipped before: write it as retests")
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--synthetic-target", default="h100/cuda/fp16")
    ap.add_argument("--space", default="synthetic_cnn",
                    help="the search_space/<name>.yaml the sampled models are drawn from")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--retest", type=int, default=50)
    ap.add_argument("--retest-s", type=float, default=60)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--group", type=int, default=16, help="models per profiler session")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--replay-warmup", type=int, default=30)
    ap.add_argument("--gzip-into", default="",
                    help="at the end (also after an error), gzip env.json and the JSONL files "
                         "into this folder: a device call brings back files of at most 16 MiB, "
                         "and a campaign's synthetic.jsonl outgrows that (session 7 lost one)")
    a = ap.parse_args()
    try:
        campaign(a)
    finally:
        if a.gzip_into:
            _gzip_into(Path(a.out), Path(a.gzip_into))


def _gzip_into(src: Path, dst: Path) -> None:
    import gzip
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.json*"):
        if f.suffix == ".jsonl":
            with open(f, "rb") as fin, gzip.open(dst / (f.name + ".gz"), "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copy(f, dst / f.name)


def campaign(a: argparse.Namespace) -> None:
    start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    protocol = CudaProtocol(passes=a.passes, replays=a.replays, warmup=a.warmup,
                            replay_warmup=a.replay_warmup)
    import torch

    torch.backends.cudnn.benchmark = False
    env = {**environment(), "protocol": protocol_dict(protocol), "argv": sys.argv[1:],
           "seed": a.seed, "space": a.space, "date": time.strftime("%Y-%m-%d")}
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)

    zoo_targets = [parse_target(t) for t in a.zoo.split(",") if t]
    names = [n for n in a.zoo_models.split(",") if n] or list(zoo.ZOO)
    zoo_graphs = {n: zoo.build(n) for n in names} if zoo_targets else {}
    zoo_kind = "retest-zoo" if a.zoo_retest else "zoo"
    with open(out / ("retest.jsonl" if a.zoo_retest else "zoo.jsonl"), "a") as f:
        for target in zoo_targets:
            for i in range(0, len(names), 4):
                if time.monotonic() - start > a.budget_s - a.retest_s:
                    break
                group = [(zoo.arch(n), zoo_graphs[n]) for n in names[i:i + 4]]
                for r in _run(f, group, target, protocol, start, zoo_kind):
                    print(f"{time.monotonic() - start:7.1f}s zoo {target} {r['model_id']} "
                          f"{r['status']} {r.get('latency_ms', 0):.4f} ms spread "
                          f"{r.get('spread', 0):.4f} {r.get('kernel_source', '')} "
                          f"{r.get('error', '')}", flush=True)

    target = parse_target(a.synthetic_target)
    space = sampler.load_space(SPACES / f"{a.space}.yaml")
    archs = [sampler.sample_one(space, a.seed, i) for i in range(a.start, a.start + a.synthetic)]
    done = []
    stop = a.budget_s - a.retest_s
    group = []
    with open(out / "synthetic.jsonl", "a") as f, Pool(a.workers) as pool:
        for arch, graph, err in pool.imap(_build, archs, chunksize=4):
            if time.monotonic() - start > stop:
                break
            if err:
                print("build failed", err, flush=True)
            group.append((arch, graph))
            if len(group) == a.group:
                rows = _run(f, group, target, protocol, start, "synthetic")
                done += [(ar, g, r) for (ar, g), r in zip(group, rows)]
                group = []
                print(f"{time.monotonic() - start:7.1f}s synthetic {len(done)} "
                      f"{rows[-1].get('latency_ms', 0):.4f} ms "
                      f"{rows[-1].get('time_s')} s + {rows[-1].get('profile_s')} s", flush=True)
        pool.terminate()
    print(f"synthetic measured: {len(done)}", flush=True)

    step = max(1, len(done) // max(1, a.retest))
    picked = [(ar, g) for ar, g, _ in done[::step][:a.retest]]
    with open(out / "retest.jsonl", "a") as f:
        for i in range(0, len(picked), a.group):
            if time.monotonic() - start > a.budget_s:
                break
            _run(f, picked[i:i + a.group], target, protocol, start, "retest")
        for i in range(0, len(zoo_graphs) if not a.zoo_retest else 0, 4):
            if time.monotonic() - start > a.budget_s + a.retest_s:
                break
            group = [(zoo.arch(n), zoo_graphs[n]) for n in names[i:i + 4]]
            _run(f, group, zoo_targets[0], protocol, start, "retest-zoo")
    print(f"done in {time.monotonic() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
