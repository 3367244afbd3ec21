"""In-context per-op timings from LiteRT's profiler (ctypes over libLiteRt.so's C API)."""

from __future__ import annotations

import os
from functools import partial

import pytest

from latpred.builder import GraphBuilder
from latpred.errors import MeasurementError
from latpred.profile.litert_profiler import OpProfile, OpTiming, profile_ops
from latpred.profile.op_attribution import _fits, attribute_to_graph
from latpred.profile.worker import Worker
from latpred.tflite import write_tflite

pytest.importorskip("ai_edge_litert")


def _small_graph():
    """Big enough (about 1 ms) that the per-run overhead outside the ops stays small."""
    b = GraphBuilder("small")
    x = b.input((1, 56, 56, 32))
    y = b.conv2d(x, 64, 3, activation="RELU")
    y = b.depthwise_conv2d(y, 3, activation="RELU6")
    y = b.add(y, b.conv2d(x, 64, 1))
    y = b.mean(y, keep_dims=False)
    y = b.fully_connected(y, 10)
    b.output(b.softmax(y))
    return b.build()


@pytest.fixture(scope="module")
def small():
    # Measured in a fresh process, as latpred's profiler always measures (`profile.worker`:
    # spawned, so no state of the parent leaks in). In the test session's own process, after
    # hundreds of tests, every profiled run has read 1-3 ms of wall clock around ~1.5 ms of
    # ops in some full-suite CIs (and never alone), which the checks below are not about.
    graph = _small_graph()
    with Worker(partial(profile_ops, threads=1, runs=15, warmup=3)) as worker:
        outcome = worker.call(write_tflite(graph))
    assert outcome.ok, outcome.error
    return graph, outcome.value


def test_reported_ops_match_the_graph(small):
    graph, prof = small
    assert all(op.source == "xnnpack" for op in prof.ops)  # all of it runs in XNNPACK
    attributed = attribute_to_graph(graph, prof)
    assert [a.op_type for a in attributed] == [op.type for op in graph.ops]
    assert all(a.events for a in attributed)  # nothing dropped, nothing unexplained
    owners = sorted(j for a in attributed for j in a.events)
    assert owners == list(range(len(prof.ops)))  # every operator belongs to exactly one op
    names = {a.op_type: [prof.ops[j].name for j in a.events] for a in attributed}
    assert names["DEPTHWISE_CONV_2D"][0].startswith("Convolution")
    assert names["SOFTMAX"][0].startswith("Softmax")
    assert names["FULLY_CONNECTED"][0].startswith("Fully Connected")


def test_timings_are_positive_and_sum_close_to_end_to_end(small):
    graph, prof = small
    clean = prof.run_preempted.count(False)
    assert prof.n_runs == (clean if clean >= 3 else 15)
    assert all(op.n_runs == prof.n_runs for op in prof.ops)
    assert all(op.median_us >= 0 and op.mean_us > 0 and op.iqr_us >= 0 for op in prof.ops)
    conv = attribute_to_graph(graph, prof)[0]
    assert conv.op_type == "CONV_2D" and conv.mean_us > 50  # a 56x56x32->64 3x3 conv
    # The ops tile XNNPACK's run, which lies inside the timed call (buffer sync, call overhead
    # around it): within each run the raw op sum is below the run's wall clock. The shared
    # host preempts runs, so "close" is checked on the fastest run only.
    assert len(prof.run_e2e_us) == len(prof.run_op_sum_us) == len(prof.run_cpu_us) == 15
    assert all(0 < s <= e for s, e in zip(prof.run_op_sum_us, prof.run_e2e_us))
    # One thread: XNNPACK runs on the calling thread, whose CPU time is at most the wall clock.
    assert all(0 < c <= e * 1.01 for c, e in zip(prof.run_cpu_us, prof.run_e2e_us))
    assert all(isinstance(p, bool) for p in prof.run_preempted)
    # The ops add up to (nearly all of) a run without the profiler's bookkeeping.
    assert 0.8 < prof.op_sum_us / prof.plain_e2e_median_us < 1.1
    fastest = min(range(15), key=lambda r: prof.run_e2e_us[r])
    assert prof.run_op_sum_us[fastest] > 0.6 * prof.run_e2e_us[fastest]
    assert prof.run_cpu_us[fastest] > 0.6 * prof.run_e2e_us[fastest]


def test_ops_left_to_tflite_kernels_and_dropped_ops():
    b = GraphBuilder("pools")
    x = b.input((1, 28, 28, 16))
    y = b.max_pool(x, 1, stride=1, padding="SAME")  # an identity: XNNPACK drops it
    y = b.conv2d(y, 16, 3)
    y = b.max_pool(y, 1, stride=2, padding="SAME")  # XNNPACK declines it; TFLite runs it
    b.output(b.conv2d(y, 8, 3))
    graph = b.build()
    prof = profile_ops(write_tflite(graph), runs=5, warmup=1)
    tflite = [op for op in prof.ops if op.source == "tflite"]
    assert [(op.name, op.index) for op in tflite] == [("MAX_POOL_2D", 2)]  # node index
    attributed = attribute_to_graph(graph, prof)
    assert attributed[0].events == () and attributed[0].mean_us == 0.0
    assert [prof.ops[j].source for j in attributed[2].events] == ["tflite"]
    assert all(a.events for a in attributed[1:])


def test_two_threads():
    graph = _small_graph()
    prof = profile_ops(write_tflite(graph), threads=2, runs=3, warmup=1)
    assert prof.threads == 2 and len(attribute_to_graph(graph, prof)) == len(graph.ops)


def _timing(index, name, us, source="xnnpack"):
    return OpTiming(index=index, name=name, source=source, median_us=us, iqr_us=0.0, mean_us=us,
                    n_runs=1)


def test_alignment_attributes_internal_reshape_and_skips_unknown():
    b = GraphBuilder("t")
    x = b.input((1, 7, 7, 32))
    y = b.mean(b.conv2d(x, 32, 1), keep_dims=False)
    b.output(b.softmax(b.fully_connected(y, 10)))
    graph = b.build()
    ops = (_timing(0, "Fully Connected (NC, F32) GEMM", 10.0),  # the 1x1 conv, as a GEMM
           _timing(1, "Mean (ND) Reduce2", 2.0), _timing(2, "Static Reshape (NC)", 0.5),
           _timing(3, "Fully Connected (NC, F32) GEMM", 4.0),
           _timing(4, "Mystery (NC)", 1.0), _timing(5, "Softmax (NC, F32)", 3.0))
    prof = OpProfile(ops=ops, e2e_median_us=30.0, e2e_iqr_us=0.0, invoke_median_us=25.0,
                     n_runs=1, threads=1)
    got = [(a.op_type, a.events, a.mean_us) for a in attribute_to_graph(graph, prof)]
    assert got == [("CONV_2D", (0,), 10.0), ("MEAN", (1, 2), 2.5),
                   ("FULLY_CONNECTED", (3, 4), 5.0), ("SOFTMAX", (5,), 3.0)]
    assert prof.op_sum_us == pytest.approx(20.5)


def test_tflite_events_only_match_their_node():
    b = GraphBuilder("t")
    x = b.input((1, 8, 8, 4))
    b.output(b.max_pool(b.max_pool(x, 2, stride=1, padding="SAME"), 2, stride=1,
                        padding="SAME"))
    graph = b.build()
    prof = OpProfile(ops=(_timing(1, "MAX_POOL_2D", 7.0, source="tflite"),), e2e_median_us=9.0,
                     e2e_iqr_us=0.0, invoke_median_us=8.0, n_runs=1, threads=1)
    got = [(a.events, a.mean_us) for a in attribute_to_graph(graph, prof)]
    assert got == [((), 0.0), ((0,), 7.0)]


def test_bad_input_raises_measurement_error():
    with pytest.raises(MeasurementError):
        profile_ops(b"not a model at all", runs=1, warmup=0)
    with pytest.raises(MeasurementError):
        profile_ops(write_tflite(_small_graph()), runs=0)


class _FakeSession:
    """Scripted runs: (wall us, preempted, [(tag, us), ...]) each."""

    def __init__(self, runs):
        self._runs, self._calls = runs, 0

    def run(self):
        """Profiled run i, then a plain run 5 us faster."""
        wall, preempted, _ = self._runs[self._calls // 2]
        wall -= 5 * (self._calls % 2)
        self._calls += 1
        return int(wall * 1e3), int(wall * 1e3), preempted

    def events(self):
        _, _, ops = self._runs[(self._calls - 1) // 2]
        return ([(16, "invoke", 99, -1)]
                + [(8, tag, us, k) for k, (tag, us) in enumerate(ops)])

    def profiled_run(self):
        return (*self.run(), self.events())


def test_statistics_come_from_clean_runs_when_there_are_enough():
    from latpred.profile.litert_profiler import _timed_runs

    ops = lambda a: [("Add (ND)", a), ("Softmax (NC, F32)", 2)]  # noqa: E731
    runs = [(100.0, False, ops(10)), (9000.0, True, ops(8000)), (102.0, False, ops(12)),
            (98.0, False, ops(11)), (7000.0, True, ops(6000))]
    prof = _timed_runs(_FakeSession(runs), len(runs), threads=1)
    assert prof.n_runs == 3 and prof.e2e_median_us == 100.0 and prof.plain_e2e_median_us == 95.0
    assert (prof.plain_e2e_min_us, prof.plain_e2e_iqr_us, prof.plain_n_runs) == (93.0, 2.0, 3)
    assert prof.ops[0].median_us == 11 and prof.ops[0].mean_us == pytest.approx(11.5)
    assert prof.ops[0].min_us == 10.5  # the fastest clean reading, truncation undone
    assert prof.run_preempted == (False, True, False, False, True)
    assert prof.run_op_sum_us[1] == 8002
    # Too few clean runs: all of them count.
    prof = _timed_runs(_FakeSession([(r[0], True, r[2]) for r in runs]), len(runs), threads=1)
    assert prof.n_runs == 5 and prof.ops[0].median_us == 12


def test_inconsistent_or_missing_events_raise():
    from latpred.profile.litert_profiler import _timed_runs

    runs = [(100.0, False, [("Add (ND)", 3)]), (100.0, False, [("Softmax (NC, F32)", 3)])]
    with pytest.raises(MeasurementError, match="different ops"):
        _timed_runs(_FakeSession(runs), 2, threads=1)
    with pytest.raises(MeasurementError, match="no operator events"):
        _timed_runs(_FakeSession([(100.0, False, [])]), 1, threads=1)


def _split_graph():
    b = GraphBuilder("split", fuse_activations=False)
    x = b.conv2d(b.input((1, 16, 16, 8)), 12, 3)
    parts = b.split_v(x, (4, 4, 4))
    b.output(b.concat([b.tanh(parts[0]), b.relu6(parts[1]), b.sigmoid(parts[2])]))
    return b.build()


def test_partitions_scheduled_after_tflite_ops_still_map():
    # TFLite runs SPLIT_V and RELU6 itself and schedules the delegate partition holding
    # TANH (before RELU6 in the file) after RELU6: events come out of file order.
    graph = _split_graph()
    assert [op.type for op in graph.ops] == ["CONV_2D", "SPLIT_V", "TANH", "RELU6", "LOGISTIC",
                                              "CONCATENATION"]
    ops = (_timing(0, "Convolution (NHWC, QC8) IGEMM", 9.0), _timing(1, "SPLIT_V", 2.0, "tflite"),
           _timing(3, "RELU6", 1.0, "tflite"), _timing(0, "TanH (NC)", 3.0),
           _timing(1, "Sigmoid (NC)", 4.0), _timing(2, "Copy (NC, X8)", 5.0))
    prof = OpProfile(ops=ops, e2e_median_us=30.0, e2e_iqr_us=0.0, invoke_median_us=25.0,
                     n_runs=1, threads=1)
    got = [(a.op_type, a.events) for a in attribute_to_graph(graph, prof)]
    assert got == [("CONV_2D", (0,)), ("SPLIT_V", (1,)), ("TANH", (3,)), ("RELU6", (2,)),
                   ("LOGISTIC", (4,)), ("CONCATENATION", (5,))]


def test_int8_model_maps_every_op():
    graph = _split_graph()
    prof = profile_ops(write_tflite(graph, precision="int8"), runs=3, warmup=1)
    attributed = attribute_to_graph(graph, prof)
    assert all(a.events for a in attributed)
    assert sorted(j for a in attributed for j in a.events) == list(range(len(prof.ops)))
    assert all(_fits(a.op_type, prof.ops[j]) for a in attributed for j in a.events)


def test_profile_request_runs_in_a_worker_process():
    from latpred.profile.litert_cpu import CpuRequest
    from latpred.profile.litert_profiler import profile_request
    from latpred.profile.protocol import Protocol
    from latpred.profile.worker import Worker

    graph = _small_graph()
    cpu = min(os.sched_getaffinity(0))
    request = CpuRequest(model=write_tflite(graph), cpus=(cpu,), protocol=Protocol(warmup=1))
    with Worker(profile_request, timeout_s=60) as worker:
        outcome = worker.call(request)
    assert outcome.ok, outcome.error
    assert len(attribute_to_graph(graph, outcome.value)) == len(graph.ops)
    with pytest.raises(MeasurementError, match="XNNPACK"):
        profile_request(CpuRequest(model=b"", kernels="builtin"))


def test_kernel_timings_sum_their_ops():
    from latpred.deduce.kernel import Kernel
    from latpred.profile.op_attribution import GraphOpTiming, kernel_timings

    attributed = (GraphOpTiming(0, "CONV_2D", 10.0, (0,), iqr_us=1.0, min_us=9.0),
                  GraphOpTiming(1, "RELU", 0.0, ()),
                  GraphOpTiming(2, "MEAN", 2.5, (1, 2), iqr_us=0.5, min_us=2.0))
    got = kernel_timings(attributed, [Kernel("conv2d", (0, 1)), Kernel("mean", (2,))], n_runs=7)
    assert [(k.mean_us, k.iqr_us, k.min_us, k.n_runs) for k in got] == [
        (10.0, 1.0, 9.0, 7), (2.5, 0.5, 2.0, 7)]
    with pytest.raises(MeasurementError, match="does not cover"):
        kernel_timings(attributed, [Kernel("add", (3,))], n_runs=7)


def test_attribution_sums_iqr_and_min_per_op():
    b = GraphBuilder("t")
    b.output(b.softmax(b.input((1, 10))))
    graph = b.build()
    ops = (OpTiming(0, "Softmax (NC, F32)", "xnnpack", 3.0, 1.0, 3.5, 5, min_us=2.5),
           OpTiming(1, "Static Reshape (NC)", "xnnpack", 1.0, 0.5, 1.5, 5, min_us=1.5))
    prof = OpProfile(ops=ops, e2e_median_us=9.0, e2e_iqr_us=0.0, invoke_median_us=8.0,
                     n_runs=5, threads=1)
    (softmax,) = attribute_to_graph(graph, prof)
    assert (softmax.mean_us, softmax.iqr_us, softmax.min_us) == (5.0, 1.5, 4.0)
