"""Kernel deduction: the paper's Table 2, hand-built blocks, and properties over random graphs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latpred.builder import GraphBuilder
from latpred.deduce import KERNEL_TYPES, deduce
from latpred.deduce.conv_selection import ConvGeom, winograd_mldrift, winograd_tflite29
from latpred.deduce.explain import explain
from latpred.deduce.optypes import bhwc
from latpred.errors import DelegateRefusedError
from latpred.graph import Graph
from latpred.device_profile import load_device

ADRENO, MALI, NVIDIA = "pixel4/gpu/fp16", "galaxys10/gpu/fp16", "h100/gpu/fp16"
GPU_TARGETS = (ADRENO, "mi8se/gpu/fp16", MALI, "galaxya03s/gpu/fp16", "iphonexs/gpu/fp16",
               NVIDIA)
CPU_TARGETS = ("pixel4/cpu/fp32/1L+3M", "host/cpu/fp32/t2", "host/cpu/int8/t1")


def deduce_or_refusal(graph: Graph, target: str):
    """The kernels, or the refusal of a delegate that takes the model whole or not at all
    (LiteRT's GPU accelerator alone, when an op would be left for the CPU)."""
    try:
        return deduce(graph, target)
    except DelegateRefusedError as e:
        assert "left for the CPU" in str(e)
        return str(e)


def types(kernels) -> list[str]:
    return [k.type for k in kernels]


def single_conv(c_in: int, c_out: int, hw: int, kernel=3, batch: int = 1, **kw) -> Graph:
    b = GraphBuilder("conv")
    b.output(b.conv2d(b.input((batch, hw, hw, c_in)), c_out, kernel, **kw))
    return b.build()


# -- Table 2 of the operation-wise paper: ResNet16's 3x3 stride-1 convolutions ------------------
@pytest.mark.parametrize("channels, hw, src_depth, tiles, adreno, mali", [
    (64, 56, 16, 196, False, True),
    (128, 28, 32, 49, False, True),
    (256, 14, 64, 16, False, False),
])
def test_table2_winograd(channels, hw, src_depth, tiles, adreno, mali):
    graph = single_conv(channels, channels, hw)
    for target, expected in ((ADRENO, adreno), (MALI, mali)):
        kernels = deduce(graph, target)
        winograd = types(kernels) == ["winograd_input_transform", "winograd_matmul",
                                      "winograd_output_transform"]
        assert winograd == expected, (target, kernels[0].rule)
        if not expected:
            assert types(kernels) == ["conv2d"]
        rule = kernels[0].rule
        assert "TFLite 2.9" in rule and f"total_tiles {tiles}" in rule
        assert (f"src_depth {src_depth} " in rule) == ("src_depth" in rule)
    assert "Adreno 6xx" in deduce(graph, ADRENO)[0].rule and "Mali" in deduce(graph, MALI)[0].rule


def test_table2_rule_text_names_the_failing_condition():
    conv1, conv2 = deduce(single_conv(64, 64, 56), ADRENO), deduce(single_conv(128, 128, 28), ADRENO)
    assert "src_depth 16 < 32, dst_depth 16 < 32" in conv1[0].rule
    assert "total_tiles 49 < 128" in conv2[0].rule
    assert "total_tiles 16 < 32" in deduce(single_conv(256, 256, 14), MALI)[0].rule


def _geom(c, hw, batch=1, **kw):
    base = dict(batch=batch, in_h=hw, in_w=hw, cin=c, cout=c, kh=3, kw=3, out_h=hw, out_w=hw,
                stride=(1, 1), dilation=(1, 1), groups=1, padded=True)
    base.update(kw)
    return ConvGeom(**base)


def test_winograd_rules_by_vendor_and_version():
    gpus = {n: load_device(n).gpu for n in ("pixel4", "galaxys10", "galaxya03s", "h100")}
    amd = load_device("h100").gpu.__class__(vendor="amd", model="Radeon", family="rdna",
                                            api="vulkan")
    # AMD needs only dst_depth >= 8 (Algorithm 3.2, line 19).
    assert winograd_tflite29(_geom(64, 32, cout=32), amd, "t")[0]
    assert not winograd_tflite29(_geom(64, 32, cout=32), gpus["galaxys10"], "t")[0]
    # Not 3x3 / strided / dilated / grouped: never Winograd.
    for kw in ({"kh": 5, "kw": 5}, {"stride": (2, 2)}, {"dilation": (2, 2)}, {"groups": 2}):
        for rule in (winograd_tflite29, winograd_mldrift):
            assert not rule(_geom(128, 56, **kw), gpus["galaxys10"], "t")[0]
    # ML Drift counts the batch in the tiles; TFLite 2.9 does not.
    assert not winograd_tflite29(_geom(64, 16, batch=2), gpus["h100"], "t")[0]
    assert winograd_mldrift(_geom(64, 16, batch=2), gpus["h100"], "t")[0]
    assert not winograd_mldrift(_geom(64, 16, batch=1), gpus["h100"], "t")[0]
    # Boundaries: 64 channels is depth 16; 60 is 15. 24x24 outputs make 36 tiles, 20x20 25.
    assert winograd_mldrift(_geom(64, 24), gpus["h100"], "t")[0]
    assert not winograd_mldrift(_geom(60, 24), gpus["h100"], "t")[0]
    assert not winograd_mldrift(_geom(64, 20), gpus["h100"], "t")[0]
    assert winograd_tflite29(_geom(64, 24), gpus["galaxya03s"], "t")[0]


def test_winograd_on_h100_uses_mldrift_rules():
    kernels = deduce(single_conv(64, 64, 24, batch=1), NVIDIA)
    assert [k.part for k in kernels] == ["input_transform", "matmul", "output_transform"]
    assert all(k.ops == (0,) for k in kernels) and "ML Drift" in kernels[0].rule
    assert types(deduce(single_conv(64, 64, 16, batch=2), NVIDIA))[0] == "winograd_input_transform"
    assert types(deduce(single_conv(64, 64, 16, batch=2), MALI)) == ["conv2d"]


# -- hand-built blocks ---------------------------------------------------------------------------
def residual_block(c: int, hw: int, skip_first: bool = False) -> Graph:
    b = GraphBuilder("res")
    x = b.input((1, hw, hw, c))
    y = b.conv2d(x, c, 3, activation="RELU")
    y = b.conv2d(y, c, 3)
    b.output(b.add(x, y, activation="RELU") if skip_first else b.add(y, x, activation="RELU"))
    return b.build()


@pytest.mark.parametrize("skip_first", [False, True])
def test_residual_add_fuses_into_the_last_convolution(skip_first):
    graph = residual_block(64, 56, skip_first)
    kernels = deduce(graph, ADRENO)
    assert types(kernels) == ["conv2d", "conv2d"]
    assert kernels[1].ops == (1, 2) and "fused ADD#2" in kernels[1].rule
    mali = deduce(graph, MALI)  # Winograd: the add joins the output transform
    assert len(mali) == 6 and mali[5].ops == (1, 2) and mali[5].part == "output_transform"


def test_add_with_broadcast_does_not_reorder_or_fuse():
    b = GraphBuilder("bcast")
    x = b.input((1, 16, 16, 32))
    y = b.conv2d(x, 32, 1)
    s = b.conv2d(b.mean(x), 32, 1)  # (1, 1, 1, 32), written after y
    b.output(b.add(y, s))
    kernels = deduce(b.build(), ADRENO)
    assert types(kernels) == ["conv2d", "mean", "conv2d", "elementwise"]


def se_block() -> Graph:
    b = GraphBuilder("se")
    x = b.input((1, 28, 28, 32))
    y = b.depthwise_conv2d(x, 3, activation="RELU6")
    y = b.squeeze_excite(y)
    b.output(b.swish(b.conv2d(y, 32, 1)))
    return b.build()


def test_se_block_and_swish():
    graph = se_block()
    ops = [op.type for op in graph.ops]
    assert ops == ["DEPTHWISE_CONV_2D", "MEAN", "CONV_2D", "CONV_2D", "LOGISTIC", "MUL",
                   "CONV_2D", "LOGISTIC", "MUL"]
    # TFLite 2.9: the gate's sigmoid links into its convolution; the scaling MUL reads two
    # tensors and stays alone; swish's MUL reads the sigmoid's output last, so it is reordered
    # and links into the sigmoid, not into the convolution (whose output has two readers).
    assert [k.ops for k in deduce(graph, ADRENO)] == [(0,), (1,), (2,), (3, 4), (5,), (6,),
                                                     (7, 8)]
    # ML Drift: 1x1 convolutions on 1x1 inputs are fully connected, and swish fuses into the
    # convolution after MergeElementwiseNodes joins LOGISTIC and MUL.
    h100 = deduce(graph, NVIDIA)
    assert types(h100) == ["dwconv2d", "mean", "fc", "fc", "elementwise", "conv2d"]
    assert h100[-1].ops == (6, 7, 8)


def test_activation_chain_fuses_and_stops_at_a_second_reader():
    b = GraphBuilder("chain", fuse_activations=False)
    x = b.input((1, 16, 16, 8))
    y = b.tanh(b.relu(b.conv2d(x, 8, 3)))
    b.output(b.sigmoid(y))
    assert [k.ops for k in deduce(b.build(), ADRENO)] == [(0, 1, 2, 3)]
    b = GraphBuilder("fork", fuse_activations=False)
    x = b.input((1, 16, 16, 8))
    y = b.conv2d(x, 8, 3)
    b.output(b.relu(y), b.tanh(y))
    for target in (ADRENO, NVIDIA):
        assert [k.ops for k in deduce(b.build(), target)] == [(0,), (1,), (2,)]


def test_graph_output_is_not_fused_away():
    b = GraphBuilder("out", fuse_activations=False)
    y = b.conv2d(b.input((1, 8, 8, 8)), 8, 3)
    b.output(y, b.relu(y))
    assert [k.ops for k in deduce(b.build(), NVIDIA)] == [(0,), (1,)]


def split_concat(n: int = 2) -> Graph:
    b = GraphBuilder("split", fuse_activations=False)
    x = b.input((1, 16, 16, 32))
    parts = [b.relu(p) for p in b.split(b.conv2d(x, 32, 1), n)]
    b.output(b.conv2d(b.concat(parts), 32, 1))
    return b.build()


def test_split_concat_block():
    kernels = deduce(split_concat(4), ADRENO)
    assert types(kernels) == ["conv2d", "split"] + ["activation"] * 4 + ["concat", "conv2d"]
    cpu = deduce(split_concat(4), "pixel4/cpu/fp32/1L")
    assert len(cpu) == 8 and all(k.device == "cpu" and len(k.ops) == 1 for k in cpu)


def shuffle_block() -> Graph:
    """A channel shuffle as converters emit it: a 5-D reshape, a transpose, a reshape back."""
    b = GraphBuilder("shuffle")
    x = b.input((1, 16, 16, 32))
    y = b.conv2d(x, 32, 1, activation="RELU")
    y = b.reshape(b.transpose(b.reshape(y, (1, 16, 16, 2, 16)), (0, 1, 2, 4, 3)),
                  (1, 16, 16, 32))
    y = b.conv2d(y, 32, 1, activation="RELU")
    b.output(b.conv2d(y, 32, 1))
    return b.build()


def test_unsupported_ops_fall_back_to_cpu():
    graph = shuffle_block()
    pixel4 = explain(graph, ADRENO)
    # TFLite 2.9 delegates only the largest GPU partition: the two convolutions after the
    # shuffle; the shuffle and the first convolution run on the CPU.
    assert [k["device"] for k in pixel4["kernels"]] == ["cpu"] * 4 + ["gpu"] * 2
    assert not pixel4["summary"]["fully_on_gpu"]
    assert "5-D tensor" in pixel4["kernels"][1]["rule"]
    assert "largest GPU partition" in pixel4["kernels"][0]["rule"]
    # LiteRT's GPU accelerator alone (how latpred compiles for h100/gpu) refuses the model:
    # compiled_model.cc "Some ops are not accelerated" (the zoo's ShuffleNetV2, status 504).
    with pytest.raises(DelegateRefusedError, match=r"3 of 6 ops .*op 1, RESHAPE: .*5-D"):
        explain(graph, NVIDIA)


def test_pad_merges_into_the_convolution():
    b = GraphBuilder("pad")
    x = b.input((1, 16, 16, 8))
    b.output(b.conv2d(b.pad(x, 1), 8, 3, padding="VALID"))
    kernels = deduce(b.build(), ADRENO)
    assert [k.ops for k in kernels] == [(1, 0)] and "PAD#0 merged" in kernels[0].rule
    b = GraphBuilder("chpad")
    x = b.input((1, 16, 16, 8))
    b.output(b.conv2d(b.pad(x, ((0, 0), (0, 0), (0, 0), (0, 8))), 8, 1))
    assert types(deduce(b.build(), ADRENO)) == ["pad", "conv2d"]


def test_grouped_convolutions():
    supported = single_conv(64, 64, 16, kernel=3, groups=4)  # 16 in, 16 out per group
    assert types(deduce(supported, ADRENO)) == ["grouped_conv2d"]
    unsupported = single_conv(24, 24, 16, kernel=3, groups=4)  # 6 per group
    kernels = deduce(unsupported, ADRENO)
    assert types(kernels) == ["split"] + ["conv2d"] * 4 + ["concat"]
    assert [k.part for k in kernels] == ["group_split", "group0", "group1", "group2", "group3",
                                         "group_concat"]
    assert all(k.ops == (0,) for k in kernels)
    depthwise_like = single_conv(24, 24, 16, kernel=3, groups=24)
    assert types(deduce(depthwise_like, NVIDIA)) == ["dwconv2d"]
    assert types(deduce(depthwise_like, "pixel4/cpu/fp32/1L")) == ["grouped_conv2d"]


def test_global_average_pooling_is_a_reduce_on_gpu():
    b = GraphBuilder("gap")
    b.output(b.avg_pool(b.input((1, 7, 7, 64)), 7))
    assert types(deduce(b.build(), ADRENO)) == ["mean"]
    assert types(deduce(b.build(), "pixel4/cpu/fp32/1L")) == ["pool"]


def test_cpu_multithreading_flags():
    graph = se_block()
    phone = deduce(graph, "pixel4/cpu/fp32/1L+3M")
    assert [k.multithreaded for k in phone] == [True, False, True, True, False, False, True,
                                                False, False]
    host = deduce(graph, "host/cpu/fp32/t2")
    assert all(k.multithreaded for k in host)
    assert len(host) == len(graph.ops)


def test_shared_cpu_kernels_are_those_of_their_own_op():
    """CPU kernels are cached across graphs; the same op position holding ops of other types,
    or a plain and a grouped convolution, still gets its own kernel type and rule."""
    from latpred.deduce.optypes import kernel_type

    def graph(grouped: bool, pool: str) -> Graph:
        b = GraphBuilder("g")
        x = b.conv2d(b.input((1, 8, 8, 16)), 16, 3, groups=4 if grouped else 1)
        b.output(b.max_pool(x, 2) if pool == "max" else b.avg_pool(x, 2))
        return b.build()

    seen = set()
    for grouped, pool in [(False, "max"), (True, "avg"), (False, "avg"), (True, "max")]:
        g = graph(grouped, pool)
        for i, k in enumerate(deduce(g, "host/cpu/fp32/t1")):
            op = g.ops[i]
            assert (k.type, k.ops) == (kernel_type(g, op), (i,)) and op.type in k.rule
            seen.add(k.type)
    assert {"conv2d", "grouped_conv2d", "pool"} <= seen


# -- properties over random graphs ---------------------------------------------------------------
STEPS = ("conv1", "conv3", "dw", "relu", "sigmoid", "tanh", "add", "mul", "se_mul", "concat",
         "split", "pad_conv", "shuffle", "pool")


def random_graph(steps, n_outputs: int) -> Graph:
    b = GraphBuilder("rand", fuse_activations=False)
    pool = [b.input((1, 24, 24, 16))]

    def pick(k: int) -> int:
        return pool[k % len(pool)]

    for kind, k1, k2, width in steps:
        x = pick(k1)
        c = b.shape(x)[-1]
        if kind == "conv1":
            pool.append(b.conv2d(x, width, 1))
        elif kind == "conv3":
            pool.append(b.conv2d(x, width, 3))
        elif kind == "dw":
            pool.append(b.depthwise_conv2d(x, 3))
        elif kind in ("relu", "sigmoid", "tanh"):
            pool.append(getattr(b, kind)(x))
        elif kind in ("add", "mul"):
            y = next((t for t in reversed(pool) if b.shape(t) == b.shape(x) and t != x), x)
            pool.append(getattr(b, kind)(x, y))
        elif kind == "se_mul":
            pool.append(b.mul(x, b.sigmoid(b.mean(x))))
        elif kind == "concat":
            pool.append(b.concat([x, x]))
        elif kind == "split" and c % 2 == 0:
            pool.extend(b.split(x, 2))
        elif kind == "pad_conv":
            pool.append(b.conv2d(b.pad(x, 1), width, 3, padding="VALID"))
        elif kind == "shuffle" and c % 2 == 0:
            h, w = b.shape(x)[1:3]
            y = b.transpose(b.reshape(x, (1, h, w, 2, c // 2)), (0, 1, 2, 4, 3))
            pool.append(b.reshape(y, (1, h, w, c)))
        elif kind == "pool":
            pool.append(b.max_pool(x, 2, stride=1, padding="SAME"))
    outs = [pool[-1]] + [pick(7 * i + 3) for i in range(n_outputs - 1)]
    b.output(*dict.fromkeys(outs))
    return b.build()


graphs = st.builds(random_graph,
                   st.lists(st.tuples(st.sampled_from(STEPS), st.integers(0, 99),
                                      st.integers(0, 99), st.sampled_from([16, 64])),
                            min_size=1, max_size=18),
                   st.integers(1, 3))


def _identity_reshape(graph: Graph, i: int) -> bool:
    op = graph.ops[i]
    return op.type == "RESHAPE" and bhwc(graph.tensors[op.inputs[0]].shape) == \
        bhwc(graph.tensors[op.outputs[0]].shape)


def _readers(graph: Graph, t: int) -> int:
    return len(graph.consumers_of(t)) + (t in graph.outputs)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(graphs)
def test_properties_on_random_graphs(graph):
    producer = graph.producers
    for target in GPU_TARGETS + CPU_TARGETS:
        kernels = deduce_or_refusal(graph, target)
        assert kernels == deduce_or_refusal(graph, target)  # deterministic
        if isinstance(kernels, str):
            continue
        assert all(k.type in KERNEL_TYPES and k.device in ("cpu", "gpu") for k in kernels)
        # Every op is in exactly one kernel, or in the kernels of one multi-kernel lowering.
        homes: dict[int, list[int]] = {}
        for n, k in enumerate(kernels):
            for i in k.ops:
                homes.setdefault(i, []).append(n)
        assert sorted(homes) == list(range(len(graph.ops)))
        for i, where in homes.items():
            if len(where) > 1:
                assert all(kernels[n].part for n in where)
                assert where == list(range(where[0], where[-1] + 1))
                assert all(kernels[n].main_op == i for n in where)
        # Kernels come in an order the data flow allows.
        seen: set[int] = set()
        for n, k in enumerate(kernels):
            for i in k.ops:
                for t in graph.ops[i].inputs:
                    p = producer.get(t)
                    assert p is None or p in seen or p in k.ops
            seen.update(k.ops)
        # A tensor read elsewhere never fuses forward: its reader cannot share the kernel of
        # its producer. Algorithm 3.1 (TFLite 2.9) never fuses a two-reader tensor at all.
        strict = target in GPU_TARGETS and target != NVIDIA
        for k in kernels:
            for i in k.ops:
                if _identity_reshape(graph, i):
                    continue
                for t in graph.ops[i].inputs:
                    p = producer.get(t)
                    if p is None or p == i or p not in k.ops or graph.ops[p].type == "PAD":
                        continue
                    readers_outside = [c for c in graph.consumers_of(t) if c not in k.ops]
                    assert not readers_outside and t not in graph.outputs, (target, k)
                    if strict:
                        assert _readers(graph, t) == 1, (target, k)
        if target in CPU_TARGETS:
            # One op per kernel, but for a zero PAD folded into the convolution after it and
            # 8-bit element-wise chains XNNPACK runs as one table lookup.
            assert all(k.device == "cpu" for k in kernels)
            assert all(len(k.ops) == 1 or graph.ops[k.ops[1]].type == "PAD"
                       or "one table lookup" in k.rule for k in kernels)


def test_deduction_is_the_same_after_a_tflite_round_trip(tmp_path):
    from latpred import read_tflite, write_tflite

    for graph in (residual_block(64, 56), se_block(), shuffle_block()):
        back = read_tflite(write_tflite(graph))
        for target in (ADRENO, MALI, NVIDIA, "host/cpu/fp32/t1"):
            got, want = deduce_or_refusal(back, target), deduce_or_refusal(graph, target)
            assert got == want if isinstance(want, str) else \
                [(k.type, k.ops, k.device) for k in got] == \
                [(k.type, k.ops, k.device) for k in want]


def test_xnnpack_folds_a_zero_pad_into_the_convolution_after_it():
    # Keras's ZeroPadding2D + VALID strided convolution: one XNNPACK node (xnn_subgraph_fusion);
    # the TFLite 2.9 CPU rules keep the PAD as its own kernel, and a PAD read twice stays too.
    from latpred.builder import GraphBuilder
    from latpred.features import kernel_features

    b = GraphBuilder()
    x = b.input((1, 16, 16, 8))
    p = b.pad(x, ((0, 1), (0, 1)))
    y = b.conv2d(p, 8, 3, stride=2, padding="VALID")
    z = b.depthwise_conv2d(b.pad(y, 1), 3, padding="VALID")
    b.output(z)
    g = b.build()
    kernels = deduce(g, "host/cpu/fp32/t1")
    assert [k.type for k in kernels] == ["conv2d", "dwconv2d"]
    assert [len(k.ops) for k in kernels] == [2, 2] and "folded" in kernels[0].rule
    assert sorted(i for k in kernels for i in k.ops) == list(range(len(g.ops)))
    # Its features are the convolution's own, as when the PAD was a kernel of its own.
    alone = deduce(g, "pixel4/cpu/fp32/1L")
    assert [k.type for k in alone] == ["pad", "conv2d", "pad", "dwconv2d"]
    assert kernel_features(g, kernels[0], "host/cpu/fp32/t1") == \
        kernel_features(g, alone[1], "host/cpu/fp32/t1")
    b2 = GraphBuilder()
    x = b2.input((1, 8, 8, 4))
    p = b2.pad(x, 1)
    b2.output(b2.conv2d(p, 4, 3, padding="VALID"), b2.relu(p))
    assert "pad" in [k.type for k in deduce(b2.build(), "host/cpu/fp32/t1")]


def test_xnnpack_runs_large_or_multiplied_depthwise_convolutions_as_a_grouped_igemm():
    # XNNPACK's depthwise microkernels take up to 25 taps and one output channel per group
    # (CpuRuleSet.dwconv_max_taps; checked against LiteRT: test_deduce_dwconv_igemm_litert.py)
    import dataclasses

    from latpred.builder import GraphBuilder
    from latpred.features import FEATURES, kernel_features

    b = GraphBuilder()
    x = b.input((1, 16, 16, 8))
    x = b.depthwise_conv2d(b.pad(x, 3), 7, padding="VALID")   # the PAD folds into it
    for kernel, m in ((5, 1), ((1, 25), 1), ((1, 26), 1), (3, 2)):
        x = b.depthwise_conv2d(x, kernel, depth_multiplier=m)
    x = b.conv2d(x, 16, 7, groups=16, activation="TANH")       # channelwise CONV_2D
    b.output(x)
    g = b.build()
    igemm = ["dwconv2d_igemm", "dwconv2d", "dwconv2d", "dwconv2d_igemm", "dwconv2d_igemm",
             "dwconv2d_igemm"]
    for target in ("host/cpu/fp32/t1", "host/cpu/fp32/t2"):
        kernels = deduce(g, target)
        assert [k.type for k in kernels] == igemm and len(kernels[0].ops) == 2
        assert "grouped IGEMM" in kernels[0].rule and "IGEMM" not in kernels[1].rule
    # int8: the CONV_2D with a fused TANH is TFLite's own kernel, its base type's builtin one
    assert [k.type for k in deduce(g, "host/cpu/int8/t1")] == igemm[:-1] + ["builtin_dwconv2d"]
    # other CPU runtimes keep one depthwise type
    assert {k.type for k in deduce(g, "pixel4/cpu/fp32/1L")} == {"pad", "dwconv2d",
                                                                   "grouped_conv2d"}
    # dwconv2d's features
    k = deduce(g, "host/cpu/fp32/t1")[3]
    assert FEATURES["dwconv2d_igemm"] == FEATURES["dwconv2d"]
    assert kernel_features(g, k, "host/cpu/fp32/t1") == \
        kernel_features(g, dataclasses.replace(k, type="dwconv2d"), "host/cpu/fp32/t1")
    assert kernel_features(g, k, "host/cpu/fp32/t1")["depth_multiplier"] == 1
