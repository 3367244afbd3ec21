"""Configuration keys of fused (multi-op) kernels in `predictors.batch.featurize`: kernels that
differ in what features can read get apart, equal ones built from other objects share one."""

from types import SimpleNamespace

from latpred.graph import Graph, Op, Tensor
from latpred.predictors.batch import featurize

X = (1, 8, 8, 4)


def _graph(relu_reads_add: bool) -> Graph:
    """ADD then RELU; the RELU reads the ADD's output, or another tensor of the same shape."""
    tensors = (Tensor("x", X), Tensor("sum", X), Tensor("out", X), Tensor("other", X))
    relu_in = 1 if relu_reads_add else 3
    ops = (Op.make("ADD", [0, 0], [1]), Op.make("RELU", [relu_in], [2]))
    return Graph(tensors, ops, (0, 3), (2,))


def _configs(graphs, kernels) -> list[int]:
    batch = featurize(graphs, kernels, None, lambda t: ("g", ()),
                      lambda g, k, t: {"bytes_read": 0.0, "bytes_written": 0.0})
    return batch.config.tolist()


def _kernel(ops, part=""):
    return SimpleNamespace(type="elementwise", part=part, ops=ops)


def test_fused_keys_tell_inside_inputs_apart_and_match_by_value():
    inside, outside, inside_again = _graph(True), _graph(False), _graph(True)
    fused = [_kernel((0, 1))]
    # A rebuilt graph (new Op and Tensor objects, equal values) shares the configuration; an
    # input read from outside the kernel makes another one.
    assert _configs([inside, outside, inside_again], [fused] * 3) == [0, 1, 0]


def test_fused_keys_differ_from_single_op_keys_and_by_stage():
    g = _graph(True)
    kernels = [_kernel((0, 1)), _kernel((0,)), _kernel((1,)), _kernel((0, 1), part="b"),
               _kernel((0, 1))]
    assert _configs([g], [kernels]) == [0, 1, 2, 3, 0]


def test_chained_graphs_key_as_rebuilt_graphs_over_several_calls():
    """Chained graphs' Op facts are kept across calls (`Graph.segments`): their configurations
    and tensor ids equal those of the same graphs rebuilt from new objects, call after call."""
    import random
    import sys
    from pathlib import Path

    from latpred.deduce import deduce
    from latpred.pytorch.compose import chain

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_deduce_gpu_cache import block, copy

    blocks = [block(16, 8, pad, act) for pad in (False, True) for act in ("relu", "hard_swish")]
    rng = random.Random(7)
    subnets = [chain([rng.choice(blocks) for _ in range(rng.randint(1, 5))], rename=False)
               for _ in range(16)]
    kernels = [deduce(g, "pixel4/gpu/fp16") for g in subnets]
    assert any(len(k.ops) > 1 for ks in kernels for k in ks)   # fused kernels too

    def batch(graphs, ks):
        b = featurize(graphs, ks, None, lambda t: ("g", ()),
                      lambda g, k, t: {"bytes_read": 0.0, "bytes_written": 0.0})
        return b.config.tolist(), b.tensor_ids

    for part in (slice(0, 8), slice(8, 16), slice(4, 12), slice(0, 16)):
        graphs, ks = subnets[part], kernels[part]
        assert batch(graphs, ks) == batch([copy(g) for g in graphs], ks)
