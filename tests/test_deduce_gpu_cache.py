"""GPU deduction's per-op caches (`latpred.deduce.gpu_plans`) give what an empty cache gives:
for graphs built anew, for graphs seen again (whose Op objects get kept entries), for chained
graphs that share Op and Tensor objects, and for an Op object met again with other tensors."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from latpred.builder import GraphBuilder
from latpred.deduce import deduce
from latpred.deduce.gpu_plans import plans_for
from latpred.graph import Graph, Op, Tensor
from latpred.pytorch.compose import chain

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deduce import GPU_TARGETS, STEPS, deduce_or_refusal, random_graph  # noqa: E402


def copy(g: Graph) -> Graph:
    """The same graph made of new Tensor and Op objects."""
    return Graph(tuple(Tensor(t.name, t.shape, t.dtype, t.quantization, t.is_constant, t.value)
                       for t in g.tensors),
                 tuple(Op(op.type, op.inputs, op.outputs, op.attrs) for op in g.ops),
                 g.inputs, g.outputs, g.name)


def uncached(g: Graph, target: str) -> list:
    plans_for.cache_clear()
    try:
        return deduce_or_refusal(copy(g), target)
    finally:
        plans_for.cache_clear()


def random_graphs(n: int, seed: int) -> list[Graph]:
    rng = random.Random(seed)
    return [random_graph([(rng.choice(STEPS), rng.randrange(100), rng.randrange(100),
                           rng.choice([16, 64])) for _ in range(rng.randint(1, 18))],
                         rng.randint(1, 3)) for _ in range(n)]


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_seen_again_and_new_graphs_deduce_as_with_an_empty_cache(target):
    graphs = random_graphs(40, seed=3)
    expected = [uncached(g, target) for g in graphs]
    for _ in range(3):   # new objects, then entries kept, then entries hit
        assert [deduce_or_refusal(g, target) for g in graphs] == expected
    assert [deduce_or_refusal(copy(g), target) for g in graphs] == expected


def block(c: int, hw: int, pad: bool, act: str) -> Graph:
    b = GraphBuilder("block", fuse_activations=False)
    x = b.input((1, hw, hw, c))
    y = getattr(b, act)(b.conv2d(x, 2 * c, 1))
    y = b.conv2d(b.pad(y, 1), 2 * c, 3, padding="VALID") if pad else b.depthwise_conv2d(y, 3)
    y = b.reshape(b.relu6(y), (1, hw, hw, 2 * c))   # keeps the shape: the delegate removes it
    b.output(b.add(b.conv2d(y, c, 1), x))
    return b.build()


def test_chained_graphs_sharing_objects_deduce_as_with_an_empty_cache():
    blocks = [block(16, 8, pad, act) for pad in (False, True) for act in ("relu", "hard_swish")]
    rng = random.Random(5)
    subnets = [chain([rng.choice(blocks) for _ in range(rng.randint(1, 6))], rename=False)
               for _ in range(30)]
    for target in ("pixel4/gpu/fp16", "h100/gpu/fp16"):
        expected = [uncached(g, target) for g in subnets]
        for _ in range(2):
            assert [deduce(g, target) for g in subnets] == expected


def test_an_op_met_again_with_other_tensors_gets_their_verdict():
    g = block(16, 8, pad=False, act="relu")
    int8 = Graph(tuple(Tensor(t.name, t.shape, "int8", t.quantization, t.is_constant, t.value)
                       for t in g.tensors), g.ops, g.inputs, g.outputs, g.name)   # same Op objects
    target = "pixel4/gpu/fp16"
    want, want_int8 = uncached(g, target), uncached(int8, target)
    assert {k.device for k in want} == {"gpu"} and {k.device for k in want_int8} == {"cpu"}
    for _ in range(3):   # the second graph finds the first's Op objects: entries are kept
        assert deduce(g, target) == want
        assert deduce(int8, target) == want_int8


def test_a_chained_part_after_an_output_of_another_value_gets_its_verdict():
    """The same part at the same offsets (the same Op objects) after a float32 and after an
    int8 output: its first op reads the other value, so its entries must not be reused."""
    g = block(16, 8, pad=False, act="relu")
    int8 = Graph(tuple(Tensor(t.name, t.shape, "int8", t.quantization, t.is_constant, t.value)
                       for t in g.tensors), g.ops, g.inputs, g.outputs, g.name)
    after_float = chain([g, g], rename=False)
    after_int8 = chain([int8, g], rename=False)
    assert after_float.ops[len(g.ops)] is after_int8.ops[len(g.ops)]   # the same placed part
    target = "pixel4/gpu/fp16"
    want, want_int8 = uncached(after_float, target), uncached(after_int8, target)
    assert want != want_int8
    for _ in range(2):
        assert deduce(after_float, target) == want
        assert deduce(after_int8, target) == want_int8
