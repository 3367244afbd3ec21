"""Benchmark: prediction speed with a GBDT predictor (targets: < 5 ms, > 5,000 graphs/s).

1. One 100-operation .tflite read, deduced and predicted (`LatencyModel.predict(path)`),
   median over repeated runs after warm-up; target under 5 ms.
2. `predict_many` over 10,000 in-memory graphs sampled from search_space/synthetic_cnn.yaml
   (deduction, featurization and prediction; building the graphs is not timed); target over
   5,000 graphs per second on one core. Each repeat builds fresh graphs (a NAS loop scores new
   candidates, so lazily cached per-graph values are not warm) and reports the stages of that
   same call: deduction, featurization (configuration keys and the feature rows of distinct
   configurations), the regressor calls, and the rest (assembling the predictions). A full
   garbage collection runs before each timed call, so the call pays for collecting its own
   allocations only, not for the millions of objects the graph building left pending.

Both CPU time (`time.process_time`; prediction runs on one thread) and wall time are reported:
on a shared machine the wall time also counts other processes' turns on the core.

Run: .venv/bin/python benchmarks/predict_speed.py [--predictor DIR | --data DATASET]
     [--target host/cpu/fp32/t1] [--graphs 10000] [--repeats 3]
Without --predictor or --data, a GBDT predictor is trained (default `latpred` search) on a
simulated dataset (tests/simdata.py: real graphs and features, latencies from a cost model),
which has the kernel types and tree sizes of a real one. Pin to one core with
`taskset -c 0` to measure "one core".
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

from latpred.builder import GraphBuilder
from latpred.predictors import LatencyModel
from latpred.tflite import write_tflite

ROOT = Path(__file__).resolve().parents[1]


def hundred_op_model(path: Path) -> int:
    """A MobileNetV2-like stack: 25 inverted residual blocks of 4 ops = 100 ops."""
    b = GraphBuilder("bench100")
    x = b.input((1, 56, 56, 24))
    for _ in range(25):
        y = b.conv2d(x, 72, 1, activation="RELU6")
        y = b.depthwise_conv2d(y, 3, activation="RELU6")
        y = b.conv2d(y, 24, 1)
        x = b.add(x, y)
    b.output(x)
    graph = b.build()
    write_tflite(graph, path)
    return len(graph.ops)


def add_predictor_arguments(ap: argparse.ArgumentParser, graphs: int, repeats: int) -> None:
    """The options `predictor(args)` reads, and the benchmark's graph count and repeats."""
    ap.add_argument("--predictor")
    ap.add_argument("--data")
    ap.add_argument("--target", default="host/cpu/fp32/t1")
    ap.add_argument("--search", default="latpred")
    ap.add_argument("--graphs", type=int, default=graphs)
    ap.add_argument("--repeats", type=int, default=repeats)


def predictor(args) -> LatencyModel:
    if args.predictor:
        return LatencyModel.load(args.predictor, target=args.target)
    data = args.data
    if data is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from simdata import simulate

        data = simulate(Path(tempfile.mkdtemp()) / "sim", args.target, n_models=200).root
    print(f"training a GBDT predictor on {data} ...", flush=True)
    return LatencyModel.fit(data, args.target, family="gbdt", search=args.search)


def bench_file(model: LatencyModel, repeats: int = 50) -> None:
    path = Path(tempfile.mkdtemp()) / "bench100.tflite"
    n_ops = hundred_op_model(path)
    for _ in range(5):
        model.predict(path)
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        model.predict(path)
        times.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    q = statistics.quantiles(times, n=4)
    print(f"read + deduce + predict of a {n_ops}-op .tflite ({path.stat().st_size / 1e6:.1f} MB):"
          f" median {statistics.median(times):.2f} ms, IQR {q[0]:.2f}-{q[2]:.2f} ms, "
          f"min {min(times):.2f} ms; median CPU time {statistics.median(cpu):.2f} ms; "
          f"{repeats} runs (target < 5 ms)")


class StageClock:
    """CPU seconds spent inside the stage functions `predict_many` looks up at call time."""

    STAGES = (("deduction", "latpred.deduce", "deduce"),
              ("featurization", "latpred.predictors.batch", "featurize"),
              ("regressors", "latpred.predictors.batch", "predict_batch"))

    def __init__(self):
        self.seconds = {name: 0.0 for name, _, _ in self.STAGES}

    def __enter__(self) -> "StageClock":
        import importlib

        self._saved = []
        for name, module, attr in self.STAGES:
            mod = importlib.import_module(module)
            self._saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, self._timed(name, getattr(mod, attr)))
        return self

    def __exit__(self, *exc) -> None:
        for mod, attr, fn in self._saved:
            setattr(mod, attr, fn)

    def _timed(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.process_time() - start
        return timed


def bench_many(model: LatencyModel, n: int, repeats: int) -> None:
    from latpred.sampler import build_graph, sample

    archs = list(sample(ROOT / "search_space" / "synthetic_cnn.yaml", n, 1))
    model.predict_many([build_graph(a) for a in archs[:100]])  # warm-up: imports, caches
    cpu, wall, split = [], [], []
    for r in range(repeats):
        print(f"building {n} graphs (repeat {r + 1}/{repeats}) ...", flush=True)
        graphs = [build_graph(a) for a in archs]
        gc.collect()  # the garbage of building the graphs is not predict_many's to collect
        with StageClock() as clock:
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            preds = model.predict_many(graphs)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
        assert len(preds) == n
        kernels = sum(len(p.kernels) for p in preds)
        split.append({**clock.seconds, "rest": cpu[-1] - sum(clock.seconds.values())})
        del graphs, preds
    i = sorted(range(repeats), key=cpu.__getitem__)[repeats // 2]  # the (upper) median run
    stages = ", ".join(f"{k} {v:.2f} s ({v / cpu[i]:.0%})" for k, v in split[i].items())
    print(f"predict_many over {n} graphs ({kernels} kernels), {repeats} repeats:\n"
          f"  CPU time: median {statistics.median(cpu):.2f} s = "
          f"{n / statistics.median(cpu):,.0f} graphs/s (range {n / max(cpu):,.0f}-"
          f"{n / min(cpu):,.0f}; target > 5,000)\n"
          f"  wall time: median {statistics.median(wall):.2f} s = "
          f"{n / statistics.median(wall):,.0f} graphs/s (range {n / max(wall):,.0f}-"
          f"{n / min(wall):,.0f})\n"
          f"  stages of the median run (CPU): {stages}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_predictor_arguments(ap, graphs=10_000, repeats=3)
    args = ap.parse_args()
    model = predictor(args)
    bench_file(model)
    bench_many(model, args.graphs, args.repeats)


if __name__ == "__main__":
    main()
