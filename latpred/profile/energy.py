"""Power and energy on an NVIDIA GPU from NVML, under sustained CUDA-graph replay.

Runs on a machine with CUDA and pynvml (the device machine; see shared/device-gpu.md).

NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since the driver loaded)
is updated by the board at its own pace, so a window read at arbitrary times carries up to one
update period of error at each end. `sustained_power` therefore keeps the GPU busy with a
captured graph and measures between two *edges* of the counter: it polls the counter while
replaying, starts the window at the first change it sees after `warm_s`, and ends it at the first
change after `window_s`; power = energy between the edges / host time between them. The replays
are fed from the host a few at a time (`depth` CUDA events in flight, each after about
`event_ms` of GPU work) so that the host polls often and the GPU never starves. The replay
latency over the same window comes from two CUDA timing events: energy per replay =
power x latency. `idle_power` measures the same way with nothing running (clocks drop to idle).

Also read at the end of each window: NVML's GPU utilization (% of the last sample period in
which a kernel ran), SM and memory clocks, temperature and the driver's 1 s average power.
"""

from __future__ import annotations

import collections
import math
import time


class Nvml:
    """The first GPU's NVML handle and the few readings a power measurement needs."""

    def __init__(self, index: int = 0):
        import pynvml as nv

        nv.nvmlInit()
        self.nv = nv
        self.h = nv.nvmlDeviceGetHandleByIndex(index)

    def energy_mj(self) -> int:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)

    def state(self) -> dict:
        nv, h = self.nv, self.h
        out = {}
        for key, fn in (("util_gpu", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                        ("util_mem", lambda: nv.nvmlDeviceGetUtilizationRates(h).memory),
                        ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                        ("mem_clock_mhz",
                         lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                        ("temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                        ("power_avg_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)):
            try:
                out[key] = fn()
            except Exception:   # one missing reading must not lose the measurement
                out[key] = math.nan
        return out


def _edge(nvml: Nvml, step, timeout_s: float) -> tuple[float, int, int]:
    """Run `step()` until the energy counter changes; (host time, new value, polls)."""
    e0 = nvml.energy_mj()
    t_end = time.perf_counter() + timeout_s
    polls = 0
    while True:
        step()
        e = nvml.energy_mj()
        polls += 1
        if e != e0:
            return time.perf_counter(), e, polls
        if time.perf_counter() > t_end:
            return time.perf_counter(), e, polls


class _Feeder:
    """Keeps `depth` CUDA events of replays in flight; `step` adds work or retires some."""

    def __init__(self, replay, est_ms: float, event_ms: float = 1.0, queue_ms: float = 8.0):
        import torch

        self.torch = torch
        self.replay = replay
        self.per_event = max(1, round(event_ms / max(est_ms, 1e-4)))
        self.depth = max(2, math.ceil(queue_ms / max(self.per_event * est_ms, 1e-4)))
        self.queue: collections.deque = collections.deque()
        self.enqueued = 0

    def step(self) -> None:
        if len(self.queue) < self.depth:
            for _ in range(self.per_event):
                self.replay()
            ev = self.torch.cuda.Event()
            ev.record()
            self.queue.append(ev)
            self.enqueued += self.per_event
        elif self.queue[0].query():
            self.queue.popleft()
        else:
            time.sleep(0)

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev, self.enqueued


def sustained_power(replay, est_ms: float, nvml: Nvml, window_s: float = 1.0,
                    warm_s: float = 0.3, edge_timeout_s: float = 1.0) -> dict:
    """Average power (W) and replay latency (ms) of `replay()` run back to back (module doc)."""
    import torch

    feed = _Feeder(replay, est_ms)
    t_warm = time.perf_counter() + warm_s
    while time.perf_counter() < t_warm:
        feed.step()
    t_a, e_a, polls_a = _edge(nvml, feed.step, edge_timeout_s)
    ev_a, n_a = feed.mark()
    t_min = t_a + window_s
    while time.perf_counter() < t_min:
        feed.step()
    t_b, e_b, polls_b = _edge(nvml, feed.step, edge_timeout_s)
    ev_b, n_b = feed.mark()
    state = nvml.state()          # utilization and clocks of the period that just ran
    torch.cuda.synchronize()
    dt = t_b - t_a
    latency_ms = ev_a.elapsed_time(ev_b) / max(1, n_b - n_a)
    power_w = (e_b - e_a) / 1000.0 / dt if dt > 0 else math.nan
    return {"power_w": power_w, "window_s": dt, "energy_window_mj": e_b - e_a,
            "latency_ms": latency_ms, "replays": n_b - n_a, "polls": polls_a + polls_b,
            "per_event": feed.per_event, "depth": feed.depth, **state}


def idle_power(nvml: Nvml, window_s: float = 2.0, settle_s: float = 2.0) -> dict:
    """Power (W) with nothing running, between two counter edges, after `settle_s`."""
    time.sleep(settle_s)
    nap = lambda: time.sleep(0.0005)  # noqa: E731
    t_a, e_a, _ = _edge(nvml, nap, 2.0)
    time.sleep(window_s)
    t_b, e_b, _ = _edge(nvml, nap, 2.0)
    return {"idle_power_w": (e_b - e_a) / 1000.0 / (t_b - t_a), "window_s": t_b - t_a,
            **nvml.state()}


def capture(fn, copies: int = 1, warmup: int = 3):
    """`fn()` called `copies` times, captured in one CUDA graph (after eager warm-up on a side
    stream, as torch's docs require); returns the graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    return g


def replay_ms(g, n: int = 20) -> float:
    """Mean time of one replay of `g` over `n` replays (CUDA events), after 3 warm ones."""
    import torch

    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n
