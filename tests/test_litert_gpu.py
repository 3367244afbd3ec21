"""The GPU measurement protocol's logic, tested on the CPU (no GPU here).

The estimator, the pass structure, the interleaving order, the cross-process timing lock and
the recording of failures and CPU fallbacks; `measure_batch` runs for real with LiteRT's CPU
accelerator, which goes through the same CompiledModel calls as the GPU path.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from latpred.errors import MeasurementError
from latpred.profile import litert_gpu as lg
from latpred.profile.gpu_lock import GpuLock
from latpred.profile.litert_gpu import (Estimates, GpuProtocol, GpuResult, PassTimes, estimate,
                                        stats_row, time_models, time_pass)


# -- estimator ----------------------------------------------------------------------------------
def test_estimate_every_estimator_on_known_passes():
    ms = 1_000_000
    passes = [PassTimes(calls_ns=(1 * ms, 2 * ms, 3 * ms), total_ns=9 * ms, idle_read_ns=3 * ms),
              PassTimes(calls_ns=(2 * ms, 2 * ms, 8 * ms), total_ns=15 * ms, idle_read_ns=0),
              PassTimes(calls_ns=(4 * ms, 4 * ms, 4 * ms), total_ns=12 * ms, idle_read_ns=0)]
    e = estimate(passes, GpuProtocol(passes=3, calls=3))
    # pass means with the idle read-back taken out: 2, 5, 4 -> median 4
    assert e.pass_means_ms == pytest.approx((2.0, 5.0, 4.0))
    assert e.pass_mean_median_ms == pytest.approx(4.0)
    assert e.latency_ms == e.pass_mean_median_ms
    calls = [1, 2, 3, 2, 2, 8, 4, 4, 4]
    assert e.call_median_ms == pytest.approx(np.median(calls))
    assert e.min_ms == pytest.approx(1.0)
    assert e.n_runs == 9
    q1, q3 = np.percentile(calls, [25, 75])
    assert e.iqr_ms == pytest.approx(q3 - q1)
    # 10% trimmed from each end of 9 values cuts none (floor(0.9)); 20% cuts one each side
    assert e.trimmed_mean_ms == pytest.approx(np.mean(calls))
    e20 = estimate(passes, GpuProtocol(passes=3, calls=3, trim=0.2, estimator="trimmed_mean"))
    assert e20.latency_ms == pytest.approx(np.mean(sorted(calls)[1:-1]))


@pytest.mark.parametrize("name, field", [("call_median", "call_median_ms"), ("call_min", "min_ms"),
                                         ("trimmed_mean", "trimmed_mean_ms")])
def test_protocol_estimator_picks_latency(name, field):
    passes = [PassTimes(calls_ns=(100, 300, 200, 900), total_ns=2000)]
    e = estimate(passes, GpuProtocol(estimator=name))
    assert e.latency_ms == getattr(e, field)


def test_estimate_rejects_no_calls():
    with pytest.raises(MeasurementError):
        estimate([PassTimes(calls_ns=(), total_ns=0)], GpuProtocol())


def test_idle_read_larger_than_total_does_not_go_negative():
    assert PassTimes(calls_ns=(5,), total_ns=10, idle_read_ns=50).mean_ns == 0


@pytest.mark.parametrize("kwargs", [{"passes": 0}, {"calls": 0}, {"warmup": -1},
                                    {"estimator": "mean"}, {"trim": 0.5}, {"pass_ms": -1},
                                    {"calls": 20, "max_calls": 10}])
def test_protocol_validation(kwargs):
    with pytest.raises(MeasurementError):
        GpuProtocol(**kwargs)


# -- pass structure and interleaving (fake models and clock) ------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now


class FakeModel:
    """Runs take `run_ns` on the fake clock; a read-back waits `read_ns`; logs what happened."""

    def __init__(self, key, clock, log, run_ns=100, read_ns=30):
        self.key, self.clock, self.log = key, clock, log
        self.run_ns, self.read_ns = run_ns, read_ns

    def run(self):
        self.clock.now += self.run_ns
        self.log.append(("run", self.key))

    def sync(self):
        self.clock.now += self.read_ns
        self.log.append(("sync", self.key))


def test_time_pass_counts_the_read_back_then_measures_it_idle():
    clock, log = FakeClock(), []
    p = time_pass(FakeModel("a", clock, log), calls=4, clock=clock)
    assert p.calls_ns == (100,) * 4
    assert p.total_ns == 4 * 100 + 30
    assert p.idle_read_ns == 30
    assert p.mean_ns == 100
    assert log == [("run", "a")] * 4 + [("sync", "a")] * 2


def test_sequential_passes_keep_each_model_together():
    clock, log = FakeClock(), []
    models = [FakeModel(k, clock, log) for k in "ab"]
    passes = time_models(models, GpuProtocol(warmup=1, passes=2, calls=2, pass_ms=0),
                         clock=clock)
    assert [len(p) for p in passes] == [2, 2]
    runs = [k for what, k in log if what == "run"]
    # each model warmed up right before its own passes, no other model in between
    assert runs == ["a"] + ["a"] * 4 + ["b"] + ["b"] * 4
    # a: warm-up run + read-back, then 2 passes of (2 runs, read-back, idle read-back)
    assert {k for _, k in log[:10]} == {"a"} and {k for _, k in log[10:]} == {"b"}


def test_interleaved_passes_alternate_across_models():
    clock, log = FakeClock(), []
    models = [FakeModel(k, clock, log) for k in "abc"]
    protocol = GpuProtocol(warmup=2, passes=3, calls=2, pass_ms=0, interleave=True)
    passes = time_models(models, protocol, clock=clock)
    assert [len(p) for p in passes] == [3, 3, 3]
    runs = [k for what, k in log if what == "run"]
    warm = ["a", "a", "b", "b", "c", "c"]
    assert runs == warm + (["a", "a", "b", "b", "c", "c"] * 3)
    # every model's warm-up ends with a read-back, before any timed call
    assert log[:3] == [("run", "a"), ("run", "a"), ("sync", "a")]


def test_calls_per_pass_fills_the_pass_within_bounds():
    fixed = GpuProtocol(calls=10, pass_ms=0)
    assert fixed.calls_per_pass(0.001) == 10  # pass_ms 0: never adapts
    p = GpuProtocol(calls=10, pass_ms=5.0, max_calls=1000)
    assert p.calls_per_pass(0.1) == 50
    assert p.calls_per_pass(0.03) == 167  # rounded up
    assert p.calls_per_pass(2.0) == 10  # never below `calls`
    assert p.calls_per_pass(0.0001) == 1000  # never above `max_calls`
    assert p.calls_per_pass(0.0) == 1000


def test_adaptive_passes_are_sized_per_model_from_a_calibration_pass():
    clock, log = FakeClock(), []
    fast = FakeModel("fast", clock, log, run_ns=100_000, read_ns=10_000)  # 0.1 ms a call
    slow = FakeModel("slow", clock, log, run_ns=2_000_000, read_ns=10_000)  # 2 ms a call
    protocol = GpuProtocol(warmup=1, passes=2, calls=4, pass_ms=5.0, max_calls=100)
    passes = time_models([fast, slow], protocol, clock=clock)
    assert [len(p.calls_ns) for p in passes[0]] == [50, 50]
    assert [len(p.calls_ns) for p in passes[1]] == [4, 4]
    e = estimate(passes[0], protocol)
    assert e.n_runs == 100 and e.latency_ms == pytest.approx(0.1)


# -- the GPU lock -------------------------------------------------------------------------------
def _hold(path, mode, hold_s, ready):
    lock = GpuLock(path)
    with (lock.exclusive() if mode == "exclusive" else lock.shared()):
        ready.set()
        time.sleep(hold_s)


def _hold_until(path, release, ready):
    with GpuLock(path).shared():
        ready.set()
        release.wait(60)


def _start_holder(path, mode, hold_s):
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(path), mode, hold_s, ready))
    proc.start()
    assert ready.wait(30)
    return proc


def _waited(path, mode) -> float:
    lock = GpuLock(path)
    start = time.perf_counter()
    with (lock.exclusive() if mode == "exclusive" else lock.shared()):
        return time.perf_counter() - start


def test_exclusive_waits_for_shared_holders_and_shared_for_exclusive(tmp_path):
    path = tmp_path / "gpu.lock"
    holder = _start_holder(path, "shared", 0.6)
    assert _waited(path, "exclusive") >= 0.3  # a timer waits for a compiler
    holder.join(10)
    holder = _start_holder(path, "exclusive", 0.6)
    assert _waited(path, "shared") >= 0.3  # a compiler waits for a timer
    holder.join(10)


def test_shared_holders_do_not_wait_for_each_other(tmp_path):
    path = tmp_path / "gpu.lock"
    holder = _start_holder(path, "shared", 3.0)
    assert _waited(path, "shared") < 1.0
    holder.kill()
    holder.join(10)


def _timer_then_log(path, log, ready):
    lock = GpuLock(path)
    ready.set()
    with lock.exclusive():
        log.put("timer")
        # a Queue's put returns before its feeder thread writes the pipe: flush while the lock
        # is held, or the compiler's later put can reach the pipe first (seen in CI)
        log.close()
        log.join_thread()


def _wait_until_turnstile_taken(path, timeout_s: float = 30.0) -> None:
    import fcntl

    fd = os.open(str(path) + ".turnstile", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.01)
        raise AssertionError("the timer never took the turnstile")
    finally:
        os.close(fd)


def test_waiting_timer_goes_before_later_shared_holders(tmp_path):
    """A compiler arriving while a timer waits must not get in first (the turnstile)."""
    path = tmp_path / "gpu.lock"
    ctx = mp.get_context("spawn")
    # The first shared holder lets go only once the compiler below is queued, however slowly
    # the spawned processes start on a loaded machine.
    release, first_ready = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_hold_until, args=(str(path), release, first_ready))
    first.start()
    assert first_ready.wait(30)
    log, ready = ctx.Queue(), ctx.Event()
    timer = ctx.Process(target=_timer_then_log, args=(str(path), log, ready))
    timer.start()
    assert ready.wait(30)
    _wait_until_turnstile_taken(path)  # the timer now waits behind the first shared holder
    threading.Timer(0.5, release.set).start()  # the compiler is blocked by then
    with GpuLock(path).shared():
        log.put("compiler")
    timer.join(10)
    first.join(10)
    assert [log.get(timeout=5), log.get(timeout=5)] == ["timer", "compiler"]


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    path = tmp_path / "gpu.lock"
    holder = _start_holder(path, "exclusive", 3600)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert _waited(path, "exclusive") < 5


def test_no_path_lock_is_a_no_op():
    lock = GpuLock(None)
    with lock.exclusive():
        with lock.shared():  # would deadlock with a real path; nothing to lock here
            assert lock.waited_s == 0.0


# -- results as dataset rows --------------------------------------------------------------------
def _estimates(latency=1.0):
    return Estimates(latency_ms=latency, iqr_ms=0.1, min_ms=0.9, n_runs=210,
                     pass_mean_median_ms=latency, call_median_ms=1.1, trimmed_mean_ms=1.05,
                     pass_means_ms=(1.0,))


def test_cpu_fallback_is_recorded_as_failed_with_figures_kept():
    row = stats_row(GpuResult("m", "ok", fully_accelerated=False, compile_s=0.4,
                              estimates=_estimates(2.0)))
    assert row["status"] == "failed"
    assert row["error"].startswith("cpu_fallback")
    assert row["latency_ms"] == 2.0 and row["n_runs"] == 210
    assert row["fully_accelerated"] is False


def test_ok_and_failed_rows():
    ok = stats_row(GpuResult("m", "ok", fully_accelerated=True, compile_s=0.4,
                             estimates=_estimates()))
    assert ok["status"] == "ok" and ok["error"] == "" and ok["latency_min_ms"] == 0.9
    bad = stats_row(GpuResult("m", "failed", error="LiteRT cannot compile the model"))
    assert bad["status"] == "failed" and bad["n_runs"] == 0
    assert math.isnan(bad["latency_ms"]) and math.isnan(bad["compile_s"])


# -- real LiteRT (CPU accelerator: the same CompiledModel code path) ----------------------------
def _conv_model(hw: int, channels: int) -> bytes:
    from latpred.builder import GraphBuilder
    from latpred.tflite import write_tflite

    b = GraphBuilder("conv")
    b.output(b.conv2d(b.input((1, hw, hw, channels)), channels, 3, activation="RELU"))
    return write_tflite(b.build(), seed=0)


def test_measure_batch_records_failures_and_keeps_order(tmp_path):
    protocol = GpuProtocol(warmup=2, passes=3, calls=5, pass_ms=0)
    models = [("small", _conv_model(8, 8)), ("garbage", b"not a tflite file"),
              ("larger", _conv_model(32, 16))]
    results = lg.measure_batch(models, protocol, lock_path=tmp_path / "lock", accelerator="cpu",
                               environment=lg.new_environment())
    assert [r.key for r in results] == ["small", "garbage", "larger"]
    small, garbage, larger = results
    assert garbage.status == "failed" and "cannot compile" in garbage.error
    for r in (small, larger):
        assert r.status == "ok" and r.fully_accelerated
        assert r.estimates.n_runs == 15 and r.estimates.latency_ms > 0
    # 32x32x16 3x3 conv does 32x the work of 8x8x8: it must time slower
    assert larger.estimates.min_ms > small.estimates.min_ms


def test_load_rejects_unknown_precision_and_accelerator():
    with pytest.raises(MeasurementError):
        lg.load("m", b"", precision="int8")
    with pytest.raises(MeasurementError):
        lg.load("m", b"", accelerator="npu")


# -- the campaign's bookkeeping (scripts/gpu_campaign.py, scripts/gpu_assemble.py) ---------------
def _scripts():
    import sys
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[1] / "scripts")
    if path not in sys.path:
        sys.path.insert(0, path)
    import gpu_assemble
    import gpu_campaign

    return gpu_campaign, gpu_assemble


def _plan_models():
    kernels = lambda *hashes: [{"index": i, "config_hash": h, "type": "conv2d", "ops": "CONV_2D",
                                "first": False} for i, h in enumerate(hashes)]
    return [{"model_id": "m0", "arch": {}, "file_hash": "f0", "kernels": kernels("a", "b", "a")},
            {"model_id": "m1", "arch": {}, "file_hash": "f1", "kernels": kernels("b", "c")}]


def test_each_configuration_goes_with_the_first_model_that_holds_it():
    campaign, _ = _scripts()
    reqs = campaign.batches(_plan_models(), "main", all_kernels=False)
    assert [(r["model_id"], r["e2e"], r["kernels"]) for r in reqs] == [
        ("m0", True, [(0, "a"), (1, "b")]), ("m1", True, [(1, "c")])]
    # items measured by an earlier call are not measured again
    reqs = campaign.batches(_plan_models(), "main", all_kernels=False,
                            done={"e2e:m0", "cfg:a", "cfg:b"})
    assert [(r["model_id"], r["e2e"], r["kernels"]) for r in reqs] == [("m1", True, [(1, "c")])]
    # a retest takes every distinct item of the model
    (again,) = campaign.batches(_plan_models()[:1], "retest", all_kernels=True)
    assert again["kernels"] == [(0, "a"), (1, "b")] and again["tag"] == "retest"


def test_a_crashed_batch_is_split_so_only_the_culprit_fails():
    campaign, _ = _scripts()
    req = {"model_id": "m0", "e2e": True, "kernels": [(0, "a"), (1, "b")], "tag": "main"}
    singles = campaign.singletons(req)
    assert [campaign.item_keys(s) for s in singles] == [["e2e:m0"], ["cfg:a"], ["cfg:b"]]


def test_contended_kernels_are_failed_with_figures_kept_and_left_out_of_the_noise(tmp_path):
    import json

    _, assemble = _scripts()
    row = lambda item, tag, ms, call: {"item": item, "tag": tag, "status": "ok", "error": "",
                                       "latency_ms": ms, "latency_call_median_ms": call}
    lines = [row("cfg:a", "main", 0.07, 0.05), row("cfg:b", "main", 2.5, 2.4),
             row("e2e:m0", "main", 0.30, 0.2), row("cfg:a", "retest", 0.077, 0.05),
             row("cfg:b", "retest", 0.06, 0.05), row("e2e:m0", "retest", 0.33, 0.2),
             {"item": "cfg:c", "tag": "main", "status": "failed", "error": "crashed"},
             row("cfg:c", "main", 0.1, 0.05)]  # a later ok row replaces the failure
    path = tmp_path / "call" / "results.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(json.dumps(x) for x in lines))
    main, retest = assemble.read_results([path])
    assert main["cfg:c"]["status"] == "ok" and main["cfg:a"]["source"] == "call"
    assert assemble.flag_contended(main, 0.15) == 1
    assert main["cfg:b"]["status"] == "failed" and main["cfg:b"]["error"].startswith("contended")
    assert main["cfg:b"]["latency_ms"] == 2.5  # kept
    assert main["e2e:m0"]["status"] == "ok"  # end-to-end rows are not judged by this rule
    noise = assemble.noise(main, retest)
    assert noise["n_kernel_retest"] == 1 and noise["kernel_retest_mdape"] == pytest.approx(10.0)
    assert noise["e2e_retest_mdape"] == pytest.approx(10.0)


def test_sustained_warm_up_runs_for_warmup_s_then_rewarm_s_for_the_rest_of_a_batch():
    clock, log = FakeClock(), []
    # 1 ms runs: 0.25 s of warm-up is 250 runs (in groups of 20, each closed by a read-back)
    models = [FakeModel(k, clock, log, run_ns=1_000_000, read_ns=0) for k in "ab"]
    protocol = GpuProtocol(warmup=0, warmup_s=0.25, rewarm_s=0.02, passes=1, calls=1, pass_ms=0)
    time_models(models, protocol, clock=clock)
    runs = [k for what, k in log if what == "run"]
    assert runs.count("a") == 260 + 1  # 13 groups of 20 reach 0.25 s; then one timed call
    assert runs.count("b") == 20 + 1  # the GPU was just busy: only rewarm_s


def test_negative_warm_up_time_is_refused():
    with pytest.raises(MeasurementError):
        GpuProtocol(warmup_s=-0.1)
