"""The int8 delegation rules against LiteRT itself: which ops its profiler reports as TFLite's
own kernels (source "tflite") must be the deduced `builtin_*` kernels. Only where ops run is
compared, not how long they take (one profiled run per model)."""

from __future__ import annotations

import pytest

from latpred.deduce import deduce
from latpred.sampler import build_graph, load_space, sample
from latpred.tflite import read_tflite, write_tflite

pytest.importorskip("ai_edge_litert")


def _models():
    # seed 7, as datasets/host-cpu-int8-synthetic: every rule of the synthetic space shows up
    # (RELU/RELU6/HARD_SWISH, average and 1x1 stride-2 max pools, SPLIT_V, SOFTMAX)
    yield from (build_graph(a) for a in sample(load_space("search_space/synthetic_cnn.yaml"),
                                                  8, 7))
    from latpred.zoo import build

    yield build("mobilenet_v3_small")


def test_builtin_kernels_are_the_ops_litert_leaves_to_tflite():
    from latpred.profile.litert_profiler import profile_ops

    seen = set()
    for graph in _models():
        data = write_tflite(graph, precision="int8", seed=0)
        profile = profile_ops(data, runs=1, warmup=0)
        on_tflite = {op.index for op in profile.ops if op.source == "tflite"}
        quantized = read_tflite(data)
        for g in (graph, quantized):   # the float graph for an int8 target, and the int8 file
            kernels = deduce(g, "host/cpu/int8/t1")
            assert {k.main_op for k in kernels if k.type.startswith("builtin_")} == on_tflite
        seen |= {quantized.ops[i].type for i in on_tflite}
    assert {"RELU", "RELU6", "HARD_SWISH", "AVERAGE_POOL_2D", "MAX_POOL_2D", "SPLIT_V",
            "SOFTMAX"} <= seen


def test_int8_lookup_chains_are_the_runtimes_fused_unary_ops():
    """XNNPACK's 8-bit LUT fusion (deduce.xnnpack_int8.lut_chains): the profiler reports one
    "Invalid Unary Op" per deduced chain, and attribution gives each chain's kernel its time."""
    from latpred.profile.litert_profiler import profile_ops
    from latpred.profile.op_attribution import attribute_to_graph
    from latpred.zoo import build

    for name, chains in (("efficientnet_b0", 49), ("mobilenet_v3_small", 9)):
        data = write_tflite(build(name), precision="int8", seed=0)
        profile = profile_ops(data, runs=1, warmup=0)
        graph = read_tflite(data)
        kernels = deduce(graph, "host/cpu/int8/t1")
        luts = [k for k in kernels if len(k.ops) > 1]
        assert len(luts) == chains == sum(op.name == "Invalid Unary Op" for op in profile.ops)
        timed = {t.op_index for t in attribute_to_graph(graph, profile) if t.events}
        assert all(timed & set(k.ops) for k in luts)   # one op of each chain holds the lookup
