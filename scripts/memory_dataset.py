"""Measure the host-CPU memory dataset (datasets/host-cpu-memory): for each model, LiteRT's own
arena (built-in kernels and XNNPACK, read back from tensor addresses) and the peak resident
memory of a fresh process that loads, allocates and runs it with XNNPACK, minus a trivial
model's.

    python scripts/memory_dataset.py --out datasets/host-cpu-memory --models out/memory-models \
        --n-synthetic 60 --n-converter 40
    python scripts/memory_dataset.py --precision int8 --out datasets/host-cpu-memory-int8 \
        --models out/memory-models-int8 --n-synthetic 40 --n-converter 0 --no-corpus

Models: a sample of search_space/synthetic_cnn.yaml and converter_cnn.yaml (`latpred sample`),
the zoo (`latpred zoo export-all`) and the committed converter fixtures (tests/fixtures/corpus).
Not a timing campaign, but it runs models: wait while /tmp/CAMPAIGN_RUNNING exists. Resumes:
models already in the output are skipped.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latpred.errors import MeasurementError  # noqa: E402
from latpred.memory.measure import baseline_graph, baseline_rss, peak_rss  # noqa: E402
from latpred.profile.machine import cpu_id  # noqa: E402
from latpred.tflite import read_tflite, write_tflite  # noqa: E402


def _models(models: Path, n_syn: int, n_conv: int, zoo: bool, seed: int, precision: str,
            corpus: bool) -> list[dict]:
    from latpred.sampler import load_space, write_samples

    fixtures = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.tflite")) if corpus else []
    out = [{"path": p, "source": "corpus", "arch": ""} for p in fixtures]
    for space, n, tag in (("synthetic_cnn", n_syn, "synthetic"), ("converter_cnn", n_conv,
                                                                    "converter")):
        d = models / tag
        if n and not (d.exists() and len(list(d.glob("*.tflite"))) >= n):
            write_samples(load_space(ROOT / "search_space" / f"{space}.yaml"), n, seed, d,
                          precision)
        for p in sorted(d.glob("*.tflite"))[:n]:
            out.append({"path": p, "source": tag, "arch": p.with_suffix(".json").read_text()})
    if zoo:
        from latpred.zoo import write_models
        d = models / "zoo"
        if not d.exists():
            write_models(d, precision=precision, seed=seed)
        for p in sorted(d.glob("*.tflite")):
            out.append({"path": p, "source": "zoo", "arch": p.with_suffix(".json").read_text()})
    return out


def _trivial(models: Path) -> Path:
    path = models / "trivial.tflite"
    if not path.exists():
        write_tflite(baseline_graph(), path)
    return path


def _arena(path: Path, kernels: str) -> tuple[int, int]:
    """In a child process: LiteRT keeps global state (XNNPACK caches) we do not want to share."""
    code = ("import json,sys;from latpred.memory.measure import runtime_arena as r;"
            "a=r(open(sys.argv[1],'rb').read(),sys.argv[2]);print(json.dumps([a.arena_bytes,"
            "a.usable]))")
    out = subprocess.run([sys.executable, "-c", code, str(path), kernels], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    if out.returncode != 0:
        print(f"  arena reading failed ({kernels}): "
              f"{(out.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
        return -1, -1
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="datasets/host-cpu-memory")
    ap.add_argument("--models", default="out/memory-models")
    ap.add_argument("--n-synthetic", type=int, default=60)
    ap.add_argument("--n-converter", type=int, default=40)
    ap.add_argument("--no-zoo", action="store_true")
    ap.add_argument("--no-corpus", action="store_true",
                    help="Leave out the committed converter fixtures (fp32 files).")
    ap.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                    help="Precision latpred writes the sampled and zoo models in.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="Measure at most this many (tests).")
    args = ap.parse_args()
    if Path("/tmp/CAMPAIGN_RUNNING").exists():
        sys.exit("A timing campaign is running (/tmp/CAMPAIGN_RUNNING); try later.")
    out, models = Path(args.out), Path(args.models)
    out.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    table = out / "models.parquet"
    done = pd.read_parquet(table) if table.exists() else pd.DataFrame()
    seen = set(done["model_id"]) if len(done) else set()
    trivial = _trivial(models)
    base = baseline_rss(str(trivial))
    rows = done.to_dict("records") if len(done) else []
    todo = _models(models, args.n_synthetic, args.n_converter, not args.no_zoo, args.seed,
                   args.precision, not args.no_corpus)
    if args.limit:
        todo = todo[:args.limit]
    t0 = time.time()
    for k, m in enumerate(todo):
        mid = f"{m['source']}/{m['path'].stem}"
        if mid in seen:
            continue
        if Path("/tmp/CAMPAIGN_RUNNING").exists():
            print("campaign started: stopping (rerun to resume)")
            break
        graph = read_tflite(m["path"])
        ab, usable = _arena(m["path"], "builtin")
        ax, _ = _arena(m["path"], "xnnpack")
        try:
            rss = peak_rss(str(m["path"]), "xnnpack")
        except MeasurementError as err:      # recorded, not fatal: the next model runs
            print(f"[{k + 1}/{len(todo)}] {mid}: {err}", flush=True)
            rss = -1
        rel = m["path"].resolve().relative_to(ROOT) if m["source"] == "corpus" else ""
        rows.append({"model_id": mid, "source": m["source"], "arch": m["arch"],
                     "file": str(rel), "file_bytes": m["path"].stat().st_size,
                     "n_ops": len(graph.ops), "n_tensors": len(graph.tensors),
                     "arena_builtin": ab, "arena_builtin_usable": usable, "arena_xnnpack": ax,
                     "rss_peak": rss, "rss_baseline": base,
                     "rss_delta": rss - base if rss >= 0 else -1})
        print(f"[{k + 1}/{len(todo)}] {mid}: arena {ab} / {ax}, rss +{(rss - base) / 1e6:.2f} MB "
              f"({time.time() - t0:.0f}s)", flush=True)
        if len(rows) % 10 == 0:
            pd.DataFrame(rows).to_parquet(table, index=False)
    pd.DataFrame(rows).to_parquet(table, index=False)
    from importlib.metadata import version
    manifest = {"format_version": 1, "name": out.name, "target": f"host/cpu/{args.precision}/t1",
                "runtime": "litert", "runtime_version": version("ai-edge-litert"),
                "machine": platform.machine(), "cpu_model": platform.processor() or "",
                "cpu_id": cpu_id(),
                "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                "threads": 1, "rss_baseline_bytes": base, "baseline_model": "ADD of a "
                "[1,1,1,4] input with itself", "columns": {
                    "arena_builtin": "kTfLiteArenaRw high-water mark read back from tensor "
                    "addresses, TFLite built-in kernels (-1: failed)",
                    "arena_xnnpack": "the same with the XNNPACK delegate",
                    "rss_delta": "VmHWM of a fresh process (load, allocate, 2 runs, XNNPACK) "
                    "minus the trivial model's (min of 5)"}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(rows)} models in {table}")


if __name__ == "__main__":
    main()
