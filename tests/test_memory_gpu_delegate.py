"""The GPU delegate's memory (latpred/memory/gpu_delegate.py, gpu_assign.py).

The assignment is checked against the worked examples of TFLite's own test
(tensorflow/lite/delegates/gpu/common/memory_management_test.cc, ChainRecords and
ComplexRecords: GREEDY_BY_BREADTH and GREEDY_BY_SIZE object ids and sizes); the planner
against LiteRT's GPU accelerator's own figure (gpu_intermediate_memory_bytes) recorded on the
H100 in datasets/h100-gpu-memory, on models written here from their seeds and on probes.
"""

import dataclasses
import json
from bisect import bisect_left
from pathlib import Path
from typing import Sequence

import pandas as pd
import pytest

import latpred
from latpred.builder import GraphBuilder
from latpred.errors import TargetError
from latpred.memory.gpu_assign import (best_sizes, greedy_best, greedy_by_breadth,
                                       greedy_by_size, record_arrays)
from latpred.memory.gpu_weights import winograd_output_group
from latpred.memory.gpu_delegate import plan_delegate, tensor_bytes
from latpred.target import parse_target

DATA = Path(__file__).resolve().parents[1] / "datasets" / "h100-gpu-memory"
CHAIN = [(16, 0, 1), (8, 1, 2), (64, 2, 3), (32, 3, 4), (8, 4, 5)]
COMPLEX = [(32, 0, 1), (32, 1, 4), (8, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7), (8, 6, 8),
           (8, 7, 8), (16, 8, 9)]


def test_greedy_assignments_match_tflites_worked_examples():
    assert greedy_by_breadth(CHAIN) == ([0, 1, 0, 1, 0], [64, 32])
    assert greedy_by_size(CHAIN) == ([0, 1, 0, 1, 0], [64, 32])
    assert greedy_by_breadth(COMPLEX) == ([0, 4, 2, 1, 3, 0, 2, 3, 1], [64, 16, 8, 8, 32])
    assert greedy_by_size(COMPLEX) == ([1, 0, 2, 1, 3, 0, 1, 2, 0], [64, 32, 8, 8])
    # BestGreedy takes by-breadth only when strictly smaller (by size 112, by breadth 128 here)
    assert greedy_best(COMPLEX) == greedy_by_size(COMPLEX)
    assert greedy_best([]) == ([], [])


def test_buffers_hold_channels_in_slices_of_four_at_the_target_precision():
    assert tensor_bytes((1, 8, 8, 3), "fp16") == 8 * 8 * 4 * 2
    assert tensor_bytes((1, 8, 8, 40), "fp32") == 8 * 8 * 40 * 4
    assert tensor_bytes((1, 1000), "fp16") == 1000 * 2


def _chain(c: int, hw: int = 8):
    b = GraphBuilder("chain")
    x = b.input((1, hw, hw, c))
    b.output(b.conv2d(b.conv2d(b.conv2d(x, c, 3), c, 3), c, 3))
    return b.build()


def test_a_chain_shares_two_buffers():
    # in [0,0], t1 [0,1], t2 [1,2], out [2,3]: in with t2, t1 with out (measured: 1024 bytes)
    plan = plan_delegate(_chain(4), parse_target("h100/gpu/fp16"), "fp16")
    assert plan.intermediate == 2 * 8 * 8 * 4 * 2
    assert len(plan.buffers) == 2


def test_thin_pointwise_chain_drops_its_inner_tensor_in_fp16_only():
    b = GraphBuilder("dwpw")
    x = b.input((1, 28, 28, 24))
    b.output(b.conv2d(b.depthwise_conv2d(x, 3, activation="RELU6"), 8, 1, activation="RELU6"))
    g = b.build()
    fp16 = plan_delegate(g, parse_target("h100/gpu/fp16"), "fp16")
    fp32 = plan_delegate(g, parse_target("h100/gpu/fp32"), "fp32")
    assert [n.type for n in fp16.nodes] == ["thin_pointwise"]  # 24 channels: <= 32 in fp16
    assert fp16.intermediate == 28 * 28 * (24 + 8) * 2         # measured 50176
    assert [n.type for n in fp32.nodes] == ["dwconv2d", "conv2d"]  # > 16 channels in fp32


def test_predict_memory_on_the_gpu_target_and_a_clear_refusal_elsewhere():
    m = latpred.predict_memory(_chain(16, 32), "h100/gpu/fp16")
    assert m.kernels == "ml-drift" and m.arena == 2 * 32 * 32 * 16 * 2
    assert sum(o.sets_peak for o in m.ops) == 1
    with pytest.raises(TargetError, match="OpenCL"):
        latpred.predict_memory(_chain(4), "pixel4/gpu/fp16")
    with pytest.raises(TargetError, match=r"its runtime \(tflite\)"):   # the phone's CPU
        latpred.predict_memory(_chain(4), "pixel4/cpu/fp32/1L")


def _recorded():
    if not (DATA / "models.parquet").exists():
        pytest.skip("datasets/h100-gpu-memory is not in this checkout")
    return pd.read_parquet(DATA / "models.parquet")


def test_probes_plan_exactly_what_the_accelerator_allocated():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_memory_campaign as campaign

    d = _recorded()
    d = d[(d.source == "probe") & d.intermediate.notna()].set_index(["model", "precision"])
    graphs = dict(campaign.probe_graphs() + campaign.probe_graphs_thin())
    names = sorted({m for m, _ in d.index})[::7]  # a spread of them; all are in the figures
    assert len(names) > 90
    for name in names:
        for prec in ("fp16", "fp32"):
            got = plan_delegate(graphs[name], parse_target(f"h100/gpu/{prec}"), prec)
            assert got.intermediate == d.loc[(name, prec), "intermediate"], (name, prec)


def test_split_grouped_convolutions_plan_exactly_what_the_accelerator_allocated():
    """Run 4: 2 to 16 groups of 1 to 4 input and 1 to 7 output channels, alone and between
    two 1x1 convolutions (fp16); 8 and 16 groups need the split and concat chains."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_memory_campaign as campaign

    d = _recorded()
    d = d[(d.source == "group_probe") & (d.error == "")].set_index("model")
    graphs = dict(campaign.probe_graphs_groups())
    assert len(d) == len(graphs) == 690
    target = parse_target("h100/gpu/fp16")
    for name in sorted(graphs)[::5]:
        got = plan_delegate(graphs[name], target, "fp16")
        assert got.intermediate == d.loc[name, "intermediate"], name


def test_wide_graph_concatenations_and_splits_plan_exactly_what_the_accelerator_allocated():
    """Run 5, held out (measured after the chain rule was committed): the graph's own
    CONCATENATIONs of 3 to 17 inputs, one with an ADD linked in, and SPLITs into 8 to 32."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_memory_campaign as campaign

    d = _recorded()
    d = d[d.source == "wide_probe"].set_index(["model", "precision"])
    graphs = dict(campaign.probe_graphs_wide())
    assert len(d) == 2 * len(graphs) == 152
    for (name, prec), row in d.iloc[::2].iterrows():
        got = plan_delegate(graphs[name], parse_target(f"h100/gpu/{prec}"), prec)
        assert got.intermediate == row.intermediate, (name, prec)


def test_small_map_pointwise_convolutions_hold_their_weights_as_constants():
    """Run 6: ML Drift runs a 1x1 convolution whose output has at most 16 pixels (fp16; 8 in
    fp32) as fully connected, with its weights as constant tensors; 3x3 kernels never."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_memory_campaign as campaign

    d = _recorded()
    d = d[d.source == "small_probe"].set_index(["model", "precision"])
    graphs = dict(campaign.probe_graphs_small())
    assert len(d) == 2 * len(graphs) == 140
    for (name, prec), row in d.iterrows():
        got = plan_delegate(graphs[name], parse_target(f"h100/gpu/{prec}"), prec)
        assert (got.intermediate, got.constant) == (row.intermediate, row.constant), (name, prec)
    held = {(m, p) for (m, p), c in d.constant.items() if c > 0}
    assert ("small1_4_16_16", "fp16") in held and ("small1_4_16_16", "fp32") not in held
    assert not any(m.startswith("small3") for m, _ in held)


def test_winograd_and_bias_less_probes_plan_exactly_what_the_accelerator_allocated():
    """Runs 7 and 8, held out (measured after the rules were committed): a Winograd
    convolution's weights padded to the matmul's output slice group, an FC without a bias; a
    CONV_2D without one does not compile (LiteRT's kernel needs it)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_memory_campaign as campaign

    d = _recorded()
    d = d[d.source.isin(["wino_probe", "wave_probe"])].set_index(["model", "precision"])
    graphs = dict(campaign.probe_graphs_winograd() + campaign.probe_graphs_wave())
    assert len(d) == 2 * len(graphs) == 224
    failed = {m for (m, _), e in d.error.items() if e}
    assert failed == {m for m in graphs if m.startswith("smallnb_")}
    for (name, prec), row in d[d.error == ""].iterrows():
        got = plan_delegate(graphs[name], parse_target(f"h100/gpu/{prec}"), prec)
        assert (got.intermediate, got.constant) == (row.intermediate, row.constant), (name, prec)
    # 100 output channels: 100 at 32x32 (a group of 1), 104 at 40x40 (2), 112 at 56x56 (4)
    c = d.constant
    assert [c[(f"wino_{hw}_64_100", "fp16")] for hw in (32, 40, 56)] == [
        36 * 64 * o * 2 for o in (100, 104, 112)]


def test_winograd_output_group_follows_ml_drifts_nvidia_kernel_parameters():
    gpu = parse_target("h100/gpu/fp16").device.gpu
    assert gpu.compute_units == 132
    # 25 output slices: warps a compute unit = tiles * 36 * 25 / 132 / 8 / 32
    assert [winograd_output_group(gpu, t, 100) for t in (75, 76, 150, 151)] == [1, 2, 2, 4]
    # few slices start from a smaller group: 3 slices -> 3 is not a power of two, stays 3
    assert winograd_output_group(gpu, 10_000, 12) == 3
    assert winograd_output_group(gpu, 10_000, 24) == 2         # 6 slices
    other = dataclasses.replace(gpu, vendor="adreno")
    assert winograd_output_group(other, 10_000, 100) == 1      # not modelled: aligned to 4


def test_wide_concatenations_and_splits_become_chains():
    # GpuModelBuilder::Concat / ::Split with the H100's limits (16 storage buffers, 8 storage
    # textures a shader stage): 4 inputs a concatenation node, 14 outputs and a rest a split node
    b = GraphBuilder("wide")
    x = b.input((1, 8, 8, 8))
    b.output(b.concat([b.conv2d(x, 4, 1) for _ in range(6)]))
    plan = plan_delegate(b.build(), parse_target("h100/gpu/fp16"), "fp16")
    concats = [n for n in plan.nodes if n.type == "concat"]
    assert [len(n.inputs) for n in concats] == [4, 3]
    partial = concats[0].outputs[0]
    assert partial < 0 and concats[1].inputs[0] == partial
    assert plan.tensors[partial] == 8 * 8 * 16 * 2     # the first four inputs' 16 channels
    b = GraphBuilder("g16")
    x = b.input((1, 8, 8, 64))
    b.output(b.conv2d(x, 48, 3, groups=16))            # 4 in, 3 out a group: split
    plan = plan_delegate(b.build(), parse_target("h100/gpu/fp16"), "fp16")
    splits = [n for n in plan.nodes if n.type == "split"]
    assert [len(n.outputs) for n in splits] == [15, 2]  # 14 groups and a rest of 2, then 2
    assert plan.tensors[splits[0].outputs[-1]] == 8 * 8 * 8 * 2
    assert [len(n.inputs) for n in plan.nodes if n.type == "concat"] == [4, 5, 5, 5]


def test_the_recorded_figures_are_the_manifests():
    d = _recorded()
    manifest = json.loads((DATA / "manifest.json").read_text())
    assert manifest["rows"] == len(d)
    assert set(d.precision) == {"fp16", "fp32"}


def test_a_grouped_convolution_split_into_groups_holds_each_groups_slice():
    # 32 channels in 8 groups of 4 -> 40 (5 a group: not a multiple of 4, so the delegate
    # splits it: SPLIT, 8 convolutions, CONCAT); each split output is one group's 4 channels
    b = GraphBuilder("g")
    x = b.input((1, 16, 16, 32))
    b.output(b.conv2d(x, 40, 3, groups=8))
    plan = plan_delegate(b.build(), parse_target("h100/gpu/fp16"), "fp16")
    split = plan.nodes[0]
    assert split.part == "group_split" and len(split.outputs) == 8
    assert {plan.tensors[t] for t in split.outputs} == {16 * 16 * 4 * 2}
    conv_out = plan.nodes[1].outputs[0]
    assert plan.tensors[conv_out] == 16 * 16 * 8 * 2  # 5 channels in two slices
    # each group's convolution holds its own slice: weights OHWI(5, 3, 3, 4) and a bias of 5
    # (ML Drift's ResolveGroupedConvolution), not the whole op's 40 output channels 8 times
    assert plan.packed == 8 * (5 * 3 * 3 * 4 + 8) * 2


def test_a_split_links_the_element_wise_op_on_its_first_part():
    # ML Drift's LinkNodes links through a node's first output (measured: SPLIT -> ADD / TANH
    # -> CONCATENATION plans one buffer fewer than with the ADD as a kernel of its own)
    b = GraphBuilder("s")
    x = b.input((1, 7, 7, 200))
    a, c = b.split(x, 2)
    b.output(b.concat([b.add(a, b.constant((100,))), b.tanh(c)]))
    plan = plan_delegate(b.build(), parse_target("h100/gpu/fp16"), "fp16")
    assert [n.type for n in plan.nodes] == ["split", "activation", "concat"]


# The plain Python port the compiled heuristics replaced (session 31), kept as their oracle:
# the same rules, loop for loop, from ml_drift/common/memory_management/ @ 48cfed7e.
_NONE = float("inf")  # kNotAssigned


def _task_profiles(records: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    """Per task, the records alive at it, by non-increasing size (std::stable_sort)."""
    n_tasks = max((last + 1 for _, _, last in records), default=0)
    profiles: list[list[int]] = [[] for _ in range(n_tasks)]
    for r, (_, first, last) in enumerate(records):
        for t in range(first, last + 1):
            profiles[t].append(r)
    for p in profiles:
        p.sort(key=lambda r: -records[r][0])  # Python's sort is stable, as std::stable_sort
    return profiles


def _positional_maximums(records, profiles) -> list[int]:
    out: list[int] = []
    for p in profiles:
        for i, r in enumerate(p):
            if i < len(out):
                out[i] = max(out[i], records[r][0])
            else:
                out.append(records[r][0])
    return out


def _py_by_size(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyBySizeDistPriorityAssignment: (object id per record, object sizes)."""
    n = len(records)
    pos_max = _positional_maximums(records, _task_profiles(records))
    position = []
    for size, _, _ in records:
        p = 0
        while p < len(pos_max) and pos_max[p] >= size:
            p += 1
        position.append(p - 1)
    dist: list[list[float]] = [[] for _ in range(n)]
    best_dist = [_NONE] * n
    best_obj = [-1] * n
    obj_of = [-1] * n
    sizes: list[int] = []
    for _ in range(n):
        best = -1
        for i in range(n):  # the highest priority among the unassigned (operator>)
            if obj_of[i] != -1:
                continue
            if best == -1 or _higher(position, best_dist, records, i, best):
                best = i
        if best_dist[best] == _NONE:
            new, obj = True, len(sizes)
            sizes.append(records[best][0])
        else:
            new, obj = False, best_obj[best]
            sizes[obj] = max(sizes[obj], records[best][0])
        obj_of[best] = obj
        b_size, b_first, b_last = records[best]
        for i in range(n):
            if obj_of[i] != -1:
                continue
            if not new and dist[i][obj] == _NONE:
                continue
            _, first, last = records[i]
            d = (b_first - last) if last < b_first else (first - b_last) if b_last < first \
                else _NONE
            if new:
                dist[i].append(d)
            elif d == _NONE:
                dist[i][obj] = _NONE
                if best_obj[i] == obj:  # RecalcBestDist
                    best_dist[i], best_obj[i] = _NONE, -1
                    for o, v in enumerate(dist[i]):
                        if v < best_dist[i]:
                            best_dist[i], best_obj[i] = v, o
            else:
                dist[i][obj] = min(dist[i][obj], d)
            if d < best_dist[i]:
                best_dist[i], best_obj[i] = d, obj
    return obj_of, sizes


def _higher(position, best_dist, records, a: int, b: int) -> bool:
    """SizeDistPriorityInfo::operator> (a over b)."""
    if position[a] != position[b]:
        return position[a] < position[b]
    if best_dist[a] != best_dist[b]:
        return best_dist[a] < best_dist[b]
    return records[a][0] > records[b][0]


def _py_by_breadth(records: Sequence[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """GreedyByBreadthAssignment: (object id per record, object sizes)."""
    profiles = _task_profiles(records)
    breadth = [(sum(records[r][0] for r in p), t) for t, p in enumerate(profiles)]
    # std::stable_sort over reverse iterators: by non-increasing breadth, ties by task id.
    order = sorted(breadth, key=lambda bt: (-bt[0], bt[1]))
    obj_of = [-1] * len(records)
    sizes: list[int] = []
    schedules: list[list[tuple[int, int]]] = []  # per object, (first, last) sorted by first
    for _, task in order:
        for r in profiles[task]:
            if obj_of[r] != -1:
                continue
            size, first, last = records[r]
            best = len(schedules)
            for o in range(len(schedules)):
                if best != len(schedules):
                    bs, cs = sizes[best], sizes[o]
                    if bs < size:
                        if cs <= bs:
                            continue
                    elif cs < size or cs >= bs:
                        continue
                if _fits(schedules[o], first, last):
                    best = o
            if best == len(schedules):
                schedules.append([(first, last)])
                sizes.append(size)
            else:
                sched = schedules[best]
                sched.insert(bisect_left(sched, (first,)), (first, last))
                sizes[best] = max(sizes[best], size)
            obj_of[r] = best
    return obj_of, sizes


def _fits(schedule: list[tuple[int, int]], first: int, last: int) -> bool:
    """No interval of the object's schedule meets [first, last] (std::set::lower_bound)."""
    k = bisect_left(schedule, (first,))
    if k < len(schedule) and schedule[k][0] <= last:
        return False
    return not (k > 0 and schedule[k - 1][1] >= first)


def test_compiled_heuristics_equal_the_python_port_on_random_records():
    import random

    rng = random.Random(31)
    for trial in range(400):
        n, tasks = rng.randint(0, 40), rng.randint(1, 30)
        records = []
        for _ in range(n):
            a, b = sorted(rng.randrange(tasks) for _ in range(2))
            records.append((rng.choice((64, 128, 256, 512, 1024, 4096)) * rng.randint(1, 4),
                            a, b))
        assert greedy_by_size(records) == _py_by_size(records), records
        assert greedy_by_breadth(records) == _py_by_breadth(records), records
        best = min(_py_by_breadth(records), _py_by_size(records), key=lambda r: sum(r[1]))
        assert sum(best_sizes(*record_arrays(records))) == sum(best[1])
