"""Dev script (device): eager vs replayed CUDA kernel lists of a few sampled models."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from latpred import sampler
from latpred.profile import cuda
from latpred.target import parse_target
import torch

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
spec = [("synthetic_cnn", list(range(24))), ("regnet_cnn", list(range(8)))]
target = parse_target("h100/cuda/fp16")
proto = cuda.CudaProtocol(warmup=5, replay_warmup=20)
captured = []
orig = cuda.kernel_figures
def keep(runs, replayed, n):
    captured.append({"eager": [[(o, nm[:160], *rest) for o, nm, *rest in r] for r in runs],
                     "replay": [(nm[:160], *rest) for nm, *rest in replayed]})
    return orig(runs, replayed, n)
cuda.kernel_figures = keep
f = open(out / "diag.jsonl", "w")
for space, idx in spec:
    archs = list(sampler.sample(Path("search_space") / f"{space}.yaml", max(idx) + 1, 13))
    graphs = [sampler.build_graph(archs[i]) for i in idx]
    captured.clear()
    rows = cuda.measure_many(graphs, target, proto)
    for i, r, c in zip(idx, rows, captured):
        f.write(json.dumps({"space": space, "index": i, "source": r.get("kernel_source"),
                            "latency_ms": r.get("latency_ms"), "gpu_time_ms": r.get("gpu_time_ms"),
                            "overlap_ms": r.get("overlap_ms"), **c}) + "\n")
f.close()
