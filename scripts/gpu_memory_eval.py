"""Assemble datasets/h100-gpu-memory from the device readings and score the GPU-delegate
planner against them (the accelerator's own figures).

  python scripts/gpu_memory_eval.py assemble --runs out/run1.jsonl out/run2.jsonl out/run3.jsonl \
      out/run4.jsonl out/run5.jsonl out/run6.jsonl --out datasets/h100-gpu-memory
  python scripts/gpu_memory_eval.py score --data datasets/h100-gpu-memory

`score` writes the models again from their seeds here (the rows' sha256 must match) and prints,
per source, seed and precision, how many intermediate figures the planner gets exact and how
many constant figures it gets within 5%. The seed-1 samples (run 3) were measured after the
rules were written: they are the held-out check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

COLUMNS = ["model", "source", "precision", "sha256", "intermediate", "constant",
           "fully_accelerated", "error"]


def assemble(runs: list[str], out: Path) -> None:
    d = pd.concat([pd.read_json(r, lines=True) for r in runs], ignore_index=True)
    d["error"] = d.get("error", pd.Series(dtype=str)).fillna("")
    # the later reading of a model wins (the second run re-read the synthetic models)
    d = d.drop_duplicates(["model", "precision"], keep="last")[COLUMNS]
    d = d.sort_values(["source", "model", "precision"]).reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    d.to_parquet(out / "models.parquet", index=False)
    (out / "manifest.json").write_text(json.dumps({
        "what": "LiteRT GPU accelerator (ML Drift over WebGPU/Vulkan) memory metrics: "
                "gpu_intermediate_memory_bytes, gpu_constant_memory_bytes",
        "runtime": "ai-edge-litert 2.3.0", "device": "NVIDIA H100 80GB HBM3 (run 1), "
        "H200 (run 2: thin probes and the synthetic models again; run 3: the seed-1 samples, "
        "held out; run 4, session 29: 690 split grouped-convolution probes in fp16 and 24 "
        "with 5-8 input channels a group, each alone in a process, all of which died with "
        "SIGILL; the 24 rows' sha256 were computed here from the same deterministic writer; "
        "run 5, session 29, held out: 76 wide concatenation and split probes in fp16 and fp32, "
        "measured after the chain rule was committed; run 6, session 29: 70 convolutions on "
        "1x1 to 7x7 maps, fp16 and fp32; run 7, session 30, held out: 80 Winograd "
        "convolutions and 8 probes without a bias, fp16 and fp32, measured after the rules "
        "were committed; its 8 bias-less CONV_2D readings failed to compile: LiteRT's CONV_2D "
        "needs a bias; run 8, session 30, held out: 24 Winograd convolutions with input "
        "slices a multiple of 4 and output slices of 8, fp16 and fp32), "
        "driver 580.159.04",
        "rows": len(d), "failed_to_compile": int((d.error != "").sum()),
        "models": "scripts/gpu_memory_campaign.py (seeds: synthetic_cnn / converter_cnn seed 0, "
                  "zoo seed 0, probes), tests/fixtures/corpus"}, indent=1) + "\n")
    print(f"{len(d)} rows -> {out}")


def _graphs(d: pd.DataFrame) -> dict:
    import gpu_memory_campaign as campaign

    graphs = dict(campaign.probe_graphs() + campaign.probe_graphs_thin()
                  + campaign.probe_graphs_groups() + campaign.probe_graphs_crash()
                  + campaign.probe_graphs_wide() + campaign.probe_graphs_small()
                  + campaign.probe_graphs_winograd() + campaign.probe_graphs_wave())
    with tempfile.TemporaryDirectory() as tmp:   # ~2 GB of models, removed after
        _read_written(Path(tmp), d, graphs)
    return graphs


def _read_written(tmp: Path, d: pd.DataFrame, graphs: dict) -> None:
    """The sampled and zoo models written again from their seeds (and the corpus fixtures),
    read into `graphs` when their bytes are those measured."""
    from latpred.sampler import load_space, write_samples
    from latpred.tflite import read_tflite
    from latpred.zoo import write_models

    # the sampled models' names carry their space, seed and index: write each space and seed
    # with as many samples as were measured
    sampled = d.model.str.extract(r"^(synthetic_cnn|converter_cnn)-s(\d+)-(\d+)$").dropna()
    for (space, seed), idx in sampled.groupby([0, 1])[2]:
        n = int(idx.astype(int).max()) + 1
        write_samples(load_space(ROOT / "search_space" / f"{space}.yaml"), n, int(seed),
                      tmp / f"{space}-s{seed}", "fp32")
    write_models(tmp / "zoo", precision="fp32", seed=0)
    files = [*tmp.glob("*/*.tflite"), *(ROOT / "tests" / "fixtures" / "corpus").glob("*.tflite")]
    sha = d.drop_duplicates("model").set_index("model").sha256
    for p in files:
        if p.stem in sha.index:
            data = p.read_bytes()
            if hashlib.sha256(data).hexdigest() != sha[p.stem]:
                raise SystemExit(f"{p.stem}: not the file measured (sha256 differs)")
            graphs[p.stem] = read_tflite(data)


def score(data: Path) -> None:
    from latpred.memory.gpu_delegate import plan_delegate
    from latpred.target import parse_target

    d = pd.read_parquet(data / "models.parquet")
    d = d[d.error == ""]
    graphs = _graphs(d)
    rows = []
    for r in d.itertuples():
        if r.model not in graphs:
            continue
        plan = plan_delegate(graphs[r.model], parse_target(f"h100/gpu/{r.precision}"),
                             r.precision)
        seed = r.model.split("-s")[1].split("-")[0] if "-s" in r.model else ""
        rows.append((f"{r.source}{'-s' + seed if seed else ''}", r.precision,
                     plan.intermediate == r.intermediate,
                     abs(plan.constant - r.constant) <= 0.05 * max(r.constant, 1),
                     plan.constant == r.constant))
    x = pd.DataFrame(rows, columns=["source", "precision", "exact", "const5", "const_exact"])
    table = x.groupby(["source", "precision"]).agg(
        n=("exact", "size"), intermediate_exact=("exact", "sum"),
        constant_exact=("const_exact", "sum"), constant_within_5pct=("const5", "sum"))
    print(table.to_string())
    print(f"all: intermediate exact {x.exact.sum():,} / {len(x):,}, constant exact "
          f"{x.const_exact.sum():,} / {len(x):,}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble")
    a.add_argument("--runs", nargs="+", required=True)
    a.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("--data", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "assemble":
        assemble(args.runs, Path(args.out))
    else:
        score(Path(args.data))


if __name__ == "__main__":
    main()
