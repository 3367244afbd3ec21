"""The pytorch-cuda runtime without a GPU: targets, kernel deduction checked against the shipped
profiler kernel lists, the profiler-trace attribution, and the shipped datasets."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pytest

from latpred import sampler, zoo
from latpred.dataset import Dataset
from latpred.deduce import deduce
from latpred.deduce.cuda import VARIABLE_OPS, launches
from latpred.errors import TargetError
from latpred.target import parse_target

ROOT = Path(__file__).resolve().parent.parent
SYN = ROOT / "datasets" / "h100-cuda-synthetic"
ZOO = ROOT / "datasets" / "h100-cuda-zoo"


@pytest.mark.parametrize("text, batch, precision", [
    ("h100/cuda/fp16", 1, "fp16"), ("h100/cuda/fp16/b32", 32, "fp16"),
    ("h100/cuda/fp32/b1", 1, "fp32"), ("h100/cuda/fp32/b32", 32, "fp32")])
def test_cuda_targets(text, batch, precision):
    t = parse_target(text)
    assert (t.processor, t.batch, t.precision, t.runtime) == ("cuda", batch, precision,
                                                            "pytorch-cuda")
    assert t.is_gpu and t.is_cuda
    assert parse_target(str(t)) == t
    assert str(t) == text.removesuffix("/b1")


@pytest.mark.parametrize("text", ["h100/cuda/int8", "h100/cuda/fp16/b3", "h100/cuda/fp16/t2",
                                  "pixel4/cuda/fp16"])
def test_bad_cuda_targets(text):
    with pytest.raises(TargetError):
        parse_target(text)


def test_other_h100_targets_unchanged():
    assert parse_target("h100/gpu/fp16").runtime == "litert"
    assert parse_target("h100/cpu/fp32/t1").runtime == "litert"


def _graph(arch: dict):
    return zoo.build(arch["zoo"]) if arch.get("zoo") else sampler.build_graph(arch)


def test_deduce_covers_every_op_once():
    target = parse_target("h100/cuda/fp16")
    for name in ("shufflenet_v2_1.0", "mobilenet_v3_large", "googlenet", "ghostnet_1.0"):
        g = zoo.build(name)
        ks = deduce(g, target)
        ops = [i for k in ks for i in k.ops]
        assert sorted(ops) == list(range(len(g.ops)))
        assert all(launches(g, k.main_op) for k in ks)   # every kernel launches something


def _recorded(path: Path, n: int):
    """(graph, model row, recorded CUDA kernels per op) of the first n ok rows of fp16 b1."""
    out = []
    with __import__("gzip").open(path / "cuda_kernels.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["status"] == "ok" and r["target"] == "h100/cuda/fp16" and r["kind"] != "retest":
                out.append(r)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("path, n", [(SYN, 120), (ZOO, 48)])
def test_deduced_launch_counts_match_profiler(path, n):
    """Per op type, how often the deduced number of CUDA kernels equals what the profiler saw:
    every time for fixed-launch ops, at least 85% for the cuDNN ops whose heuristics vary."""
    ds = Dataset.open(path)
    archs = {r.model_id: json.loads(r.arch) for r in ds.models("h100/cuda/fp16").itertuples()}
    agree, total = collections.Counter(), collections.Counter()
    for r in _recorded(path, n):
        g = _graph(archs[r["model_id"]])
        seen = collections.Counter(op for op, _, _ in r["kernels"])
        for i, op in enumerate(g.ops):
            total[op.type] += 1
            agree[op.type] += seen.get(i, 0) == len(launches(g, i))
    assert total
    for t in total:
        rate = agree[t] / total[t]
        assert rate >= (0.85 if t in VARIABLE_OPS else 0.99), (t, agree[t], total[t])


@pytest.mark.parametrize("path, targets", [
    (SYN, {"h100/cuda/fp16": 1000, "h100/cuda/fp16/b32": 200}),
    (ZOO, {"h100/cuda/fp16": 48, "h100/cuda/fp16/b32": 48, "h100/cuda/fp32": 48})])
def test_shipped_datasets(path, targets):
    ds = Dataset.open(path)
    assert sorted(ds.targets()) == sorted(targets)
    for t, n_models in targets.items():
        m, k = ds.models(t), ds.kernels(t)
        assert len(m) >= n_models and (m.status == "ok").mean() > 0.99
        entry = ds.manifest["targets"][t]
        assert entry["runtime"] == "pytorch-cuda" and entry["cudnn"]
        ok = k[k.status == "ok"]
        assert (ok.latency_ms > 0).all()
        # in-context kernels add up to less than the replayed whole, and to most of it
        s = ok.groupby("model_id").latency_ms.sum()
        ratio = (s / m.set_index("model_id").latency_ms.reindex(s.index)).median()
        assert 0.7 < ratio < 1.0
        noise = ds.manifest["targets"][t]["noise"]
        assert noise["n_retest"] >= 25 and noise["e2e_retest_mdape"] <= 1.0


def test_kernel_rows_follow_deduce():
    ds = Dataset.open(ZOO)
    k = ds.kernels("h100/cuda/fp16")
    g = zoo.build("mobilenet_v2_1.0")
    ks = deduce(g, parse_target("h100/cuda/fp16"))
    rows = k[k.model_id == "mobilenet_v2_1.0"].sort_values("kernel_index")
    assert list(rows.kernel_type) == [x.type for x in ks]


def _event(name, ts, dur, cat, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "args": args}


def test_attribute_maps_kernels_to_ops_runs_and_replays():
    from latpred.profile.cuda_trace import attribute, kernel_figures

    ev = [_event("latpred_model0_run0", 0, 100, "user_annotation"),
          _event("latpred_op0:CONV_2D", 1, 20, "user_annotation"),
          _event("cudaLaunchKernel", 2, 1, "cuda_runtime", correlation=1),
          _event("cuLaunchKernelEx", 5, 1, "cuda_driver", correlation=2),
          _event("latpred_op1:ADD", 30, 10, "user_annotation"),
          _event("cudaLaunchKernel", 31, 1, "cuda_runtime", correlation=3),
          _event("conv", 10, 4.0, "kernel", correlation=1),
          _event("bias", 15, 2.0, "kernel", correlation=2),
          _event("add", 40, 1.0, "kernel", correlation=3),
          _event("latpred_model0_replay", 200, 50, "user_annotation"),
          _event("cudaGraphLaunch", 201, 1, "cuda_runtime", correlation=9),
          *[_event(n, t, d, "kernel", correlation=9)
            for n, t, d in [("conv", 210, 3.0), ("bias", 213, 2.0), ("add", 215, 1.0)]]]
    eager, replay = attribute({"traceEvents": ev}, 1, 1)
    assert eager[0][0] == [(0, "conv", 4.0, 10.0), (0, "bias", 2.0, 15.0), (1, "add", 1.0, 40.0)]
    assert [n for n, *_ in replay[0]] == ["conv", "bias", "add"]
    fig = kernel_figures(eager[0], replay[0], 1)
    assert fig["kernel_source"] == "replay"
    assert fig["kernels"] == [[0, "conv", 3.0], [0, "bias", 2.0], [1, "add", 1.0]]
    assert math.isclose(fig["gpu_time_ms"], 0.006)
    fig = kernel_figures(eager[0], replay[0][:2], 1)      # replay list does not match
    assert fig["kernel_source"] == "eager" and fig["kernels"][0][2] == 4.0


def test_kernels_side_by_side_share_their_time():
    """cuDNN runs a grouped convolution's kernels on its own streams, side by side: each
    instant is split among the kernels running, so the times add up to the busy time."""
    from latpred.profile.cuda_trace import exclusive_us, kernel_figures

    # a alone 0-2, a and b 2-4, b alone 4-6, a gap, c alone 10-11
    assert exclusive_us([(4.0, 0.0), (4.0, 2.0), (1.0, 10.0)]) == [3.0, 3.0, 1.0]
    assert exclusive_us([(2.0, 0.0), (2.0, 0.0)]) == [1.0, 1.0]
    assert exclusive_us([(5.0, 0.0), (1.0, 1.0)]) == [4.5, 0.5]   # one inside another
    eager = [[(0, "g1", 4.0, 0.0), (0, "g2", 4.0, 5.0), (1, "add", 1.0, 10.0)]]
    replay = [("g2", 4.0, 100.0), ("g1", 4.0, 100.0), ("add", 1.0, 105.0)]
    fig = kernel_figures(eager, replay, 1)
    assert fig["kernel_source"] == "replay-matched"
    assert [k[2] for k in fig["kernels"]] == [2.0, 2.0, 1.0]
    assert fig["overlap_ms"] == 0.004


def test_replayed_kernels_in_another_order_are_matched_by_name():
    """A CUDA graph may start one op's independent kernels in another order than the eager
    stream (cuDNN's grouped convolutions on the H100), and names a memset node "memset32":
    the replay's times still go to the right kernels (lists as the profiler reported them)."""
    from latpred.profile.cuda_trace import kernel_figures, match_replay

    eager = [[(0, "conv_a", 5.0), (0, "Memset (Device)", 1.0), (1, "gemm", 4.0),
              (1, "slice", 2.0), (1, "slice", 2.0), (2, "add", 1.0)]]
    replay = [("conv_a", 4.0), ("memset32", 0.5), ("slice", 1.5), ("slice", 1.6),
              ("gemm", 3.0), ("add", 0.9)]
    assert match_replay([k[1] for k in eager[0]], [k[0] for k in replay]) == [0, 1, 3, 4, 2, 5]
    fig = kernel_figures(eager, replay, 1)
    assert fig["kernel_source"] == "replay-matched"
    assert [k[2] for k in fig["kernels"]] == [4.0, 0.5, 3.0, 1.5, 1.6, 0.9]
    assert [k[0] for k in fig["kernels"]] == [0, 0, 1, 1, 1, 2]
    # in order after the memset's renaming: "replay"
    fig = kernel_figures(eager, [replay[i] for i in (0, 1, 4, 2, 3, 5)], 1)
    assert fig["kernel_source"] == "replay"
    # another kernel in the replay: the eager times
    fig = kernel_figures(eager, replay[:5] + [("mul", 0.9)], 1)
    assert fig["kernel_source"] == "eager" and fig["kernels"][0][2] == 5.0
