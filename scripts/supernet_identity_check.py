"""Dev check: GPU deduction, feature batches and predictions equal another checkout's.

Dumps, under this tree and under `--base` (another checkout, imported in a subprocess through
PYTHONPATH), the kernels of about 3,900 graphs on every GPU target (chained subnets of
benchmarks/torch_subnets.py's OFA space, with and without renaming, each deduced twice so that
cached paths run; synthetic_cnn samples; samples of the other search spaces; zoo models; test
fixtures; random graphs of tests/test_deduce.py's generator), and the feature batches (rows,
members, configurations, contexts, bytes moved, tensor ids) and predictions (total, overhead,
per kernel) of chained subnets and synthetic_cnn graphs on two GPU targets and one CPU target,
then compares them field by field. The predictors are trained once on simulated data
(tests/simdata.py) into --work and loaded by both sides.

    python scripts/supernet_identity_check.py --base /path/to/base/checkout [--work DIR]

Exit status 1 when anything differs. Takes a few minutes (the OFA blocks are converted by
torch.export in both subprocesses).
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREDICTED = ("pixel4/gpu/fp16", "h100/gpu/fp16", "host/cpu/fp32/t1")


def _predictor_dir(work: Path, target: str) -> Path:
    return work / ("pred_" + target.replace("/", "_"))


def train(work: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    from latpred.predictors import LatencyModel

    for t in PREDICTED:
        d = _predictor_dir(work, t)
        if not (d / "predictor.json").exists():
            data = simulate(work / ("sim_" + t.replace("/", "_")), t, n_models=100).root
            LatencyModel.fit(data, t, family="gbdt", search="none").save(d)


def graph_sets() -> dict[str, list]:
    """The graphs, built the same way under either tree (the benchmark module is this tree's)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    import torch_subnets as ts
    from test_deduce import STEPS, random_graph

    from latpred import zoo
    from latpred.pytorch.compose import chain
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite

    torch.set_num_threads(1)
    cache = ts.BlockCache()
    rng = random.Random(0)
    configs = [ts.sample(rng) for _ in range(700)]
    chained = [cache.graph(c) for c in configs[:600]]
    renamed = [chain([cache.graphs.get(k) or cache.get(*cache._part(k)) for k in cache.keys(c)],
                     name="renamed") for c in configs[600:]]
    spaces = sorted(glob.glob(str(ROOT / "search_space" / "*.yaml")))
    synth = [build_graph(a) for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", 600, 7)]
    extra = [build_graph(a) for sp in spaces if "synthetic_cnn" not in sp
             for a in sample(sp, 40, 3)]
    extra += [zoo.build(name) for name in sorted(zoo.ZOO)]
    for f in sorted(glob.glob(str(ROOT / "tests" / "fixtures" / "**" / "*.tflite"),
                          recursive=True)):
        try:
            extra.append(read_tflite(f))
        except Exception as e:   # fixtures of unsupported features: the same under both trees
            print("skipped", f, type(e).__name__)
    prng = random.Random(11)
    rand = [random_graph([(prng.choice(STEPS), prng.randrange(100), prng.randrange(100),
                           prng.choice([16, 64])) for _ in range(prng.randint(1, 24))],
                         prng.randint(1, 3)) for _ in range(1500)]
    return {"chained": chained, "renamed": renamed, "synth": synth, "extra": extra,
            "random": rand}


def _kernels(g, target) -> object:
    from latpred.deduce import deduce

    try:
        return [(k.type, k.ops, k.device, k.rule, k.multithreaded, k.part)
                for k in deduce(g, target)]
    except Exception as e:
        return ("error", type(e).__name__, str(e))


def dump(work: Path, out: Path) -> None:
    from latpred.predictors import LatencyModel
    from latpred.device_profile import available_devices, load_device
    from latpred.target import parse_target

    sets = graph_sets()
    gpu = [f"{d}/gpu/{load_device(d).gpu.precisions[0]}" for d in available_devices()
           if load_device(d).gpu is not None]
    res: dict = {}
    for t in gpu:
        target = parse_target(t)
        for name, gs in sets.items():
            passes = 2 if name in ("chained", "renamed") else 1   # again: the cached paths
            for p in range(passes):
                res[("kernels", t, name, p)] = [_kernels(g, target) for g in gs]
    for t in PREDICTED:
        model = LatencyModel.load(_predictor_dir(work, t))
        for name in ("chained", "renamed", "synth"):
            gs = sets[name][:500]
            for s in range(0, len(gs), 250):
                preds, _, kernels, b = model.predict_many_batch(gs[s:s + 250],
                                                                allow_fallback=True)
                res[("batch", t, name, s)] = dict(
                    preds=[(p.total_ms, p.overhead_ms, list(map(float, p.kernel_ms)),
                            p.kernels, p.fallback_types) for p in preds],
                    kernels=[[(k.type, k.ops, k.part) for k in ks] for ks in kernels],
                    rows={g: r.tolist() for g, r in b.rows.items()},
                    members={g: v.tolist() for g, v in b.members.items()},
                    config=b.config.tolist(), n=b.n_configs, context=b.context.tolist(),
                    context_col=b.context_col, moved=b.moved.tolist(),
                    tensor_ids=b.tensor_ids, tensor_keys=b.tensor_keys)
    out.write_bytes(pickle.dumps(res))


def compare(a: dict, b: dict) -> int:
    if a.keys() != b.keys():
        print("different lists:", sorted(a.keys() ^ b.keys())[:5])
        return 1
    bad = graphs = kernels = 0
    for key in a:
        x, y = a[key], b[key]
        if key[0] == "kernels":
            graphs += len(x)
            kernels += sum(len(k) for k in x if isinstance(k, list))
            diff = [n for n, (u, v) in enumerate(zip(x, y)) if u != v] if len(x) == len(y) \
                else ["length"]
        else:
            diff = [f for f in x if x[f] != y[f]]
        if diff:
            bad += 1
            print("DIFF", key, diff[:5])
    print(f"{len(a)} lists compared ({graphs} deductions, {kernels} kernels; feature batches "
          f"and predictions of {sum(k[0] == 'batch' for k in a)} batches): "
          f"{'IDENTICAL' if not bad else f'{bad} differ'}")
    return int(bad > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the other checkout")
    ap.add_argument("--work", default=None, help="predictors and dumps (default: a temp dir)")
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)   # the subprocess's side
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="identity_"))
    if args.dump:
        dump(work, Path(args.dump))
        return
    if not args.base:
        ap.error("--base is required")
    work.mkdir(parents=True, exist_ok=True)
    train(work)
    dumps = []
    for tree in (Path(args.base).resolve(), ROOT):
        out = work / f"dump_{tree.name}.pkl"
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, __file__, "--work", str(work), "--dump", str(out)],
                       env=env, check=True, cwd=tree)
        dumps.append(pickle.loads(out.read_bytes()))
    sys.exit(compare(*dumps))


if __name__ == "__main__":
    main()
