"""The compiled planners (latpred/memory/compiled*.py, flat.py) against the Python ones."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("numba")

from latpred.memory import compiled  # noqa: E402
from latpred.memory.arena import SimpleArena  # noqa: E402
from latpred.memory.stdsort import std_sort, unordered_set_order  # noqa: E402
from latpred.memory.xnnpack import _find_offset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPACES = ("synthetic_cnn", "converter_cnn", "converter_small", "mnasnet_residual", "regnet_cnn")


def test_arena_offset_is_simple_arena_allocate():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 25)
        arena = SimpleArena()
        live = [np.zeros(n, np.int64) for _ in range(4)]
        n_live, hwm = 0, 0
        for _ in range(n):
            size = rng.choice([rng.randint(1, 300), 64 * rng.randint(1, 6)])
            first = rng.randint(0, 8)
            last = rng.choice([first + rng.randint(0, 6), compiled.NEVER])
            expected = arena.allocate(0, size, first, last).offset
            offset, n_live = compiled.arena_offset(*live, n_live, size, first, last)
            hwm = max(hwm, offset + size)
            assert offset == expected
        assert hwm == arena.high_water_mark


def test_gap_offset_is_find_offset():
    rng = random.Random(5)
    for _ in range(2000):
        blocks = sorted((s, s + rng.randint(1, 200)) for s in
                        (rng.randint(0, 600) for _ in range(rng.randint(1, 8))))
        need = rng.randint(1, 250)
        starts, ends = (np.array(v, np.int64) for v in zip(*blocks))
        assert compiled.gap_offset(starts, ends, len(blocks), need) == \
            _find_offset(blocks, need)


def test_set_order_is_unordered_set_order():
    rng = random.Random(7)
    for _ in range(500):
        values = [rng.randint(0, 120) for _ in range(rng.randint(0, 40))]
        out = np.zeros(len(values), np.int64)
        n = compiled.set_order(np.array(values, np.int64), len(values), out)
        assert out[:n].tolist() == unordered_set_order(values)


def test_std_sort_port_is_std_sort():
    # ties of equal size and allocation node (SPLIT's outputs, an int8 model's TFLite nodes)
    # over 16 tensors: introsort's partitions decide their order
    rng = random.Random(5)
    ported = 0
    for _ in range(400):
        n = rng.randint(2, 60)
        size = np.array([rng.choice([64, 128, 4900]) for _ in range(n)], np.int64)
        first = np.array([rng.randint(0, 3) for _ in range(n)], np.int64)
        last = np.array([rng.choice([rng.randint(3, 9), compiled.NEVER]) for _ in range(n)],
                        np.int64)
        first[rng.randrange(n)] = 0
        items = np.array(rng.sample(range(n), n), np.int64)

        def less(a, b):
            return compiled._before(a, b, size, first, last, False)

        expected = std_sort(items.tolist(), less)
        got = items.copy()
        if compiled._std_sort(got, n, size, first, last):
            assert got.tolist() == expected
            ported += 1
    assert ported > 380          # the heap-sort fallback is rare


def _graphs(n: int = 40) -> list:
    from latpred import zoo
    from latpred.sampler import build_graph, sample
    from latpred.tflite import read_tflite

    out = []
    for space in SPACES:
        out += [build_graph(a) for a in sample(ROOT / "search_space" / f"{space}.yaml", n, 11)]
    out += [zoo.build(name) for name in sorted(zoo.ZOO)[:12]]
    return out + [read_tflite(p) for p in sorted((ROOT / "tests/fixtures/corpus")
                                                 .glob("*.tflite"))]


def _batch(graphs: list) -> SimpleNamespace:
    """What `flat_arrays.batch_tensors` reads of a FeatureBatch: one interned id per tensor (+ one
    for -1)."""
    keys, ids = [], []
    for g in graphs:
        ids.append(list(range(len(keys), len(keys) + len(g.tensors) + 1)))
        keys += [(t.shape, t.dtype, t.is_constant, None, None) for t in g.tensors] + [None]
    return SimpleNamespace(tensor_keys=tuple(k or ((), "float32", False) for k in keys),
                           tensor_ids=tuple(ids))


def test_compiled_plan_is_the_python_plan():
    # per graph: the arena, the workspace and its regrowth, the delegated ops; graphs the
    # compiled planner does not cover are reported as such (and planned in Python)
    from latpred.memory import flat

    graphs = _graphs()
    planned = flat.plan(graphs, flat.graph_tensors(graphs))
    from_batch = flat.batch_tensors(graphs, _batch(graphs))[0]
    assert all(np.array_equal(a, b) for a, b in zip(planned.tensors, from_batch))
    covered = planned.res[:, 0].astype(bool)
    assert covered[:40].all()                        # synthetic_cnn: every graph
    assert 0.5 < covered.mean() < 1                  # and some it leaves to Python
    _same_as_python(graphs, planned)


def test_compiled_plan_covers_int8_graphs():
    # int8 NAS candidates (tflite.quantize.int8_layout) and int8 files: the delegate's 8-bit
    # decisions come in per op; SPLIT_V's and the TFLite nodes' tied outputs take std::sort
    from latpred.memory import flat
    from latpred.memory.host_cpu import for_precision
    from latpred.tflite import read_tflite, write_tflite

    graphs = [for_precision(g, "int8") for g in _graphs(30)[:90]]
    graphs += [read_tflite(write_tflite(g, precision="int8", seed=3)) for g in _graphs(3)[:6]]
    planned = flat.plan(graphs, flat.graph_tensors(graphs))
    covered = planned.res[:, 0].astype(bool)
    assert covered[:30].all()                        # synthetic_cnn in int8: every graph
    assert planned.delegated.sum() < len(planned.delegated) - 90    # declined ops stay out
    _same_as_python(graphs, planned)


def _same_as_python(graphs: list, planned) -> None:
    from latpred.memory import xnnpack
    from latpred.memory.litert_plan import plan

    covered = planned.res[:, 0].astype(bool)
    for g, graph in enumerate(graphs):
        if not covered[g]:
            continue
        layout = xnnpack.delegated_input(graph)
        workspace, _, regrowth = xnnpack.workspace_plan(graph, layout, False)
        assert planned.res[g, 1:].tolist() == \
            [plan(layout.plan_input, stats=False).arena_bytes, workspace, regrowth]
        ops = planned.delegated[planned.g_ops[g]:planned.g_ops[g + 1]]
        assert set(np.flatnonzero(ops).tolist()) == layout.delegated_ops



def test_signature_from_interned_tensors_is_the_operator_signature():
    from latpred.memory import flat
    from latpred.memory.xnnpack_operators import _signature

    graphs = _graphs(8)
    batch = _batch(graphs)
    tensors, key_ids, _ = flat.batch_tensors(graphs, batch)
    planned = flat.plan(graphs, tensors)
    graph_of = np.repeat(np.arange(len(graphs)), np.diff(planned.g_ops))
    shapes = flat._Shapes(batch.tensor_keys, key_ids, tensors.g_tens, graph_of)
    for j, op in enumerate(planned.ops):
        if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D"):
            assert shapes.signature(j, op) == _signature(graphs[graph_of[j]].tensors, op)


def test_wiring_recorded_during_deduction_is_the_walked_wiring(tmp_path):
    # predict_many_batch's per-graph hook sees each graph once, in order, and changes no
    # prediction; what it records is what walking the graphs afterwards finds
    import sys

    from latpred.memory import flat
    from latpred.predictors import LatencyModel
    from latpred.sampler import build_graph, sample

    sys.path.insert(0, str(ROOT / "tests"))
    from simdata import simulate

    target = "host/cpu/fp32/t1"
    model = LatencyModel.fit(simulate(tmp_path / "sim", target, n_models=12).root, target,
                             family="gbdt", search="none")
    archs = list(sample(ROOT / "search_space" / "synthetic_cnn.yaml", 20, 3))
    seen, wiring = [], flat.Wiring()

    def visit(graph):
        seen.append(graph)
        wiring.collect(graph)

    preds, graphs, _, _ = model.predict_many_batch([build_graph(a) for a in archs],
                                                   visit=visit)
    assert list(map(id, seen)) == list(map(id, graphs))
    assert vars(wiring) == vars(flat.Wiring().walk(graphs))
    expected = model.predict_many([build_graph(a) for a in archs])
    assert [p.total_ms for p in preds] == [p.total_ms for p in expected]


def test_op_configs_is_each_kernels_first_op():
    # a graph with as many kernels as ops is read as op i in kernel i; the others (a PAD
    # folded into a convolution, an int8 table-lookup chain) by each kernel's first op: both
    # give what reading every kernel gives
    from latpred import deduce
    from latpred.memory import flat_arrays
    from latpred.predictors.batch import FeatureBatch

    graphs = _graphs(6)
    for target in ("host/cpu/fp32/t1", "host/cpu/int8/t1"):
        kernels = [tuple(deduce(g, target)) for g in graphs]
        flat = [k for ks in kernels for k in ks]
        # every third configuration of several ops (kind -1), the others single
        config = np.arange(len(flat)) % 50
        kinds = np.where(np.arange(50) % 3 == 0, -1, 7)
        batch = FeatureBatch({}, {}, config, 50, np.zeros(len(flat)), {}, np.zeros(50),
                             config_kind=kinds)
        g_ops = flat_arrays.op_offsets(graphs)
        expected = np.full(g_ops[-1], -1)
        at = 0
        for g, ks in enumerate(kernels):
            for k in ks:
                if kinds[config[at]] >= 0:
                    expected[g_ops[g] + k.ops[0]] = config[at]
                at += 1
        odd = sum(len(ks) != len(g.ops) for g, ks in zip(graphs, kernels))
        assert odd > 0 and odd < len(graphs)       # both ways are taken
        assert flat_arrays.op_configs(kernels, batch, g_ops).tolist() == expected.tolist()


def _random_signature(rng: random.Random) -> tuple:
    """A random operator signature of the five types with buffers, in `_signature`'s form."""
    op_type = rng.choice(["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D",
                          "AVERAGE_POOL_2D"])
    k, s = rng.choice([1, 1, 2, 3, 5, 7]), rng.choice([1, 1, 2, 3])
    oh, ow = rng.randint(0, 60), rng.randint(1, 60)
    x = (1, oh * s + rng.randint(-2, k), ow * s, rng.choice([3, 8, 16, 24, 40]))
    attrs = {"stride": (s, rng.choice([1, 2, s])), "padding": rng.choice(["SAME", "VALID"])}
    if op_type == "FULLY_CONNECTED":
        w = (rng.randint(1, 1100), rng.randint(1, 2000))
    elif op_type == "DEPTHWISE_CONV_2D":
        mult = rng.choice([1, 1, 1, 2])
        attrs |= {"depth_multiplier": rng.choice([mult, None]) if mult == 1 else mult,
                  "dilation": (1, rng.choice([1, 1, 2]))}
        w = (1, k, rng.choice([k, 1, 9]), x[3] * mult)
    elif op_type == "CONV_2D":
        groups = rng.choice([1, 1, 2, 4])
        attrs |= {"groups": rng.choice([groups, None]) if groups == 1 else groups,
                  "dilation": (1, rng.choice([1, 2]))}
        w = (groups * rng.choice([1, 3, 8, 15, 16, 17, 64]), k, rng.choice([k, 1]),
             rng.randint(1, 64))
    else:
        attrs["filter"] = (k, rng.choice([k, 1, 2]))
        w = ()
    return (op_type, tuple(sorted(attrs.items())), x, w, (1, oh, ow, x[3]))


@pytest.mark.parametrize("level", ["avx2", "zen1", "avx512", "avxvnni", "amx"])
@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_compiled_buffers_are_the_operator_rules(level, weights):
    # packed weights + indirection of random signatures: the port against xnnpack_operators,
    # with each x86 level's f32 configurations, and its qs8 ones for 8-bit weights
    from latpred.memory import compiled_buffers as cb
    from latpred.memory.xnnpack_configs import for_cpu
    from latpred.memory.xnnpack_operators import _buffers

    rng = random.Random(13)
    sigs = [_random_signature(rng) + (weights,) for _ in range(4000)]
    rows = [(cb.CODES[t], *cb.attr_row(t, a)) for t, a, *_ in sigs]
    table = np.array(rows, np.int64)
    x, w, out = (cb.dims_rows([sig[i] for sig in sigs]) for i in (2, 3, 4))
    eight = np.array([weights == "int8" and len(sig[3]) > 0 for sig in sigs])
    with for_cpu(level):
        values, ok = cb.op_buffers(table[:, 0], table[:, 1:], x, w, out, eight,
                                   cb.active_table())
        assert ok.all()
        assert values.tolist() == [sum(_buffers(sig)) for sig in sigs]
    assert len({v for v in values.tolist()}) > 1000        # the cases are not all alike


def test_compiled_sizer_is_the_python_per_op_sizes():
    # every delegated op's buffers in a batch, as flat.py sizes them (configurations from a
    # real latency batch), against xnnpack_operators per op; the stride of an odd form goes
    # to Python and gives the same
    from latpred.memory import flat
    from latpred.memory.xnnpack_operators import _op_buffers

    graphs = _graphs(10)
    batch = _batch(graphs)
    tensors, key_ids, _ = flat.batch_tensors(graphs, batch)
    planned = flat.plan(graphs, tensors)
    keys = batch.tensor_keys

    graph_of = np.repeat(np.arange(len(graphs)), np.diff(planned.g_ops))
    python_calls = []

    def python(j):
        python_calls.append(j)
        g = graph_of[j]
        return _op_buffers(graphs[g], j - planned.g_ops[g])

    chosen = np.array([op.type in flat.xnn_ops._WITH_BUFFERS for op in planned.ops])
    # each interned tensor's dims from its shape, here, not from batch_tensors
    key_dims = flat.cb.dims_rows([key[0] for key in keys])
    sizer = flat.cb.Sizer(planned, key_ids, key_dims, python)
    sized = flat._buffers(chosen, np.full(len(chosen), -1), sizer)[0]
    expected = [_op_buffers(graphs[graph_of[j]], j - planned.g_ops[graph_of[j]]) if c else 0
                for j, c in enumerate(chosen.tolist())]
    assert sized.tolist() == expected and sum(expected) > 0
    assert not python_calls
    # sized once per configuration (here: ops of one operator signature), every third op
    # of none
    ids: dict[tuple, int] = {}
    cfg = np.array([ids.setdefault(flat.xnn_ops._signature(graphs[graph_of[j]].tensors, op),
                                   len(ids)) if j % 3 else -1
                    for j, op in enumerate(planned.ops)])
    per_op, configs, per_cfg = flat._buffers(chosen, cfg, sizer)
    assert per_op.tolist() == expected
    assert 0 < len(configs) < int(chosen.sum())
    assert all(per_cfg[c] == expected[int(np.flatnonzero(chosen & (cfg == c))[0])]
               for c in configs.tolist())


def test_compiled_twin_decision_is_float_twins():
    # per float graph: kept as it is, a twin with requantizing QUANTIZE ops, or its layout
    # (an fp32 island, a float constant in a same-scale group), as quantize.float_twin says;
    # the twins are float_twin's own
    from latpred.graph import Graph, Op, Tensor
    from latpred.builder import GraphBuilder
    from latpred.memory import flat, flat_int8
    from latpred.sampler import build_graph, sample
    from latpred.tflite.quantize import float_twin, is_float_graph

    graphs = [g for g in _graphs(30) if is_float_graph(g)]
    graphs += [build_graph(a) for a in sample(ROOT / "search_space" / "synthetic_cnn.yaml",
                                              200, 4)]
    b = GraphBuilder("conflict")
    y = b.conv2d(b.input((1, 8, 8, 4)), 8, 1)
    b.output(b.concat([b.tanh(y), b.sigmoid(y)], axis=-1))
    b2 = GraphBuilder("constant in a group")
    x = b2.input((1, 4, 4, 8))
    b2.output(b2.concat([b2.sigmoid(x), b2.constant((1, 4, 4, 8))],
                        axis=-1))
    t = (Tensor("x", (1, 8)), Tensor("e", (1, 8)), Tensor("y", (1, 8)))
    exp = Graph(t, (Op.make("EXP", (0,), (1,)), Op.make("RELU", (1,), (2,))), (0,), (2,), "exp")
    graphs += [b.build(), b2.build(), exp]
    found = flat_int8.classify(graphs)
    assert found.retype.all()
    twins = found.twins.tolist()
    kinds = {"same": 0, "twin": 0, "layout": 0}
    for g, graph in enumerate(graphs):
        twin = float_twin(graph)
        if twin is graph:
            assert g not in twins and g not in found.layouts
            kinds["same"] += 1
        elif twin is None:
            assert g in found.layouts and g not in twins
            kinds["layout"] += 1
        else:
            mine = found.twin(graphs, twins.index(g))
            assert [(o.type, o.inputs, o.outputs) for o in mine.ops] == \
                [(o.type, o.inputs, o.outputs) for o in twin.ops]
            assert mine.tensors == twin.tensors
            kinds["twin"] += 1
    assert min(kinds.values()) >= 3, kinds
    # the twins in flat form (flat_int8.with_twins) are their Graphs' wiring and tensor bytes
    spliced = flat_int8.with_twins(found, flat.Wiring().walk(graphs), flat.graph_tensors(graphs),
                                   None, None, flat.op_offsets(graphs))
    wiring, tensors, _, _, g_ops = spliced
    in_ptr, ins, out_ptr, outs = wiring.arrays()
    for i, g in enumerate(twins):
        twin = found.twin(graphs, i)
        ops = range(g_ops[g], g_ops[g + 1])
        assert [(wiring.types[j], tuple(ins[in_ptr[j]:in_ptr[j + 1]]),
                 tuple(outs[out_ptr[j]:out_ptr[j + 1]])) for j in ops] == \
            [(o.type, o.inputs, o.outputs) for o in twin.ops]
        t0, t1 = tensors.g_tens[g], tensors.g_tens[g + 1]
        n = len(graphs[g].tensors)
        assert tensors.size[t0:t1].tolist() == \
            flat.graph_tensors([graphs[g]]).size.tolist() + [t.nbytes for t in twin.tensors[n:]]
        assert tensors.eight_bit[t0 + n:t1].all() and not tensors.const[t0 + n:t1].any()


def test_functions_cached_on_disk_have_one_signature():
    # numba writes a function's cache index and data files separately: two processes compiling
    # different signatures of one cached function at once can pair one signature with the
    # other's code (compiled.py's docstring). Only functions Python calls are cached, each
    # with one signature; helpers called from compiled code, which get several, are not.
    import importlib
    import pkgutil

    from numba.core.caching import NullCache
    from numba.core.registry import CPUDispatcher

    import latpred.memory as memory
    from latpred.memory import memory_totals

    graphs = _graphs(6)
    for target in ("host/cpu/fp32/t1", "host/cpu/int8/t1", "h100/cuda/fp16"):
        memory_totals(graphs, target)
    memory_totals([g for g in graphs if _gpu_runs(g)], "h100/gpu/fp16")
    cached, helpers = {}, {}
    for info in pkgutil.iter_modules(memory.__path__):
        module = importlib.import_module(f"latpred.memory.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == module.__name__:
                if isinstance(obj._cache, NullCache):
                    helpers[f"{info.name}.{name}"] = obj.signatures
                else:   # what this process compiled, or the index on disk lists
                    on_disk = obj._cache._cache_file._load_index()
                    cached[f"{info.name}.{name}"] = max(
                        [obj.signatures, list(on_disk)], key=len)
    ran = ("compiled_graph.plan_batch", "gpu_compiled.part_intermediates",
           "compiled_cuda_alloc.peaks", "compiled_twin.twin_kinds")
    assert all(len(cached[name]) == 1 for name in ran)
    # before session 39 every helper was cached: compiled._sort with 4 signatures, _before 3
    assert {k: len(v) for k, v in cached.items() if len(v) > 1} == {}
    assert "compiled._sort" in helpers


def _gpu_runs(graph) -> bool:
    from latpred import deduce
    from latpred.errors import DelegateRefusedError

    try:
        deduce(graph, "h100/gpu/fp16")
    except DelegateRefusedError:
        return False
    return True
