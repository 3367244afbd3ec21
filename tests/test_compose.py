"""compose.chain: chained block graphs equal the whole module's export, and the maps it hands
deduction equal the ones Graph derives itself, also when placements come from its cache."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from latpred import from_torch
from latpred.errors import PredictorError, ShapeError
from latpred.graph import Graph, Op, Tensor
from latpred.pytorch.compose import chain

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simdata  # noqa: E402

torch.set_num_threads(1)


class Block(nn.Module):
    """An inverted residual (optionally with a squeeze-excite gate) of a small supernet."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, se: bool):
        super().__init__()
        mid = 2 * cin
        layers = [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                  nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                  nn.BatchNorm2d(mid), nn.Hardswish()]
        self.body, self.tail = nn.Sequential(*layers), nn.Conv2d(mid, cout, 1)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, 4, 1), nn.ReLU(),
                                nn.Conv2d(4, mid, 1), nn.Hardsigmoid()) if se else None
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        if self.se is not None:
            y = y * self.se(y)
        y = self.tail(y)
        return x + y if self.residual else y


def head() -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(16, 10))


def stem() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6())


CHOICES = [(8, 16, 3, 2, False), (8, 16, 5, 2, True), (16, 16, 3, 1, True),
           (16, 16, 5, 1, False)]


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    mods = {"stem": stem().eval(), "head": head().eval()}
    mods.update({c: Block(*c).eval() for c in CHOICES})
    shapes = {"stem": (1, 3, 32, 32), "head": (1, 16, 8, 8)}
    shapes.update({c: (1, c[0], 16 if c[3] == 2 else 8, 16 if c[3] == 2 else 8)
                   for c in CHOICES})
    graphs = {k: from_torch(m, torch.randn(*shapes[k])) for k, m in mods.items()}
    return mods, graphs


def subnets():
    firsts = [c for c in CHOICES if c[3] == 2]
    rests = [c for c in CHOICES if c[3] == 1]
    for first, *more in itertools.product(firsts, rests, rests):
        yield (first, *more)


def structure(g: Graph) -> list:
    return [(op.type, op.attrs, [g.tensors[t].shape if t >= 0 else None for t in op.inputs],
             [g.tensors[t].shape for t in op.outputs]) for op in g.ops]


def test_chained_blocks_equal_the_whole_export(parts):
    mods, graphs = parts
    for blocks in itertools.islice(subnets(), 4):
        whole = nn.Sequential(mods["stem"], *[mods[b] for b in blocks], mods["head"]).eval()
        g = from_torch(whole, torch.randn(1, 3, 32, 32))
        for rename in (True, False):
            c = chain([graphs["stem"], *[graphs[b] for b in blocks], graphs["head"]],
                      rename=rename)
            assert structure(c) == structure(g)
            assert [c.tensors[t].shape for t in c.outputs] == [(1, 10)]


def test_maps_handed_to_deduction_equal_graphs_own(parts):
    _, graphs = parts
    for _ in range(2):   # the second pass takes every placement from the parts' caches
        for blocks in subnets():
            c = chain([graphs["stem"], *[graphs[b] for b in blocks], graphs["head"]],
                      rename=False)
            fresh = Graph(c.tensors, c.ops, c.inputs, c.outputs)
            assert_lookups_equal(c, fresh)   # read from the parts, before the maps are joined
            assert list(c.consumers.items()) == list(fresh.consumers.items())
            assert list(c.producers.items()) == list(fresh.producers.items())
            assert c == fresh


def assert_lookups_equal(c: Graph, fresh: Graph) -> None:
    assert "consumers" not in c._cache and "producers" not in c._cache
    for t in range(-2, len(c.tensors) + 2):
        assert c.producer(t) == fresh.producer(t), t
        assert c.consumers_of(t) == fresh.consumers_of(t), t


def test_per_tensor_lookups_of_parts_read_inside_and_after_them():
    """A part's output read inside it too (then by the next part as well), a part whose input
    is read twice, an op with an absent output (-1): each tensor's producer and consumers,
    without joining the maps."""
    t = [Tensor(f"t{i}", (1, 4, 4, 8)) for i in range(4)]
    inner = Graph(tuple(t), (Op("RELU", (0,), (1,)), Op("ADD", (1, 1), (2,)),
                             Op("MUL", (1, 0), (3,)), Op("LOGISTIC", (1,), (2,)),
                             Op("SPLIT", (1,), (3, -1))), (0,), (1,))   # an absent output
    for graphs in ([inner, inner], [inner, inner, inner], [inner]):
        for rename in (True, False):
            c = chain(graphs, rename=rename)
            fresh = Graph(c.tensors, c.ops, c.inputs, c.outputs)
            assert_lookups_equal(c, fresh)
            assert list(c.consumers.items()) == list(fresh.consumers.items())
            assert list(c.producers.items()) == list(fresh.producers.items())


@pytest.mark.parametrize("target", ["host/cpu/fp32/t1", "pixel4/gpu/fp16"])
def test_predictions_of_chained_and_whole_graphs_are_equal(parts, target, tmp_path):
    from latpred.predictors import LatencyModel
    from latpred.predictors.search import SearchSpec

    mods, graphs = parts
    ds = simdata.simulate(tmp_path / "ds", target, n_models=20, seed=3)
    model = LatencyModel.fit(ds, target, family="gbdt",
                             search=SearchSpec("gbdt", "t", method="none"))
    blocks = next(subnets())
    whole = nn.Sequential(mods["stem"], *[mods[b] for b in blocks], mods["head"]).eval()
    g = from_torch(whole, torch.randn(1, 3, 32, 32))
    c = chain([graphs["stem"], *[graphs[b] for b in blocks], graphs["head"]], rename=False)
    a, b = model.predict_many([c, g], allow_fallback=True)
    assert a.total_ms == pytest.approx(b.total_ms, rel=1e-12)
    assert [k.ops for k in a.kernels] == [k.ops for k in b.kernels]


def test_shape_mismatch_is_one_sentence(parts):
    _, graphs = parts
    with pytest.raises(ShapeError, match="takes"):
        chain([graphs["stem"], graphs[CHOICES[2]]])


def block_subnets():
    """Subnets of 0-4 stride-1 blocks after the first: graphs of quite different sizes, so
    their context_bytes differ."""
    firsts = [c for c in CHOICES if c[3] == 2]
    rests = [c for c in CHOICES if c[3] == 1]
    for depth in range(5):
        for first, *more in itertools.product(firsts, *[rests] * depth):
            yield ("stem", first, *more, "head")


class ContextScaled:
    """A regressor whose prediction grows with the context_bytes column, so that a wrong
    context shows (a GBDT on 20 simulated models may not split on it at all)."""

    def __init__(self, inner, col: int):
        self.inner, self.col = inner, col

    def predict(self, X):
        return self.inner.predict(X) * (1 + np.log2(1 + X[:, self.col]) / 10)


def context_sensitive(model):
    from dataclasses import replace

    from latpred.features import CONTEXT

    types = {t: replace(f, regressor=ContextScaled(f.regressor, f.features.index(CONTEXT)))
             if CONTEXT in f.features else f for t, f in model.types.items()}
    return replace(model, types=types)


@pytest.mark.parametrize("overhead", ["auto", "typed", "residual"])
def test_block_scores_equal_predict_many_with_context(parts, tmp_path, overhead):
    from latpred.features import context_bytes
    from latpred.predictors import BlockScores, LatencyModel
    from latpred.predictors.search import SearchSpec

    _, graphs = parts
    target = "host/cpu/fp32/t1"
    ds = simdata.simulate(tmp_path / "ds", target, n_models=20, seed=3)
    model = context_sensitive(LatencyModel.fit(ds, target, family="gbdt",
                                               search=SearchSpec("gbdt", "t", method="none"),
                                               overhead=overhead.replace("residual", "auto")))
    # A typed overhead: the subnets' kernel counts per type are summed over their blocks; a
    # residual stage (predictors/residual.py): their counts and predicted times per type.
    assert (model.overhead.kind == "typed") == (overhead == "typed")
    if overhead == "residual":
        model = simdata.with_residual_stage(model)
    scores = BlockScores(model, graphs, allow_fallback=True)
    keys = list(block_subnets())
    chained = [chain([graphs[k] for k in s], rename=False) for s in keys]
    preds = model.predict_many(chained, allow_fallback=True)
    assert scores.predict(keys) == pytest.approx([p.total_ms for p in preds], rel=1e-12)
    contexts = {float(context_bytes(scores.moved[[scores.index[k] for k in s]].sum()))
                for s in keys}
    assert len(contexts) > 3     # the subnets span several contexts
    scores.verify(keys[::7])
    scores.moved = scores.moved * 2   # a wrong context is caught
    with pytest.raises(PredictorError, match="differ"):
        scores.verify(keys[::7])


def test_block_scores_refuse_gpu_targets(parts, tmp_path):
    from latpred.predictors import BlockScores, LatencyModel
    from latpred.predictors.search import SearchSpec

    target = "pixel4/gpu/fp16"
    ds = simdata.simulate(tmp_path / "ds", target, n_models=8, seed=3)
    model = LatencyModel.fit(ds, target, family="gbdt",
                             search=SearchSpec("gbdt", "t", method="none"))
    with pytest.raises(PredictorError, match="CPU target"):
        BlockScores(model, parts[1])
