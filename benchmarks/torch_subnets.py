"""Benchmark: score subnets of a small once-for-all-style PyTorch supernet with latpred.

The supernet is OFA's MobileNetV3 space: a stem, five stages of 2-4 inverted-residual blocks
(kernel 3/5/7, expand ratio 3/4/6, SE and hard-swish where MobileNetV3 has them) and the head,
at 224x224. A candidate is a torch module (its weights do not matter for latency).

Reported, all on one thread (torch.set_num_threads(1); pin with `taskset -c 0` for one core):
1. export cost: `latpred.from_torch` of whole subnets, split into torch.export and lowering;
2. uncached scoring: export + predict per candidate (candidates/s);
3. a per-architecture cache (subnet config -> Graph): its hit rate on random samples;
4. a per-block cache: each distinct block (config, input shape) is converted once by
   from_torch and subnets are `latpred.pytorch.compose.chain`ed from the cached graphs, then
   scored with `predict_many` in batches; the warm-up (distinct blocks) is stated apart;
5. a check that chained graphs equal whole-subnet exports (op types, shapes, prediction).

Run: .venv/bin/python benchmarks/torch_subnets.py [--predictor DIR | --target T]
     [--candidates 5000] [--exports 5] [--batch 500]
Without --predictor a GBDT predictor is trained on a simulated dataset (tests/simdata.py) for
--target (default host/cpu/fp32/t1; a GPU target such as pixel4/gpu/fp16 runs the general path
only: its kernels may span blocks). On a CPU target the loop is also run with
`latpred.predictors.BlockScores` (per-block caches of predictions, exact with the whole-graph
`context_bytes` feature), checked against predict_many on chained graphs. After the warm-up the
objects made so far are frozen out of the garbage collector's passes (`gc.freeze()`, as a
long-running NAS loop would), so that collections walk only the candidates' own graphs.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from latpred import from_torch
from latpred.errors import LatpredError
from latpred.predictors import BlockScores, LatencyModel
from latpred.pytorch.compose import chain
from latpred.pytorch.export import export_program
from latpred.target import parse_target

ROOT = Path(__file__).resolve().parents[1]
STAGES = ((24, 2, "RE", False), (40, 2, "RE", True), (80, 2, "HS", False), (112, 1, "HS", True),
          (160, 2, "HS", True))
DEPTHS, KERNELS, EXPANDS = (2, 3, 4), (3, 5, 7), (3, 4, 6)
RES = 224


def _div8(v: float) -> int:
    return max(8, int(v + 4) // 8 * 8)


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = None
            ) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.Hardswish() if act == "HS" else nn.ReLU())
    return nn.Sequential(*layers)


class SE(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        mid = _div8(c // 4)
        self.reduce, self.expand = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(s))))


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int, act: str,
                 se: bool):
        super().__init__()
        mid = _div8(cin * expand)
        layers = [conv_bn(cin, mid, 1, act=act), conv_bn(mid, mid, k, stride, mid, act)]
        if se:
            layers.append(SE(mid))
        layers.append(conv_bn(mid, cout, 1))
        self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class Head(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.final = conv_bn(cin, 960, 1, act="HS")
        self.feature = nn.Sequential(nn.Conv2d(960, 1280, 1), nn.Hardswish())
        self.fc = nn.Linear(1280, 1000)

    def forward(self, x):
        x = self.feature(nn.functional.adaptive_avg_pool2d(self.final(x), 1))
        return self.fc(torch.flatten(x, 1))


def stem() -> nn.Module:
    return nn.Sequential(conv_bn(3, 16, 3, 2, act="HS"),
                         nn.Sequential(conv_bn(16, 16, 3, 1, 16, "RE"), conv_bn(16, 16, 1)))


def sample(rng: random.Random) -> tuple:
    """A subnet: per stage, one (kernel, expand) per active block."""
    return tuple(tuple((rng.choice(KERNELS), rng.choice(EXPANDS))
                       for _ in range(rng.choice(DEPTHS))) for _ in STAGES)


def block_specs(config: tuple) -> list[tuple]:
    """(cin, cout, kernel, stride, expand, act, se, input size) per block of a subnet."""
    specs, cin, size = [], 16, RES // 2
    for (cout, stride, act, se), blocks in zip(STAGES, config):
        for i, (k, e) in enumerate(blocks):
            s = stride if i == 0 else 1
            specs.append((cin, cout, k, s, e, act, se, size))
            cin, size = cout, -(-size // s)
    return specs


def all_block_specs() -> list[tuple]:
    """Every block any subnet can hold (the first block of a stage, and the others)."""
    specs, cin, size = [], 16, RES // 2
    for cout, stride, act, se in STAGES:
        out = -(-size // stride)
        for k in KERNELS:
            for e in EXPANDS:
                specs += [(cin, cout, k, stride, e, act, se, size),
                          (cout, cout, k, 1, e, act, se, out)]
        cin, size = cout, out
    return specs


def subnet(config: tuple) -> nn.Module:
    blocks = [Block(*spec[:7]) for spec in block_specs(config)]
    return nn.Sequential(stem(), *blocks, Head(STAGES[-1][0])).eval()


class BlockCache:
    """Graphs of the stem, each distinct block and the head, converted once by from_torch."""

    def __init__(self) -> None:
        self.graphs: dict[tuple, object] = {}
        self.seconds = 0.0

    def get(self, key: tuple, make, shape: tuple[int, ...]):
        g = self.graphs.get(key)
        if g is None:
            start = time.process_time()
            g = from_torch(make().eval(), torch.randn(*shape))
            self.seconds += time.process_time() - start
            self.graphs[key] = g
        return g

    def keys(self, config: tuple) -> list[tuple]:
        specs = block_specs(config)
        return [("stem",), *specs, ("head", -(-specs[-1][7] // specs[-1][3]))]

    @staticmethod
    def _part(key: tuple) -> tuple:
        if key == ("stem",):
            return key, stem, (1, 3, RES, RES)
        if key[0] == "head":
            return key, lambda: Head(STAGES[-1][0]), (1, STAGES[-1][0], key[1], key[1])
        return key, lambda: Block(*key[:7]), (1, key[0], key[7], key[7])

    def graph(self, config: tuple):
        graphs, stored = [], self.graphs
        for key in self.keys(config):   # the common case, a cached block: no maker needed
            g = stored.get(key)
            graphs.append(g if g is not None else self.get(*self._part(key)))
        return chain(graphs, name=str(config), rename=False)


def predictor(args) -> LatencyModel:
    if args.predictor:
        return LatencyModel.load(args.predictor)
    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    data = simulate(Path(tempfile.mkdtemp()) / "sim", args.target, n_models=100).root
    print(f"training a GBDT predictor for {args.target} on {data} ...", flush=True)
    return LatencyModel.fit(data, args.target, family="gbdt", search="none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", default=None)
    ap.add_argument("--target", default="host/cpu/fp32/t1",
                    help="target of the simulated predictor trained without --predictor")
    ap.add_argument("--candidates", type=int, default=5000)
    ap.add_argument("--exports", type=int, default=5)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        parse_target(args.target)
    except LatpredError as e:
        ap.error(str(e))
    torch.set_num_threads(1)
    model = predictor(args)
    rng = random.Random(args.seed)
    x = torch.randn(1, 3, RES, RES)

    # 1-2. Whole-subnet export, then predict: the uncached loop.
    exp_s, low_s, pred_s, graphs, configs = 0.0, 0.0, 0.0, [], []
    for _ in range(args.exports):
        config = sample(rng)
        m = subnet(config)
        t0 = time.process_time()
        program = export_program(m, x)
        t1 = time.process_time()
        g = from_torch(program)
        t2 = time.process_time()
        model.predict(g, allow_fallback=True)
        t3 = time.process_time()
        exp_s, low_s, pred_s = exp_s + t1 - t0, low_s + t2 - t1, pred_s + t3 - t2
        graphs.append(g)
        configs.append(config)
    n = args.exports
    per = (exp_s + low_s + pred_s) / n
    print(f"whole-subnet from_torch ({len(graphs[0].ops)}-{max(len(g.ops) for g in graphs)} "
          f"ops, {n} subnets): torch.export {1e3 * exp_s / n:.0f} ms + lowering "
          f"{1e3 * low_s / n:.1f} ms per subnet; predict {1e3 * pred_s / n:.2f} ms; "
          f"uncached loop {1 / per:.2f} candidates/s (CPU time)")

    # 3. Per-architecture cache on random samples.
    seen, hits = set(), 0
    for _ in range(args.candidates):
        c = sample(rng)
        hits += c in seen
        seen.add(c)
    print(f"per-architecture cache: {hits} hits in {args.candidates} random samples "
          f"({100 * hits / args.candidates:.2f}%): no help for random sampling")

    # 5. Chained block graphs equal whole exports.
    cache = BlockCache()
    for config, g in zip(configs, graphs):
        c = cache.graph(config)
        assert [op.type for op in c.ops] == [op.type for op in g.ops], config
        assert [op.attrs for op in c.ops] == [op.attrs for op in g.ops], config
        assert [[c.tensors[t].shape for t in (*op.inputs, *op.outputs) if t >= 0]
                for op in c.ops] == [[g.tensors[t].shape for t in (*op.inputs, *op.outputs)
                                      if t >= 0] for op in g.ops], config
        a = model.predict(c, allow_fallback=True).total_ms
        b = model.predict(g, allow_fallback=True).total_ms
        assert abs(a - b) <= 1e-9 * b, (a, b)
    print(f"chained block graphs equal the whole-subnet exports of {n} subnets (ops, "
          f"attributes, shapes, predicted latency)")

    # 4. Per-block cache: warm up every distinct block, then score candidates in batches.
    warm = time.process_time()
    for spec in all_block_specs():
        cache.get(spec, lambda s=spec: Block(*s[:7]), (1, spec[0], spec[7], spec[7]))
    warm = time.process_time() - warm
    print(f"block cache warm-up: {len(cache.graphs)} distinct stem/block/head graphs, "
          f"{cache.seconds:.1f} s of from_torch in all ({warm:.1f} s CPU)")
    gc.freeze()
    chain_s = score_s = 0.0
    done = 0
    while done < args.candidates:
        batch = [sample(rng) for _ in range(min(args.batch, args.candidates - done))]
        t0 = time.process_time()
        gs = [cache.graph(c) for c in batch]
        t1 = time.process_time()
        preds = model.predict_many(gs, allow_fallback=True)
        t2 = time.process_time()
        assert all(p.total_ms > 0 for p in preds)
        chain_s, score_s, done = chain_s + t1 - t0, score_s + t2 - t1, done + len(batch)
    total = chain_s + score_s
    print(f"block-cached loop ({model.target}): {done} candidates in {total:.2f} s CPU = "
          f"{done / total:.0f} candidates/s (chaining {1e3 * chain_s / done:.3f} ms, predict_many "
          f"{1e3 * score_s / done:.3f} ms per candidate; target >= 1,000/s)")

    # 4b. Per-block caches of predictions (CPU targets), checked against predict_many.
    if model._target().is_gpu:
        return
    t0 = time.process_time()
    scores = BlockScores(model, cache.graphs, allow_fallback=True)
    setup = time.process_time() - t0
    scores.verify([cache.keys(sample(rng)) for _ in range(50)])
    spent, done = 0.0, 0
    while done < args.candidates:
        t0 = time.process_time()
        batch = [cache.keys(sample(rng)) for _ in range(min(args.batch, args.candidates - done))]
        totals = scores.predict(batch)
        spent, done = spent + time.process_time() - t0, done + len(batch)
        assert (totals > 0).all()
    print(f"block-score loop (BlockScores, batches of {args.batch}): {done} candidates in "
          f"{spent:.3f} s CPU = {done / spent:.0f} candidates/s (sampling included; setup "
          f"{setup:.2f} s; equal to predict_many on the chained graphs of 50 candidates)")

if __name__ == "__main__":
    main()
