"""The CUDA memory simulator (latpred/memory/cuda*.py, torch_plan.py) against the allocator's
rules and against what the H100 recorded (datasets/h100-cuda-memory)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from latpred.builder import GraphBuilder
from latpred.errors import TargetError
from latpred.graph import Graph
from latpred.memory import predict_memory
from latpred.memory.cuda import simulate
from latpred.memory.cuda_alloc import CachingAllocator, round_size
from latpred.memory.cuda_reduce import reduce_scratch
from latpred.memory import cuda_workspace
from latpred.memory.torch_plan import forward_events, load_events
from latpred.pytorch.batch import with_batch
from latpred.sampler import build_graph
from latpred.target import parse_target

DATA = Path(__file__).resolve().parents[1] / "datasets" / "h100-cuda-memory"
MiB = 1 << 20


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    df = pd.read_parquet(DATA / "models.parquet")
    return df[df.status == "ok"]


# -- the allocator's rules -------------------------------------------------------------------

def test_round_size_512_byte_blocks():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert round_size(3 * MiB + 1) == 3 * MiB + 512


def test_small_requests_share_a_2mib_segment_and_split_exactly():
    a = CachingAllocator()
    x, y = a.malloc(1000), a.malloc(600)
    assert (x.size, y.size) == (1024, 1024)
    assert a.reserved.current == 2 * MiB and a.allocated.current == 2048
    assert y.addr == x.addr + 1024          # carved from the same small segment


def test_large_pool_segment_sizes():
    a = CachingAllocator()
    a.malloc(MiB + 512)                     # 1-10 MiB: a 20 MiB segment
    assert a.reserved.current == 20 * MiB
    a.malloc(11 * MiB)                      # fits the 20 MiB segment's remainder
    assert a.reserved.current == 20 * MiB
    a.malloc(25 * MiB + 512)                # >= 10 MiB, no fit: rounded up to 2 MiB
    assert a.reserved.current == 20 * MiB + 26 * MiB


def test_large_block_not_split_under_1mib_remainder_counts_whole():
    a = CachingAllocator()
    b = a.malloc(12 * MiB)                  # a 12 MiB segment, all of it
    a.free(b)
    c = a.malloc(11 * MiB + 512)            # 0.5 MiB would remain: not split
    assert c.size == 12 * MiB and a.allocated.current == 12 * MiB
    a.free(c)
    d = a.malloc(10 * MiB)                  # 2 MiB would remain: split
    assert d.size == 10 * MiB and a.allocated.current == 10 * MiB


def test_free_merges_neighbours_and_empty_cache_releases_whole_segments():
    a = CachingAllocator()
    x, y, z = a.malloc(4096), a.malloc(4096), a.malloc(4096)
    a.free(x)
    a.free(z)
    a.free(y)                               # merges with both: one free block, the segment
    a.malloc(3 * MiB)                       # a large segment, kept while in use
    a.empty_cache()
    assert a.reserved.current == 20 * MiB   # the small segment went back, the large stays
    assert a.allocated.current == 3 * MiB


def test_peak_reset_keeps_current():
    a = CachingAllocator()
    b = a.malloc(4 * MiB)
    a.free(b)
    a.reset_peak()
    assert a.allocated.peak == 0
    a.malloc(1024)
    assert a.allocated.peak == 1024


# -- ports checked against what the H100 allocated ------------------------------------------

@pytest.mark.parametrize("shape, expected", [
    ((1, 112, 112, 32), (200704, 4)), ((1, 56, 56, 144), (3612672, 8)),
    ((32, 56, 56, 16), (12845056, 16)), ((1, 56, 56, 64), (409600, 4)),
    ((1, 56, 56, 48), ()), ((1, 7, 7, 256), ()), ((32, 7, 7, 1280), ())])
def test_mean_scratch_matches_the_device(shape, expected):
    assert reduce_scratch(shape, (1, 2), 2) == expected


def _trace_check(row, trace_row):
    """The requested sizes the H100 saw for loading and one forward == the plan's."""
    t = parse_target(row["target"])
    g = with_batch(build_graph(json.loads(row["arch"])), t.batch)
    elem = 2 if t.precision == "fp16" else 4
    tr = json.loads(trace_row["trace"])
    allocs = [e[2] for e in tr if e[0] == "a"]
    ops = json.loads(row["cold_ops"])
    load_and_cold = ops[-1][2] - int(trace_row["allocs_before"])
    forward = len(allocs) - load_and_cold        # the second forward repeats the first
    n_load = load_and_cold - forward
    le = load_events(g, elem)
    fe = forward_events(g, elem, cuda_workspace.conv_workspace, cuda_workspace.mean_scratch,
                        len(le))
    planned = [e.nbytes for e in le + fe if e.action == "alloc" and e.op < len(g.ops)]
    assert n_load == sum(e.action == "alloc" for e in le)
    assert allocs[:load_and_cold] == planned


def test_every_zoo_request_sequence_matches_the_recorded_trace(rows):
    traces = pd.read_parquet(DATA / "traces.parquet")
    by = {(r.model_id, r.target): r for r in rows.itertuples()}
    assert len(traces) == 192
    for tr in traces.itertuples():
        row = rows.loc[(rows.model_id == tr.model_id) & (rows.target == tr.target)].iloc[0]
        _trace_check(row, tr._asdict())
    assert len(by) == len(rows)


def test_zoo_peaks_exact(rows):
    """max_memory_allocated and max_memory_reserved of one inference, to the byte, for every
    zoo model at fp16/fp32, batch 1 and 32."""
    zoo_rows = rows[rows.source == "zoo"]
    assert len(zoo_rows) == 192
    for r in zoo_rows.itertuples():
        p = predict_memory(build_graph(json.loads(r.arch)), r.target)
        assert (p.total, p.reserved) == (r.cold_peak_allocated, r.cold_peak_reserved), \
            (r.model_id, r.target)


def test_synthetic_peaks_exact_and_steady_state(rows):
    syn = rows[rows.source == "synthetic"].iloc[::12]
    assert len(syn) > 200
    for r in syn.itertuples():
        g = build_graph(json.loads(r.arch))
        t = parse_target(r.target)
        cold = simulate(g, t.precision, t.batch)
        assert cold["peak"] == r.cold_peak_allocated, (r.model_id, r.target)
        assert cold["reserved"] == r.cold_peak_reserved
        assert cold["loaded"] == r.load_allocated
        warm = simulate(g, t.precision, t.batch, warm=True)
        assert warm["peak"] == r.warm_peak_allocated, (r.model_id, r.target)


# -- the prediction's shape, unknown configurations, errors ----------------------------------

def _odd_conv_graph():
    b = GraphBuilder("odd")
    x = b.input((1, 37, 41, 24))
    y = b.conv2d(x, 104, 5, stride=1, groups=2)
    y = b.mean(y, axes=(1, 2), keep_dims=False)
    b.output(b.fully_connected(y, 10))
    return b.build()


def test_unmeasured_convolution_uses_the_estimate():
    g = _odd_conv_graph()
    conv = g.ops[0]
    key = cuda_workspace.conv_key(g, conv, 4)
    assert key not in cuda_workspace.measured()
    ws = cuda_workspace.estimate(key)
    assert ws >= 0
    p = predict_memory(g, "h100/cuda/fp32")
    assert p.ops[0].workspace_extent == round_size(ws) if ws else p.ops[0].workspace_extent == 0
    assert p.total == p.model_bytes + p.arena + p.workspace
    assert p.workspace >= 34603008           # the cuBLAS / cuBLASLt workspaces
    assert sum(r.sets_peak for r in p.ops) == 1


def test_shipped_table_is_package_data_and_round_trips(tmp_path):
    tab = cuda_workspace.shipped_table()
    assert tab is cuda_workspace.shipped_table()             # loaded once
    assert len(tab["conv"]) == 19992
    assert all(type(k) is tuple and len(k) == 15 for k in tab["conv"])
    h = tab["header"]
    assert h["torch"] == "2.11.0+cu130" and h["cudnn"] == 91900
    assert h["dataset"] == "datasets/h100-cuda-memory" and not h["cudnn_benchmark"]
    conv = {(2, 1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1): 0,
            (4, 1, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 4, 1, 1): 4096}
    path = tmp_path / "t.json.gz"
    cuda_workspace.dump_table(path, conv, "m", {"x": 1})
    first = path.read_bytes()
    assert cuda_workspace.load_table(first) == {"header": {"x": 1}, "conv": conv, "model": "m"}
    cuda_workspace.dump_table(path, dict(reversed(conv.items())), "m", {"x": 1})
    assert path.read_bytes() == first                         # deterministic bytes


def test_fit_estimator_learns_the_input_ratio():
    keys = [(2, 1, c, h, h, 64, 3, 3, 1, 1, 1, 1, 4, 1, 1) for c in (16, 32, 64, 128)
            for h in (14, 28, 56, 112)] * 3
    values = [4 * k[0] * k[2] * k[3] * k[4] for k in keys]     # 4 x input bytes
    b = cuda_workspace.fit_estimator(keys, values, n_estimators=50)
    probe = (2, 1, 48, 40, 40, 64, 3, 3, 1, 1, 1, 1, 4, 1, 1)
    inb = 2 * 48 * 40 * 40
    assert 3 * inb <= cuda_workspace.estimate(probe, b) <= 5 * inb


def test_cuda_target_errors():
    # a GPU target no planner covers (the OpenCL delegate phones run); h100/gpu, LiteRT's
    # accelerator, is planned by latpred/memory/gpu_delegate.py
    g = _odd_conv_graph()
    with pytest.raises(TargetError):
        predict_memory(g, "pixel4/gpu/fp16")


def test_cli_inspect_memory_cuda(tmp_path):
    from latpred.cli import main
    from latpred.tflite import write_tflite

    path = tmp_path / "odd.tflite"
    write_tflite(_odd_conv_graph(), path)
    res = CliRunner().invoke(main, ["inspect", str(path), "--memory", "--target",
                                    "h100/cuda/fp16/b32"])
    assert res.exit_code == 0, res.output
    assert "PyTorch caching allocator" in res.output and "<- peak" in res.output
    res = CliRunner().invoke(main, ["inspect", str(path), "--memory", "--target",
                                    "h100/cuda/int8"])
    assert res.exit_code == 2


def test_memory_totals_on_a_cuda_target_are_the_predictions(rows):
    from latpred.memory import memory_totals

    sample = rows[rows.source == "zoo"].iloc[:6]
    graphs = [build_graph(json.loads(a)) for a in sample.arch]
    for target in ("h100/cuda/fp16", "h100/cuda/fp32/b32"):
        totals = memory_totals(graphs, target)
        assert list(totals) == [predict_memory(g, target).total for g in graphs]
    measured = sample[sample.target == "h100/cuda/fp16"]
    got = memory_totals([build_graph(json.loads(a)) for a in measured.arch], "h100/cuda/fp16")
    assert list(got) == list(measured.cold_peak_allocated)


def test_compiled_allocator_peaks_equal_the_python_allocators():
    # random request sequences (small and large pools, splits, merges with either neighbour,
    # cached blocks reused, the peak reset part-way) through both allocators
    import random

    from latpred.memory.compiled_cuda_alloc import FREE, batch_peaks

    rng = random.Random(31)
    sizes = (1, 511, 512, 700, 5632, 64 << 10, MiB - 512, MiB, MiB + 1, 3 * MiB, 9 * MiB,
             10 * MiB, 21 * MiB, 33 * MiB)
    codes, sids, g_ptr, g_reset, expected = [], [], [0], [], []
    for trial in range(300):
        alloc = cuda_workspace.process_start()
        live: list[int] = []
        blocks = {}
        n_ev = rng.randint(0, 60)
        reset = rng.randint(0, n_ev)
        for k in range(n_ev):
            if k == reset:
                alloc.reset_peak()
            if live and rng.random() < 0.4:
                s = live.pop(rng.randrange(len(live)))
                alloc.free(blocks.pop(s))
                codes.append(FREE)
            else:
                s = k
                n = rng.choice(sizes) + rng.choice((0, 0, 1, 100, 4096))
                blocks[s] = alloc.malloc(n)
                live.append(s)
                codes.append(n)
            sids.append(s)
        if reset == n_ev:
            alloc.reset_peak()
        expected.append(alloc.allocated.peak)
        g_reset.append(reset)
        g_ptr.append(len(codes))
    assert batch_peaks(codes, sids, g_ptr, g_reset).tolist() == expected


def _transposed(perm) -> "Graph":
    b = GraphBuilder("transposed")
    x = b.input((1, 6, 6, 8))
    y = b.conv2d(b.transpose(x, perm), 8, 3)
    b.output(y)
    return b.build()


def test_request_templates_give_each_graph_its_own_peak():
    """`memory_totals` on CUDA looks each op's requests up by configuration
    (`cuda_requests`): across graphs, calls (the second finds every op known), precisions,
    batch 32 and with the latency pass's interned tensors, each peak stays `simulate`'s.
    Two TRANSPOSEs alike in shapes but for the permutation (a tensor's value) are told apart:
    one is a view (nothing allocated), the other a copy. Keyed by the latency batch's kernel
    configurations, the peaks are the same."""
    from latpred import zoo
    from latpred.memory import cuda_requests
    from latpred.memory.cuda import batch_peaks
    from latpred.predictors.batch import featurize
    from latpred.sampler import sample

    root = Path(__file__).resolve().parents[1] / "search_space"
    graphs = [build_graph(a) for space in ("synthetic_cnn", "mnasnet_residual", "regnet_cnn")
              for a in sample(root / f"{space}.yaml", 8, 3)]
    graphs += [zoo.build(n) for n in ("shufflenet_v2_0.5", "mobilenet_v3_small", "squeezenet1_1")]
    graphs += [_transposed((0, 1, 2, 3)), _transposed((0, 2, 1, 3))]
    for precision, batch in (("fp16", 1), ("fp32", 1), ("fp16", 32)):
        want = [simulate(g, precision, batch)["peak"] for g in graphs]
        assert batch_peaks(graphs, precision, batch).tolist() == want
        assert batch_peaks(graphs, precision, batch).tolist() == want     # all known now
    assert want[-1] != want[-2]
    target = parse_target("h100/cuda/fp16")
    kernels = [latpred_deduce(g, target) for g in graphs]
    fb = featurize(graphs, kernels, target, lambda t: (t, ("flops",)))
    want = [simulate(g, "fp16")["peak"] for g in graphs]
    assert batch_peaks(graphs, "fp16", 1, tensors=fb).tolist() == want
    # keyed by the batch's configurations (the zoo's views: ops of two-op kernels, keyed alone)
    assert any(len(k.ops) > 1 for ks in kernels for k in ks)
    cuda_requests._TEMPLATES.clear()          # every configuration new again
    cuda_requests._TENSORS.clear()
    for _ in range(2):
        assert batch_peaks(graphs, "fp16", 1, tensors=fb, kernels=kernels).tolist() == want
    # a batch size the latency pass did not see: each op keyed from its resized tensors
    want = [simulate(g, "fp16", 32)["peak"] for g in graphs]
    assert batch_peaks(graphs, "fp16", 32, tensors=fb, kernels=kernels).tolist() == want


def _pooled(kind: str) -> "Graph":
    b = GraphBuilder(kind)
    x = b.input((1, 8, 8, 16))
    b.output(getattr(b, kind)(x, 2))
    return b.build()


def test_request_templates_follow_the_numbering_of_op_kinds():
    """Templates keyed by the latency batch's configurations name an op by its kind id, which
    means another (type, attributes) in another numbering of kinds (a fresh one past the
    featurizer's cap, or another thread's): a max pool and an average pool over the same
    tensors swap ids, and each keeps its own requests (a max pool's int64 indices)."""
    from latpred.memory.cuda import batch_peaks
    from latpred.predictors import batch as feature_batch

    target = parse_target("h100/cuda/fp16")
    graphs = [_pooled("max_pool"), _pooled("avg_pool")]
    want = [simulate(g, "fp16")["peak"] for g in graphs]
    assert want[0] != want[1]
    for order in (graphs, graphs[::-1]):
        feature_batch._OpKeys._local.keys = None      # a fresh numbering, as past its cap
        kernels = [latpred_deduce(g, target) for g in order]
        fb = feature_batch.featurize(order, kernels, target, lambda t: (t, ("flops",)))
        got = batch_peaks(order, "fp16", 1, tensors=fb, kernels=kernels).tolist()
        assert got == [simulate(g, "fp16")["peak"] for g in order]


def latpred_deduce(graph, target):
    from latpred.deduce import deduce

    return tuple(deduce(graph, target))
