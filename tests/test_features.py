"""Operation and kernel features against hand-computed values, one test per Table 3 category."""

from __future__ import annotations

import dataclasses

import glob
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from latpred.builder import GraphBuilder
from latpred.deduce import deduce
from latpred.deduce.kernel import KERNEL_TYPES, Kernel
from latpred.errors import UnsupportedOpError
from latpred.features import CONTEXT, FEATURES, feature_matrix, kernel_features, op_features
from latpred.graph import Graph, Op, Tensor
from latpred.target import parse_target

GENERIC = {"input_h", "input_w", "input_c", "output_h", "output_w", "output_c", "input_size",
           "output_size", "n_inputs", "n_outputs", "flops", "bytes_read", "bytes_written",
           "param_bytes", "op_code"}


def _one(fn, shape=(1, 8, 8, 4)):
    """Features of the last op of a small graph built by `fn`."""
    b = GraphBuilder()
    fn(b, b.input(shape))
    g = b.build()
    return op_features(g, len(g.ops) - 1)


def _sub(f: dict, expected: dict) -> dict:
    return {k: f.get(k) for k in expected}


def test_conv2d():
    f = _one(lambda b, x: b.conv2d(x, 8, 3))
    # out 8*8*8 = 512 elements, 3*3*4 = 36 MACs each: 2*512*36 + 512 bias adds.
    assert f == {
        "input_h": 8, "input_w": 8, "input_c": 4, "output_h": 8, "output_w": 8, "output_c": 8,
        "input_size": 256, "output_size": 512, "n_inputs": 1, "n_outputs": 1,
        "stride_h": 1, "stride_w": 1, "kernel_h": 3, "kernel_w": 3, "dilation_h": 1,
        "dilation_w": 1, "filters": 8, "kernel_size": 288, "groups": 1,
        "flops": 2 * 512 * 36 + 512, "op_code": 3,  # BuiltinOperator_CONV_2D in schema.fbs
        "param_bytes": (288 + 8) * 4, "bytes_read": 256 * 4 + (288 + 8) * 4,
        "bytes_written": 512 * 4,
    }


def test_grouped_conv2d_without_bias():
    # a file's convolution without a bias (-1); the builder always gives one
    b = GraphBuilder()
    b.conv2d(b.input((1, 8, 8, 4)), 8, 3, groups=2, stride=2)
    g = b.build()
    op = g.ops[-1]
    g = dataclasses.replace(g, ops=(dataclasses.replace(op, inputs=(*op.inputs[:2], -1)),))
    f = op_features(g, 0)
    # out 4*4*8 = 128, 3*3*2 = 18 MACs each, no bias.
    assert _sub(f, {"groups": 0, "kernel_size": 0, "flops": 0, "param_bytes": 0,
                    "output_h": 0, "stride_h": 0}) == {
        "groups": 2, "kernel_size": 8 * 9 * 2, "flops": 2 * 128 * 18, "param_bytes": 144 * 4,
        "output_h": 4, "stride_h": 2}


def test_depthwise_conv2d():
    f = _one(lambda b, x: b.depthwise_conv2d(x, 3, stride=2, padding="VALID",
                                             depth_multiplier=2))
    # VALID: (8 + 2 - 3) // 2 = 3; out 3*3*8 = 72, 9 MACs each, + 72 bias adds.
    assert _sub(f, {"output_h": 0, "output_w": 0, "filters": 0, "depth_multiplier": 0,
                    "kernel_size": 0, "flops": 0}) == {
        "output_h": 3, "output_w": 3, "filters": 8, "depth_multiplier": 2, "kernel_size": 72,
        "flops": 2 * 72 * 9 + 72}
    assert "groups" not in f


def test_fully_connected():
    f = _one(lambda b, x: b.fully_connected(x, 10), (1, 16))
    assert _sub(f, {"input_c": 0, "filters": 0, "rows": 0, "param_size": 0, "flops": 0,
                    "param_bytes": 0}) == {
        "input_c": 16, "filters": 10, "rows": 1, "param_size": 170, "flops": 2 * 160 + 10,
        "param_bytes": 170 * 4}
    f = _one(lambda b, x: b.fully_connected(x, 10, bias=False), (1, 5, 16))
    assert (f["rows"], f["flops"], f["param_size"]) == (5, 2 * 5 * 16 * 10, 160)


def test_fully_connected_on_an_unflattened_input_uses_the_weights_features():
    t = [Tensor("x", (1, 2, 2, 4)), Tensor("w", (3, 16), is_constant=True), Tensor("y", (1, 3))]
    g = Graph(tuple(t), (Op.make("FULLY_CONNECTED", [0, 1, -1], [2]),), (0,), (2,))
    f = op_features(g, 0)
    assert (f["input_c"], f["rows"], f["flops"]) == (16, 1, 2 * 48)


def test_pooling():
    f = _one(lambda b, x: b.max_pool(x, 2))
    assert _sub(f, {"output_h": 0, "stride_h": 0, "kernel_w": 0, "flops": 0}) == {
        "output_h": 4, "stride_h": 2, "kernel_w": 2, "flops": 4 * 4 * 4 * 4}


def test_mean():
    f = _one(lambda b, x: b.mean(x))
    assert _sub(f, {"kernel_h": 0, "kernel_w": 0, "reduction_size": 0, "flops": 0,
                    "output_size": 0, "param_bytes": 0}) == {
        "kernel_h": 8, "kernel_w": 8, "reduction_size": 64, "flops": 256, "output_size": 4,
        "param_bytes": 0}   # the int32 axes are metadata, not parameters
    f = _one(lambda b, x: b.mean(x, (1,), keep_dims=False), (1, 16, 32))   # ViT token mean
    assert _sub(f, {"input_w": 0, "kernel_h": 0, "kernel_w": 0, "reduction_size": 0}) == {
        "input_w": 16, "kernel_h": 1, "kernel_w": 16, "reduction_size": 16}


def test_concat_and_split():
    def concat(b, x):
        b.concat([b.reshape(x, (1, 4, 4, 2)), b.input((1, 4, 4, 6))])
    f = _one(concat, (32,))
    assert _sub(f, {"input_c": 0, "output_c": 0, "n_inputs": 0, "input_size": 0,
                    "output_size": 0, "flops": 0}) == {
        "input_c": 2, "output_c": 8, "n_inputs": 2, "input_size": 128, "output_size": 128,
        "flops": 0}
    f = _one(lambda b, x: b.split(x, 2), (1, 4, 4, 6))
    assert _sub(f, {"input_c": 0, "output_c": 0, "n_outputs": 0, "input_size": 0,
                    "output_size": 0, "bytes_written": 0}) == {
        "input_c": 6, "output_c": 3, "n_outputs": 2, "input_size": 96, "output_size": 96,
        "bytes_written": 384}


def test_pad():
    f = _one(lambda b, x: b.pad(x, ((1, 2), (0, 1))), (1, 4, 4, 2))
    # out (1, 7, 5, 2) = 70 elements, 32 in.
    assert _sub(f, {"output_h": 0, "output_w": 0, "pad_h": 0, "pad_w": 0, "pad_c": 0,
                    "padding_size": 0, "output_size": 0}) == {
        "output_h": 7, "output_w": 5, "pad_h": 3, "pad_w": 1, "pad_c": 0, "padding_size": 38,
        "output_size": 70}


def test_elementwise_and_activation():
    f = _one(lambda b, x: b.add(x, b.input((1, 1, 1, 4))), (1, 4, 4, 4))
    assert _sub(f, {"input_size": 0, "output_size": 0, "n_inputs": 0, "broadcast": 0,
                    "flops": 0, "bytes_read": 0}) == {
        "input_size": 68, "output_size": 64, "n_inputs": 2, "broadcast": 1, "flops": 64,
        "bytes_read": 68 * 4}
    f = _one(lambda b, x: b.mul(x, b.constant(())), (1, 4, 4, 4))
    assert (f["param_bytes"], f["n_inputs"], f["broadcast"]) == (4, 1, 1)
    f = _one(lambda b, x: b.hard_swish(x), (1, 4, 4, 4))
    assert (f["flops"], f["broadcast"], f["input_size"]) == (64, 0, 64)


def test_batch_matmul_and_unknown_ops():
    t = [Tensor("a", (2, 3, 4)), Tensor("b", (2, 5, 4)), Tensor("y", (2, 3, 5)),
         Tensor("z", (2, 3, 5), "int8")]
    g = Graph(tuple(t), (Op.make("BATCH_MATMUL", [0, 1], [2], adj_y=True),
                         Op.make("CUSTOM:Foo", [2], [3])), (0, 1), (3,))
    f = op_features(g, 0)
    assert _sub(f, {"batch": 0, "m": 0, "k": 0, "n": 0, "flops": 0}) == {
        "batch": 2, "m": 3, "k": 4, "n": 5, "flops": 2 * 2 * 3 * 4 * 5}
    f = op_features(g, 1)
    assert set(f) == GENERIC
    # rank 3 (N, S, C) is seen as H=1, W=S.
    assert _sub(f, {"input_h": 0, "input_w": 0, "input_c": 0, "bytes_written": 0}) == {
        "input_h": 1, "input_w": 3, "input_c": 5, "bytes_written": 30}
    assert f["op_code"] == -1   # no TFLite builtin code for a custom op


def test_activations_of_one_shape_differ_only_by_op_code():
    """A LOGISTIC costs ~4x a RELU per element on the host CPU; only op_code tells them apart."""
    rows = {}
    for name in ("relu", "sigmoid", "gelu"):
        b = GraphBuilder(fuse_activations=False)
        getattr(b, name)(b.input((1, 8, 8, 4)))
        g = b.build()
        k = deduce(g, "host/cpu/fp32/t1")[-1]
        rows[name] = kernel_features(g, k, parse_target("host/cpu/fp32/t1"))
        assert k.type == "activation" and "op_code" in FEATURES[k.type]
    # BuiltinOperator codes of TFLite's schema.fbs: RELU 19, LOGISTIC 14, GELU 150.
    assert [rows[n]["op_code"] for n in ("relu", "sigmoid", "gelu")] == [19, 14, 150]
    same = {k: v for k, v in rows["relu"].items() if k != "op_code"}
    assert all({k: v for k, v in r.items() if k != "op_code"} == same for r in rows.values())


def test_op_code_table_is_the_installed_schemas():
    # op_code reads the codes from a data file so that machines without LiteRT can featurize;
    # the file must stay LiteRT's BuiltinOperator enum exactly.
    import json
    from importlib.resources import files

    from latpred.tflite.options import OPERATOR_CODES

    table = json.loads(files("latpred.features").joinpath("tflite_op_codes.json").read_text())
    assert table["codes"] == OPERATOR_CODES


def test_precision_scales_float_bytes():
    b = GraphBuilder()
    b.conv2d(b.input((1, 8, 8, 4)), 8, 3)
    g = b.build()
    fp32, fp16, int8 = (op_features(g, 0, p) for p in (None, "fp16", "int8"))
    assert fp16["bytes_read"] * 2 == fp32["bytes_read"] == int8["bytes_read"] * 4
    assert fp16["flops"] == fp32["flops"]


def _residual_graph():
    """conv (1,16,16,64) -> 64 filters 3x3 -> ADD(residual) -> RELU, as a GPU would fuse."""
    b = GraphBuilder(fuse_activations=False)
    x = b.input((1, 16, 16, 64))
    b.relu(b.add(b.conv2d(x, 64, 3), x))
    return b.build()


def test_kernel_features_fused_ops():
    g = _residual_graph()
    single = kernel_features(g, Kernel("conv2d", (0,)))
    fused = kernel_features(g, Kernel("conv2d", (0, 1, 2), device="gpu"))
    residual = 16 * 16 * 64 * 4
    assert _sub(fused, {"n_fused_ops": 0, "n_fused_elementwise": 0, "fused_activation": 0,
                        "fused_bytes_read": 0}) == {
        "n_fused_ops": 2, "n_fused_elementwise": 1, "fused_activation": 1,
        "fused_bytes_read": residual}
    assert fused["bytes_read"] == single["bytes_read"] + residual
    assert (single["n_fused_ops"], single["fused_activation"]) == (0, 0)
    assert kernel_features(g, Kernel("activation", (2,)))["fused_activation"] == 0


def test_kernel_features_fused_activation_attribute():
    b = GraphBuilder()
    b.conv2d(b.input((1, 4, 4, 4)), 4, 1, activation="RELU6")
    assert kernel_features(b.build(), Kernel("conv2d", (0,)))["fused_activation"] == 1


def test_winograd_stages():
    g = _residual_graph()
    tiles, c, o = 4 * 4, 64, 64          # ceil(16/4)^2
    parts = {p: kernel_features(g, Kernel(f"winograd_{p}", (0,), device="gpu", part=p))
             for p in ("input_transform", "matmul", "output_transform")}
    for f in parts.values():
        assert (f["tiles"], f["src_depth"], f["dst_depth"]) == (16, 16, 16)
    assert parts["input_transform"]["flops"] == 864 * tiles * c
    assert parts["input_transform"]["bytes_written"] == 36 * tiles * c * 4
    assert parts["matmul"]["flops"] == 2 * 36 * tiles * c * o
    assert parts["matmul"]["param_bytes"] == 36 * c * o * 4
    assert parts["matmul"]["bytes_read"] == (36 * tiles * c + 36 * c * o) * 4
    assert parts["output_transform"]["flops"] == 480 * tiles * o + 16 * 16 * 64
    assert parts["output_transform"]["bytes_written"] == 16 * 16 * 64 * 4
    # fp16 target: half the bytes.
    half = kernel_features(g, Kernel("winograd_matmul", (0,), part="matmul"),
                           SimpleNamespace(precision="fp16"))
    assert half["bytes_read"] * 2 == parts["matmul"]["bytes_read"]


def test_every_kernel_type_has_a_complete_column_order():
    assert set(FEATURES) == set(KERNEL_TYPES)
    b = GraphBuilder()
    x = b.input((1, 8, 8, 16))
    example = {
        "conv2d": b.conv2d(x, 16, 3), "grouped_conv2d": b.conv2d(x, 16, 3, groups=4),
        "dwconv2d": b.depthwise_conv2d(x, 3), "fc": b.fully_connected(b.reshape(x, (1, -1)), 3),
        "pool": b.max_pool(x, 2), "mean": b.mean(x), "concat": b.concat([x, x]),
        "split": b.split(x, 2)[0], "pad": b.pad(x, 1), "elementwise": b.add(x, x),
        "activation": b.hard_swish(x), "softmax": b.softmax(x), "reshape": b.reshape(x, (-1,)),
        "transpose": b.transpose(x, (0, 2, 1, 3)),
        **{f"winograd_{p}": b.conv2d(x, 16, 3, name=p)
           for p in ("input_transform", "matmul", "output_transform")},
    }
    b.output(*example.values())
    g = b.build()
    for ktype, tensor in example.items():
        op = g.producer(g.outputs[list(example).index(ktype)])
        f = kernel_features(g, Kernel(ktype, (op,)))
        missing = set(FEATURES[ktype]) - set(f) - {CONTEXT}   # graph-level, set per graph
        assert not missing, (ktype, missing)
    from latpred.tflite import read_tflite   # ops the builder does not make

    vit = read_tflite(os.path.join(os.path.dirname(__file__), "fixtures", "tiny_vit.tflite"))
    first = {op.type: i for i, op in reversed(list(enumerate(vit.ops)))}
    for ktype, op_type in (("batch_matmul", "BATCH_MATMUL"), ("strided_slice", "STRIDED_SLICE"),
                           ("quantize", "RSQRT"), ("other", "NEG")):
        f = kernel_features(vit, Kernel(ktype, (first[op_type],)))
        assert not set(FEATURES[ktype]) - set(f), ktype


def test_feature_matrix_orders_columns_and_fills_nan():
    cols = FEATURES["elementwise"]
    rows = [{c: float(i) for i, c in enumerate(cols)}, {c: 1.0 for c in cols}]
    m = feature_matrix(rows, "elementwise")
    assert m.shape == (2, len(cols)) and m.dtype == np.float64
    assert list(m[0]) == list(range(len(cols)))
    partial = feature_matrix([{"input_h": 3.0}], "elementwise")
    assert partial[0, 0] == 3.0 and np.isnan(partial[0, 1:]).all()
    assert feature_matrix([], "conv2d").shape == (0, len(FEATURES["conv2d"]))
    with pytest.raises(UnsupportedOpError, match="Unknown kernel type"):
        feature_matrix(rows, "conv3d")


def test_every_op_of_converter_models_gets_generic_features():
    from latpred.tflite import read_tflite

    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    for path in sorted(glob.glob(os.path.join(fixtures, "*.tflite"))):
        if "dynamic" in path:
            continue
        g = read_tflite(path)
        for i in range(len(g.ops)):
            f = op_features(g, i)
            assert GENERIC <= set(f), (path, g.ops[i].type)
            assert all(math.isfinite(v) and v >= 0 for v in f.values())


def test_grouped_conv_split_into_group_kernels():
    b = GraphBuilder()
    b.conv2d(b.input((1, 8, 8, 8)), 16, 3, groups=4)     # 4 groups of 2 -> 4 channels
    g = b.build()
    whole = op_features(g, 0)
    one = kernel_features(g, Kernel("conv2d", (0,), "gpu", part="group2"))
    assert _sub(one, {"input_c": 0, "filters": 0, "groups": 0, "flops": 0, "kernel_size": 0,
                      "bytes_written": 0}) == {
        "input_c": 2, "filters": 4, "groups": 1, "flops": whole["flops"] // 4,
        "kernel_size": 4 * 9 * 2, "bytes_written": 8 * 8 * 4 * 4}
    split = kernel_features(g, Kernel("split", (0,), "gpu", part="group_split"))
    assert _sub(split, {"output_c": 0, "n_outputs": 0, "output_size": 0, "flops": 0,
                        "param_bytes": 0, "bytes_read": 0, "bytes_written": 0}) == {
        "output_c": 2, "n_outputs": 4, "output_size": 512, "flops": 0, "param_bytes": 0,
        "bytes_read": 2048, "bytes_written": 2048}
    concat = kernel_features(g, Kernel("concat", (0,), "gpu", part="group_concat"))
    assert _sub(concat, {"input_c": 0, "output_c": 0, "n_inputs": 0, "input_size": 0,
                         "bytes_read": 0}) == {
        "input_c": 4, "output_c": 16, "n_inputs": 4, "input_size": 1024, "bytes_read": 4096}
    wino = kernel_features(g, Kernel("winograd_matmul", (0,), "gpu", part="group0_matmul"))
    assert wino["flops"] == 2 * 36 * 4 * 2 * 4        # tiles 2*2, C 2, O 4 per group


def test_rewritten_convolutions_fill_their_kernel_type_columns():
    b = GraphBuilder()
    x = b.input((1, 1, 1, 32))
    b.output(b.conv2d(x, 10, 1), b.conv2d(x, 64, 3, groups=32),
             b.avg_pool(b.input((1, 4, 4, 8)), 4))
    g = b.build()
    fc = kernel_features(g, Kernel("fc", (0,), "gpu"))
    assert (fc["rows"], fc["param_size"], fc["input_c"]) == (1, 330, 32)
    dw = kernel_features(g, Kernel("dwconv2d", (1,), "gpu"))
    assert dw["depth_multiplier"] == 2
    mean = kernel_features(g, Kernel("mean", (2,), "gpu"))
    assert (mean["reduction_size"], mean["kernel_h"], mean["kernel_w"]) == (16, 4, 4)
    t = [Tensor("a", (1, 4)), Tensor("b", (1, 1)), Tensor("y", (1, 4))]
    odd = Graph(tuple(t), (Op.make("ATAN2", [0, 1], [2]),), (0, 1), (2,))
    assert kernel_features(odd, Kernel("elementwise", (0,)))["broadcast"] == 1


def test_deduced_kernels_have_every_column_of_their_type():
    """The contract training relies on: no kernel deduce makes lacks one of its columns."""
    from latpred.deduce import deduce
    from latpred.device_profile import available_devices, load_device
    from latpred.errors import DelegateRefusedError
    from latpred.sampler import build_graph, load_space, sample
    from latpred.target import parse_target, target_strings
    from latpred.tflite import read_tflite

    root = os.path.dirname(os.path.dirname(__file__))
    graphs = [read_tflite(p) for p in sorted(glob.glob(os.path.join(root, "tests", "fixtures",
                                                                   "*.tflite")))
              if "dynamic" not in p]
    for space in ("synthetic_cnn", "mnasnet_residual"):
        s = load_space(os.path.join(root, "search_space", f"{space}.yaml"))
        graphs += [build_graph(a) for a in sample(s, 6, seed=3)]
    b = GraphBuilder()                                    # Winograd-sized and grouped convs
    x = b.conv2d(b.input((1, 32, 32, 128)), 128, 3)
    b.output(b.conv2d(x, 128, 3, groups=4))
    graphs.append(b.build())
    types = set()
    for name in available_devices():
        for text in target_strings(load_device(name)):
            target = parse_target(text)
            for g in graphs:
                try:
                    kernels = deduce(g, target)
                except DelegateRefusedError:
                    continue    # a model the target's GPU runtime would not run
                for k in kernels:
                    f = kernel_features(g, k, target)
                    types.add(k.type)
                    bad = [c for c in FEATURES[k.type]
                           if c != CONTEXT and not math.isfinite(f.get(c, math.nan))]
                    assert not bad, (text, k, bad)
    assert {"conv2d", "dwconv2d", "fc", "mean", "elementwise", "winograd_matmul"} <= types


def test_context_bytes_is_rounded_to_eighths_of_an_octave():
    from latpred.features import context_bytes

    x = np.array([0.0, 1e3, 1e6, 0.99e6, 5e7])
    c = context_bytes(x)
    assert c[0] == 0 and np.all(np.abs(c[1:] / x[1:] - 1) <= 2 ** (1 / 16) - 1)
    assert c[2] == c[3]   # 1% apart, on one side of a level boundary: one level
    assert np.allclose(np.log2(c[1:]) * 8, np.round(np.log2(c[1:]) * 8))


def test_grouped_conv_gets_its_per_group_shape():
    """cuDNN's (and XNNPACK's) choice of kernels turns on the channels of one group and their
    alignment, which a tree cannot derive from totals: given as features, and filled in for
    datasets featurized before them."""
    import pandas as pd

    from latpred.predictors.training import with_graph_columns

    b = GraphBuilder()
    x = b.input((1, 14, 14, 312))
    b.output(b.conv2d(x, 208, 3, groups=13))
    g = b.build()
    target = parse_target("h100/cuda/fp16")
    (k,) = [k for k in deduce(g, target) if k.type == "grouped_conv2d"]
    f = kernel_features(g, k, target)
    assert (f["group_in_c"], f["group_out_c"], f["group_in_align"], f["group_out_align"]) == \
        (24, 16, 8, 16)
    assert f["group_gemm_k"] == 24 * 9 and f["group_flops"] == f["flops"] // 13
    assert f["group_param_bytes"] == f["param_bytes"] // 13
    assert "group_in_c" in FEATURES["grouped_conv2d"] and "group_in_c" not in FEATURES["conv2d"]
    old = pd.DataFrame({"model_id": ["m", "m"], "kernel_type": ["grouped_conv2d", "conv2d"],
                        "ops": ["CONV_2D", "CONV_2D"], "f_input_c": [312.0, 8.0],
                        "f_filters": [208.0, 8.0], "f_groups": [13.0, 1.0],
                        "f_kernel_h": [3.0, 1.0], "f_kernel_w": [3.0, 1.0],
                        "f_flops": [1300.0, 8.0], "f_param_bytes": [2600.0, 8.0],
                        "f_bytes_read": [1.0, 1.0], "f_bytes_written": [1.0, 1.0]})
    filled = with_graph_columns(old)
    assert filled["f_group_in_c"].iloc[0] == 24 and filled["f_group_out_align"].iloc[0] == 16
    assert filled["f_group_gemm_k"].iloc[0] == 216 and filled["f_group_flops"].iloc[0] == 100
    assert math.isnan(filled["f_group_in_c"].iloc[1])
