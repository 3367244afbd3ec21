"""Memory prediction: hand-computed arena plans, and the plan against LiteRT's own arena."""

from __future__ import annotations

from pathlib import Path

import pytest

import latpred
from latpred.builder import GraphBuilder
from latpred.errors import DelegateRefusedError, LatpredError
from latpred.memory import largest_layer, naive_sum, predict_memory
from latpred.memory.arena import SimpleArena
from latpred.memory.host_cpu import arena_plan
from latpred.memory.xnnpack import _find_offset
from latpred.memory.xnnpack_configs import for_cpu
from latpred.memory.xnnpack_operators import packed_weights

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.tflite"))
TARGET = "host/cpu/fp32/t1"


def _residual():
    """x[1,8,8,4] -> 1x1 conv (8) -> 1x1 conv (4) -> + x -> 1x1 conv (8) = output."""
    b = GraphBuilder()
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 8, 1)
    z = b.conv2d(y, 4, 1)
    s = b.add(z, x)
    b.output(b.conv2d(s, 8, 1))
    return b.build()


def _conv_mean():
    """x[1,8,8,4] -> 3x3 conv (4) -> MEAN over H, W (keep dims) = output."""
    b = GraphBuilder()
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 4, 3)
    b.output(b.mean(y))
    return b.build()


def test_residual_plan_by_hand():
    # x lives all run at 0 (1024 B); the largest first: y (2048, node 0) after x at 1024;
    # the output (2048, node 3) at 1024 too (y is dead by then); z (1024, nodes 1-3: the ADD
    # writes in place into z, which the last conv reads) fits in no gap: 3072..4096.
    plan, p = arena_plan(_residual(), "builtin")
    assert plan.arena_bytes == 4096
    add_out = p.nodes[2].outputs[0]
    assert plan.shared == {add_out: p.nodes[1].outputs[0]}
    offsets = {a.tensor: a.offset for a in plan.allocs}
    assert offsets[p.inputs[0]] == 0
    assert offsets[p.nodes[0].outputs[0]] == 1024
    assert offsets[p.nodes[3].outputs[0]] == 1024
    assert offsets[p.nodes[1].outputs[0]] == 3072
    assert plan.peak_node == 1


def test_conv_mean_plan_by_hand():
    # im2col [1,8,8,36] float = 9216 B at 1024 (after x), the conv output after it at 10240:
    # 11264 B. MEAN's output and its accumulator tie (16 B, node 1): libstdc++'s unordered_set
    # of node 1 iterates its temporaries (ids 7-10, newest first) before the output (5), and
    # std::sort (insertion sort below 17 elements) keeps that order: accumulator 1024, index
    # 1088, output 1152, then the 8 B axis 1216 (64-aligned gaps left by im2col).
    plan, p = arena_plan(_conv_mean(), "builtin")
    assert plan.arena_bytes == 11264
    temps = p.nodes[0].temporaries
    assert len(temps) == 1 and p.sizes[temps[0]] == 9216
    mean_temps = p.nodes[1].temporaries
    assert [p.sizes[t] for t in mean_temps] == [16, 8, 16, 0]   # the last one is dynamic
    offsets = {a.tensor: a.offset for a in plan.allocs}
    assert offsets[p.nodes[1].outputs[0]] == 1152
    assert [offsets[t] for t in mean_temps[:3]] == [1088, 1216, 1024]
    assert plan.peak_node == 0


def test_arena_best_fit_quirk():
    arena = SimpleArena()
    a = arena.allocate(0, 100, 0, 5)
    b = arena.allocate(1, 64, 0, 0)
    arena.allocate(2, 100, 0, 5)
    assert (a.offset, b.offset) == (0, 128)
    # b is dead at node 1: its 64 B gap (offset 128) takes a 64 B tensor, not the end.
    assert arena.allocate(3, 64, 1, 2).offset == 128
    assert arena.allocate(4, 65, 1, 2).offset == 320


def test_libstdcxx_orders():
    from latpred.memory.stdsort import std_sort, unordered_set_order

    assert unordered_set_order([5, 7, 8, 9, 10]) == [10, 9, 8, 7, 5]
    # 14 and 27 share 1's bucket (13 buckets): each goes to the start of the bucket's run.
    assert unordered_set_order([1, 14, 2, 27]) == [2, 27, 14, 1]
    values = [(v * 7919) % 101 for v in range(60)]
    assert std_sort(values, lambda a, b: a < b) == sorted(values)
    # Not stable: equal keys of a 40-element introsort come out permuted.
    pairs = [(v % 3, i) for i, v in enumerate(values[:40])]
    out = std_sort(pairs, lambda a, b: a[0] < b[0])
    assert [k for k, _ in out] == sorted(k for k, _ in pairs)
    # Up to 16 elements it is one insertion sort, stable (the planner's shortcut relies on it)
    for n in range(2, 17):
        pairs = [((v * 31) % 4, i) for i, v in enumerate(values[:n])]
        assert std_sort(pairs, lambda a, b: a[0] < b[0]) == sorted(pairs, key=lambda p: p[0])


def test_xnnpack_gap_search():
    assert _find_offset([], 10) == 0
    assert _find_offset([(0, 64), (128, 192)], 64) == 64
    assert _find_offset([(64, 128)], 64) == 0       # the gap before the first block counts
    assert _find_offset([(0, 64), (100, 192)], 64) == 192


def test_prediction_breakdown_and_peak_row():
    g = _conv_mean()
    pred = latpred.predict_memory(g, TARGET, kernels="builtin")
    assert pred.arena == 11264 and pred.weights_packed == 0
    assert [r.sets_peak for r in pred.ops] == [True, False]
    assert pred.ops[0].temporaries == 9216
    x = predict_memory(g, TARGET)
    assert x.kernels == "xnnpack" and x.arena < pred.arena
    conv = g.ops[0]
    assert x.weights_packed == packed_weights(g, conv)   # MEAN packs nothing
    # 4 outputs < the IGEMM's nr: the nr2 config, (3*3*4*4 + 4) * nr2; FMA3's nr2 is 8
    # (1184 -> 1216), AVX-512F's 16
    with for_cpu("avx2"):
        assert packed_weights(g, conv) == 1216
    with for_cpu("avx512"):
        assert packed_weights(g, conv) == 148 * 16 == 2368
    assert x.total == sum(v for k, v in x.breakdown().items() if k not in
                          ("total", "weights_stored"))
    assert naive_sum(g) > largest_layer(g) > 0


def test_xnnpack_partitions_around_a_builtin_op():
    from latpred.memory.xnnpack import delegated_input

    b = GraphBuilder()
    x = b.input((1, 8, 8, 8))
    y = b.conv2d(x, 12, 1)
    parts = b.split_v(y, (5, 7))          # SPLIT_V stays on TFLite's kernel
    z = b.concat([b.hard_swish(parts[0]), b.hard_swish(parts[1])])
    b.output(b.conv2d(z, 8, 1))
    g = b.build()
    layout = delegated_input(g)
    labels = [n.label for n in layout.plan_input.nodes]
    assert labels == ["XNNPACK", "SPLIT_V", "XNNPACK"]
    assert len(layout.delegated_ops) == len(g.ops) - 1
    # The TFLite arena holds only what crosses partitions: x, y, the two parts, the output.
    first = layout.plan_input.nodes[0]
    assert first.outputs == (y,)


def test_xnnpack_delegates_around_a_run_time_shape():
    from latpred.idioms import dynamic_reshape
    from latpred.memory.xnnpack import delegated_input

    b = GraphBuilder()
    x = b.input((1, 8, 8, 8))
    y = b.conv2d(x, 8, 1)
    b.output(b.conv2d(dynamic_reshape(b, y, (1, 4, 16, 8)), 8, 1))
    g = b.build()
    assert len(delegated_input(g).delegated_ops) == 2      # both convolutions
    x_pred = predict_memory(g, TARGET)
    b_pred = predict_memory(g, TARGET, kernels="builtin")
    assert x_pred.weights_packed > 0 and b_pred.weights_packed == 0
    labels = [n.label for n in delegated_input(g).plan_input.nodes]
    assert labels == ["XNNPACK", "SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE", "XNNPACK"]


def test_unsupported_target_is_a_user_error():
    with pytest.raises(LatpredError):
        predict_memory(_residual(), "pixel4/gpu/fp16")
    with pytest.raises(LatpredError):
        predict_memory(_residual(), TARGET, kernels="metal")


@pytest.mark.parametrize("kernels", ["xnnpack", "builtin"])
def test_memory_totals_are_the_predictions(kernels):
    # the NAS path (no per-op rows, operator buffers cached by signature) gives the totals
    # of predict_memory, on sampled candidates (several partitions, pools declined) and files
    from latpred.memory import memory_totals
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite

    graphs = [build_graph(a) for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", 40, 5)]
    graphs += [read_tflite(p) for p in FIXTURES]
    expected = [predict_memory(g, TARGET, kernels).total for g in graphs]
    assert memory_totals(graphs, TARGET, kernels).tolist() == expected
    assert memory_totals(graphs, TARGET, kernels).tolist() == expected   # cached signatures


def test_predict_many_with_memory_reuses_the_latency_batch(tmp_path):
    # tensor sizes and per-configuration op facts read from predict_many's FeatureBatch give
    # memory_totals' totals and predict_many's predictions: sampled candidates (repeated
    # configurations), converter files (run-time shapes: allocation types that Prepare
    # changes) and converter_cnn candidates (zero PADs folded into a two-op kernel)
    import sys

    from latpred.memory import memory_totals, predict_many_with_memory
    from latpred.predictors import LatencyModel
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite

    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    model = LatencyModel.fit(simulate(tmp_path / "sim", TARGET, n_models=12).root, TARGET,
                             family="gbdt", search="none")
    space = ROOT / "search_space"

    def graphs():     # fresh each time: a graph keeps the tensor table it was given
        out = [build_graph(a) for a in sample(space / "synthetic_cnn.yaml", 30, 5)]
        out += [build_graph(a) for a in sample(space / "converter_cnn.yaml", 10, 7)]
        return out + [read_tflite(p) for p in FIXTURES]

    assert any(len(k.ops) > 1 for g in graphs() for k in latpred.deduce(g, TARGET))
    preds, peaks = predict_many_with_memory(model, graphs(), allow_fallback=True)
    assert peaks.tolist() == memory_totals(graphs(), TARGET).tolist()
    expected = model.predict_many(graphs(), allow_fallback=True)
    assert [p.total_ms for p in preds] == [p.total_ms for p in expected]


@pytest.mark.parametrize("target", ["h100/gpu/fp16", "h100/gpu/fp32", "h100/cuda/fp16"])
def test_memory_totals_on_gpu_targets_are_that_runtimes_predictions(tmp_path, target):
    # memory-aware NAS on a GPU target: the totals are that runtime's (LiteRT's GPU accelerator,
    # PyTorch's caching allocator), not the host CPU planner's (which they were for the GPU
    # accelerator until session 31)
    import sys

    from latpred.memory import memory_totals, predict_many_with_memory
    from latpred.predictors import LatencyModel
    from latpred.sampler import build_graph, sample

    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    def runs(arch) -> bool:
        try:
            latpred.deduce(build_graph(arch), target)
        except DelegateRefusedError:     # grouped convolutions the accelerator crashes on
            return False
        return True

    archs = [a for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", 20, 3) if runs(a)]
    assert len(archs) >= 8
    expected = [predict_memory(build_graph(a), target).total for a in archs]
    assert expected != [predict_memory(build_graph(a), TARGET).total for a in archs]
    assert memory_totals([build_graph(a) for a in archs], target).tolist() == expected
    model = LatencyModel.fit(simulate(tmp_path / "sim", target, n_models=12).root, target,
                             family="lasso", search="none")
    preds, peaks = predict_many_with_memory(model, [build_graph(a) for a in archs],
                                            allow_fallback=True)
    assert peaks.tolist() == expected
    assert [p.total_ms for p in preds] == \
        [p.total_ms for p in model.predict_many([build_graph(a) for a in archs],
                                                allow_fallback=True)]
    both = model.predict_many([build_graph(a) for a in archs], allow_fallback=True, memory=True)
    assert [p.peak_bytes for p in both] == expected
    assert [p.total_ms for p in both] == [p.total_ms for p in preds]


litert = pytest.importorskip("ai_edge_litert")


def _runtime(graph=None, path=None, kernels="builtin"):
    from latpred.memory.measure import runtime_arena
    from latpred.tflite import read_tflite, write_tflite

    data = Path(path).read_bytes() if path else write_tflite(graph)
    return runtime_arena(data, kernels), read_tflite(data)


@pytest.mark.parametrize("make", [_residual, _conv_mean])
def test_litert_arena_equals_the_plan_small(make):
    reading, graph = _runtime(make())
    plan, _ = arena_plan(graph, "builtin")
    assert reading.arena_bytes == plan.arena_bytes
    assert {a.tensor: a.offset for a in plan.allocs if a.tensor < len(graph.tensors)} == \
        {t: o for t, o in reading.offsets.items() if t < len(graph.tensors)
         and not graph.tensors[t].is_constant and t in {a.tensor for a in plan.allocs}}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_litert_arena_equals_the_plan_converter_fixtures(path):
    reading, graph = _runtime(path=path)
    plan, _ = arena_plan(graph, "builtin")
    assert reading.arena_bytes == plan.arena_bytes


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_litert_xnnpack_arena_equals_the_plan_converter_fixtures(path):
    reading, graph = _runtime(path=path, kernels="xnnpack")
    plan, _ = arena_plan(graph, "xnnpack")
    assert reading.arena_bytes == plan.arena_bytes


def test_partitions_in_one_pass_are_the_greedy_subsets():
    # `_subset_numbers` (ops in dependency order) against TFLite's greedy drain step by step,
    # on sampled topologies with random delegated/not-delegated ops
    import random

    from latpred.memory.xnnpack_partition import _greedy_subsets, _subset_numbers
    from latpred.sampler import build_graph, sample

    rng = random.Random(0)
    for space in ("synthetic_cnn", "converter_cnn", "regnet_cnn"):
        for arch in sample(ROOT / "search_space" / f"{space}.yaml", 8, 3):
            g = build_graph(arch)
            for _ in range(10):
                sup = [rng.random() < 0.7 for _ in g.ops]
                if all(sup) or not any(sup):
                    continue
                numbers = _subset_numbers(g, sup)
                groups = [[i for i, k in enumerate(numbers) if k == n]
                          for n in range(max(numbers) + 1)]
                assert [(sup[ops[0]], ops) for ops in groups] == _greedy_subsets(g, sup)
    # ops out of dependency order: the greedy drain itself
    from dataclasses import replace

    from latpred.memory.litert_builtin import tensor_kinds
    from latpred.memory.xnnpack_partition import partitions, supported

    b = GraphBuilder()
    x = b.input((1, 8, 8, 8))
    parts = b.split_v(b.conv2d(x, 12, 1), (5, 7))       # SPLIT_V stays on TFLite's kernel
    b.output(b.conv2d(b.concat([b.hard_swish(parts[0]), b.hard_swish(parts[1])]), 8, 1))
    g = b.build()
    g = replace(g, ops=(g.ops[-1], *g.ops[:-1]))          # the last op first
    kinds = tensor_kinds(g)[0]
    sup = [supported(g, op, kinds) for op in g.ops]
    assert _subset_numbers(g, sup) is None
    assert partitions(g, kinds) == _greedy_subsets(g, sup)



def _int8_graphs():
    """Small int8 graphs with ops the delegate declines in 8 bits (RELU6, HARD_SWISH, average
    pooling, SOFTMAX: float-only Visit* functions) between ones it takes."""
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite, write_tflite

    b = GraphBuilder("int8_mix")
    x = b.input((1, 32, 32, 8))
    y = b.conv2d(x, 16, 3, stride=2, activation="RELU6")
    y = b.hard_swish(b.depthwise_conv2d(y, 3))
    y = b.avg_pool(b.conv2d(y, 24, 1), 2)
    y = b.concat([b.tanh(y), b.sigmoid(y)], axis=-1)
    b.output(b.softmax(b.fully_connected(b.reshape(b.mean(y, (1, 2), keep_dims=False),
                                                   (1, -1)), 10)))
    graphs = [b.build()] + [build_graph(a) for a in
                            sample(ROOT / "search_space" / "synthetic_cnn.yaml", 3, 11)]
    return [read_tflite(write_tflite(g, precision="int8", seed=4)) for g in graphs]


def test_litert_xnnpack_arena_equals_the_plan_int8():
    """The delegate's 8-bit partitions (xnnpack_partition asks deduce.xnnpack_int8.declined):
    the arena TFLite plans around them is the runtime's, byte for byte."""
    from latpred.memory.measure import runtime_arena
    from latpred.tflite import write_tflite

    for graph in _int8_graphs():
        reading = runtime_arena(write_tflite(graph), "xnnpack")
        assert reading.arena_bytes == arena_plan(graph, "xnnpack")[0].arena_bytes, graph.name


def test_int8_packed_weights_by_the_qs8_rules():
    """create_igemm / create_dwconv_path / create_fully_connected_nc with a qs8_qc8w config:
    one byte a weight, input channels rounded to kr, 4 + 4 bytes (bias, scale) per output
    channel, output channels rounded to nr (the depthwise path: to its channel tile)."""
    from latpred.memory import xnnpack_operators as xnn_ops
    from latpred.memory.xnnpack_configs import Qs8Config, for_cpu, qs8_config
    from latpred.tflite import read_tflite, write_tflite

    b = GraphBuilder("qs8")
    x = b.input((1, 14, 14, 20))
    y = b.conv2d(x, 40, 3)                       # IGEMM: 9 taps x 24 (20 -> kr 8), 48 outputs
    y = b.depthwise_conv2d(y, 2)                 # dwconv: 4 taps -> the 9-tap tile, 64 lanes
    y = b.conv2d(y, 40, 1)                       # 1x1: a fully connected node, 40 -> 40 (48)
    b.output(b.fully_connected(b.reshape(y, (1, -1)), 10))
    q = read_tflite(write_tflite(b.build(), precision="int8"))
    with for_cpu("avx512vnni"):
        assert qs8_config() == Qs8Config(nr=16, kr=8, mrs=(1, 7), dw_channel_tile=32)
        packed = [xnn_ops.packed_weights(q, op) for op in q.ops if op.type != "RESHAPE"]
        assert packed == [(9 * 24 + 8) * 48, (9 + 8) * 64, (40 + 8) * 48,
                          (14 * 14 * 40 + 8) * 16]
        # the IGEMM's indirection: 9 taps x 196 output pixels (SAME), a multiple of mr = 7
        assert xnn_ops.indirection_bytes(q, q.ops[0]) == 9 * 196 * 8


def test_int8_totals_compiled_path_equals_the_python_planner():
    """Graphs with 8-bit tensors leave the compiled planner for the Python one."""
    from latpred.memory import memory_totals
    from latpred.memory.fast import memory_total

    graphs = _int8_graphs()
    assert memory_totals(graphs, "host/cpu/int8/t1").tolist() == \
        [memory_total(g) for g in graphs]


def test_float_graph_on_an_int8_target_is_planned_as_its_int8_model(tmp_path):
    """A NAS candidate (a float graph) on host/cpu/int8/t1: the memory of the int8 model
    latpred writes of it, in predict_memory, memory_totals and predict_many_with_memory."""
    import sys

    from latpred.memory import memory_totals, predict_many_with_memory
    from latpred.predictors import LatencyModel
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite, write_tflite
    from latpred.tflite.quantize import int8_layout

    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    int8 = "host/cpu/int8/t1"
    graphs = [build_graph(a) for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml", 4, 3)]
    written = [read_tflite(write_tflite(g, precision="int8", seed=2)) for g in graphs]
    for g, q in zip(graphs, written):
        assert predict_memory(g, int8).total == predict_memory(int8_layout(g), int8).total
        # the written file's calibrated scales may decline an ADD or MUL the layout's
        # placeholder scales let through (as the latency deduction assumes of a float graph)
        assert predict_memory(g, int8).total == pytest.approx(predict_memory(q, int8).total,
                                                              rel=0.01)
        assert predict_memory(g, int8).total < 0.5 * predict_memory(g, TARGET).total
    # the compiled paths plan most candidates retyped (flat_int8), some as their float twins
    # with requantizing QUANTIZE ops, the others (fp32 islands) by their layouts: all as the
    # Python planner does
    from latpred.memory.flat_int8 import classify

    for space, n in (("synthetic_cnn", 40), ("converter_small", 6), ("regnet_cnn", 6)):
        graphs += [build_graph(a) for a in sample(ROOT / "search_space" / f"{space}.yaml", n, 8)]
    kinds = classify(graphs)
    assert kinds.retype.all() and len(kinds.twins) >= 2 and len(kinds.layouts) >= 2
    assert len(kinds.twins) + len(kinds.layouts) < len(graphs) / 2
    totals = memory_totals(graphs, int8).tolist()
    assert totals == [predict_memory(g, int8).total for g in graphs]
    model = LatencyModel.fit(simulate(tmp_path / "sim", int8, n_models=12).root, int8,
                             family="gbdt", search="none")
    preds, peaks = predict_many_with_memory(model, graphs, allow_fallback=True)
    assert peaks.tolist() == totals and len(preds) == len(graphs)
