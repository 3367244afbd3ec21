"""The `pytorch-cuda` measurer: a latpred Graph as a PyTorch module on an NVIDIA GPU.

Runs on a machine with CUDA (the device machine; see shared/device-gpu.md). For one graph and a
CUDA target (`h100/cuda/fp16`, `h100/cuda/fp32/b32`):

1. the module (`latpred.pytorch.to_torch`, batch from the target, random weights) in the target's
   precision on the GPU, inputs NHWC (= channels_last NCHW), `torch.no_grad()`;
2. end to end: `warmup` eager calls; `capture_warmup` calls on a side stream; one forward
   captured in a `torch.cuda.CUDAGraph`; `replay_warmup` replays; then `passes` passes of
   `replays` replays each between two CUDA events, `sleep_s` apart. The latency is the median
   of the passes' per-replay means; the spread is (max - min) / median of the passes;
3. kernels: `profile_runs` eager forwards under `torch.profiler` (CUPTI) with every op in a
   `record_function` range, each CUDA kernel mapped to the op whose range launched it (through
   the launch's correlation id); then `profile_replays` graph replays under the profiler, whose
   kernels are the captured forward's: when they are the eager list's kernels (in order, or
   reordered and matched by name: `match_replay`), each kernel's in-context time is its median
   over the replays (`kernel_source` "replay" / "replay-matched"), else its median over the
   eager runs ("eager"). A run's time is split among the kernels running at each instant
   (`exclusive_us`: cuDNN runs a grouped convolution's kernels side by side), so a model's
   kernel times add up to its GPU busy time. Several models share one profiler session
   (`measure_many`), whose start and stop cost more than a small model's runs.

`measure(graph, target, protocol)` / `measure_many(graphs, ...)` return JSON-ready dicts; `environment()` the torch, CUDA,
cuDNN versions, GPU name and clocks a manifest records.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

from latpred.graph import Graph


@dataclass(frozen=True)
class CudaProtocol:
    """How one model is timed (see the module docstring)."""

    warmup: int = 20
    capture_warmup: int = 3
    replay_warmup: int = 50
    passes: int = 5
    replays: int = 200
    sleep_s: float = 0.01
    profile_runs: int = 2
    profile_replays: int = 3


_DTYPES = {"fp16": "float16", "fp32": "float32"}


def environment() -> dict:
    """Versions and GPU facts for a manifest (torch, CUDA, cuDNN, GPU name, clocks, flags)."""
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(),
           "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
           "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
           "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1))
    env.update(clocks())
    return env


def clocks() -> dict:
    """The GPU's current and maximum SM / memory clocks (MHz) and power from NVML, if present."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        out = {"sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
               "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
               "sm_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
               "mem_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
               "driver": nv.nvmlSystemGetDriverVersion(),
               "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0}
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}
    except Exception as err:   # NVML is optional: no clocks rather than no measurement
        return {"nvml_error": str(err)[:200]}


def prepare(graph: Graph, target, seed: int | None = None):
    """The module on the GPU in the target's precision, and its inputs (NHWC, contiguous)."""
    import torch

    from latpred.pytorch import to_torch

    dtype = getattr(torch, _DTYPES[target.precision])
    module = to_torch(graph, batch=target.batch, seed=seed).eval().to("cuda", dtype)
    inputs = [torch.randn(s, device="cuda", dtype=dtype) for s in module.input_shapes()]
    return module, inputs


def time_replay(module, inputs, protocol: CudaProtocol) -> tuple[dict, object]:
    """End-to-end timing by CUDA-graph replay; returns the figures and the captured graph."""
    import torch

    for _ in range(protocol.warmup):
        module(*inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(protocol.capture_warmup):
            module(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        module(*inputs)
    for _ in range(protocol.replay_warmup):
        cuda_graph.replay()
    torch.cuda.synchronize()
    passes = []
    for _ in range(protocol.passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(protocol.replays):
            cuda_graph.replay()
        end.record()
        end.synchronize()
        passes.append(start.elapsed_time(end) / protocol.replays)
        time.sleep(protocol.sleep_s)
    med = statistics.median(passes)
    q = statistics.quantiles(passes, n=4) if len(passes) > 1 else [med, med, med]
    return {"latency_ms": med, "latency_iqr_ms": q[2] - q[0], "latency_min_ms": min(passes),
            "spread": (max(passes) - min(passes)) / med if med > 0 else 0.0,
            "passes_ms": passes, "n_runs": protocol.passes * protocol.replays}, cuda_graph


def _trace(fn) -> dict:
    """Run `fn` under torch.profiler (CPU + CUDA) and return the Chrome trace as a dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def _gpu_kernels(evs: list[dict]) -> list[dict]:
    kernels = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(kernels, key=lambda e: e["ts"])


def _ranges(evs: list[dict], pattern) -> list[tuple[float, float, tuple]]:
    """Sorted (start, end, groups) of the user ranges whose name matches `pattern`."""
    out = []
    for e in evs:
        if e.get("cat") == "user_annotation":
            m = pattern.match(e["name"])
            if m:
                out.append((e["ts"], e["ts"] + e["dur"], m.groups()))
    return sorted(out)


def _find(ranges: list[tuple[float, float, tuple]], starts: list[float], ts: float):
    """The groups of the latest-starting range of `ranges` if it holds `ts`, else None (ranges
    of one kind do not nest)."""
    j = bisect.bisect_right(starts, ts) - 1
    if j >= 0 and ts <= ranges[j][1]:
        return ranges[j][2]
    return None


_RUN = re.compile(r"latpred_model(\d+)_run(\d+)$")
_REPLAY = re.compile(r"latpred_model(\d+)_replay$")


def attribute(trace: dict, n_models: int, n_runs: int) -> tuple[list, list]:
    """Kernels of a profiled group of models, from the Chrome trace of `_trace`.

    Returns (eager, replay): `eager[k][r]` lists model k's kernels of eager run r in order as
    (op index, kernel name, duration us, start us); `replay[k]` lists (name, duration us,
    start us) of the kernels its graph replays ran. A kernel belongs to the range, on the CPU, around the runtime call
    that launched it (matched by correlation id): the innermost `latpred_op<i>` range gives its
    op (-1 outside every op).
    """
    from latpred.pytorch import RANGE_PREFIX

    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ops = _ranges(evs, re.compile(rf"{RANGE_PREFIX}(\d+):"))
    runs, replays = _ranges(evs, _RUN), _ranges(evs, _REPLAY)
    op_starts, run_starts = [r[0] for r in ops], [r[0] for r in runs]
    replay_starts = [r[0] for r in replays]
    launch = {e["args"].get("correlation"): e["ts"] for e in evs
              if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    eager = [[[] for _ in range(n_runs)] for _ in range(n_models)]
    replay: list[list] = [[] for _ in range(n_models)]
    for k in _gpu_kernels(evs):
        ts = launch.get(k.get("args", {}).get("correlation"))
        if ts is None:
            continue
        g = _find(runs, run_starts, ts)
        if g is not None:
            op = _find(ops, op_starts, ts)
            eager[int(g[0])][int(g[1])].append((int(op[0]) if op else -1, k["name"],
                                                float(k["dur"]), float(k["ts"])))
            continue
        g = _find(replays, replay_starts, ts)
        if g is not None:
            replay[int(g[0])].append((k["name"], float(k["dur"]), float(k["ts"])))
    return eager, replay


def exclusive_us(spans: list[tuple[float, float]]) -> list[float]:
    """Each kernel's share of the GPU's busy time, from (duration us, start us) pairs in any
    order: every instant is split equally among the kernels running then, so the shares add
    up to the time at least one kernel ran.

    Kernels overlap when a library forks work onto its own streams: cuDNN runs a grouped
    convolution's per-group kernels side by side (on the H100 a synthetic model's replayed
    kernels added up to 0.33 ms in a 0.23 ms replay); summing their durations would count the
    op's time several times. Kernels that run alone keep their duration."""
    edges = sorted({t for d, s in spans for t in (s, s + d)})
    order = sorted(range(len(spans)), key=lambda i: spans[i][1])
    shares = [0.0] * len(spans)
    active: list[int] = []
    nxt = 0
    for lo, hi in zip(edges, edges[1:]):
        while nxt < len(order) and spans[order[nxt]][1] <= lo:
            active.append(order[nxt])
            nxt += 1
        active = [i for i in active if spans[i][1] + spans[i][0] > lo]
        for i in active:
            shares[i] += (hi - lo) / len(active)
    return shares


def _times(spans: list[tuple]) -> list[float]:
    """Per-kernel times of one run from (duration,) or (duration, start) tuples."""
    if spans and len(spans[0]) == 2:
        return exclusive_us(spans)
    return [t[0] for t in spans]


# The same memset node as the eager runs' "Memset (Device)" is named "memset32" (or 8/16)
# when a CUDA graph replays it (seen on the H100, torch 2.11 / CUDA 13.0).
_MEMSET = re.compile(r"memset(8|16|32)$")


def _kernel_name(name: str) -> str:
    return "Memset (Device)" if _MEMSET.match(name) else name


def match_replay(ref: list[str], replayed: list[str]) -> list[int] | None:
    """For each kernel of one replay, the index of the eager kernel it is, or None when the
    two lists are not the same kernels.

    A replay runs the captured forward's kernels, but the profiler lists them by start time,
    and a graph may start independent kernels in another order than the eager stream did:
    cuDNN's grouped convolutions (the slice, pad and per-group GEMM kernels of one op) were
    seen reordered in 250 of 416 RegNet models. Each replayed kernel is matched to the
    earliest eager kernel of the same name not yet matched: kernels of earlier ops are all
    matched before a reordered op's, so a kernel finds its own op's twin."""
    if len(ref) != len(replayed):
        return None
    waiting: dict[str, list[int]] = {}
    for i in reversed(range(len(ref))):
        waiting.setdefault(_kernel_name(ref[i]), []).append(i)
    order = []
    for name in replayed:
        stack = waiting.get(_kernel_name(name))
        if not stack:
            return None
        order.append(stack.pop())
    return order


def kernel_figures(runs: list, replayed: list, n_replays: int) -> dict:
    """Per kernel of one model: op, name and in-context time (see the module docstring).

    `runs`: eager runs as lists of (op, name, duration us[, start us]); `replayed`: the
    replays' kernels one after the other as (name, duration us[, start us]). A kernel's time
    is its exclusive share (`exclusive_us`) when starts are known, its median over the runs
    used. `kernel_source` says which: "replay" (the replayed list is the eager one, in order),
    "replay-matched" (the same kernels in another order, matched by name: `match_replay`) or
    "eager" (the lists differ: the eager runs' times). `overlap_ms`: how much the used runs'
    kernel durations exceed their busy time (median), i.e. time spent side by side."""
    ref = runs[-1]
    n = len(ref)
    result = {"kernel_source": "eager", "eager_counts": [len(r) for r in runs],
              "replay_kernel_count": len(replayed) // max(1, n_replays), "kernels": []}
    chosen = [[k[2:] for k in run] for run in runs if len(run) == n]
    orders = None
    names = [k[1] for k in ref]
    if n and len(replayed) == n * n_replays:
        orders = [match_replay(names, [k[0] for k in replayed[r * n:(r + 1) * n]])
                  for r in range(n_replays)]
        if all(o is not None for o in orders):
            chosen = []
            for r, order in enumerate(orders):
                spans: list = [None] * n
                for j, i in enumerate(order):
                    spans[i] = replayed[r * n + j][1:]
                chosen.append(spans)
            same = all(o == list(range(n)) for o in orders)
            result["kernel_source"] = "replay" if same else "replay-matched"
    use = [_times(spans) for spans in chosen]
    for j, (op, name, *_) in enumerate(ref):
        result["kernels"].append([op, name, statistics.median(d[j] for d in use)])
    result["gpu_time_ms"] = sum(k[2] for k in result["kernels"]) / 1000.0
    result["overlap_ms"] = statistics.median(
        sum(s[0] for s in spans) - sum(t) for spans, t in zip(chosen, use)) / 1000.0
    return result


def profile_group(prepared: list, protocol: CudaProtocol) -> list[dict]:
    """Kernels of several prepared models in one profiler session (its start and stop cost
    more than a small model's runs): `prepared` holds (module, inputs, cuda_graph)."""
    from torch.profiler import record_function

    def work():
        for k, (module, inputs, cuda_graph) in enumerate(prepared):
            module.annotate = True
            try:
                for r in range(protocol.profile_runs):
                    with record_function(f"latpred_model{k}_run{r}"):
                        module(*inputs)
            finally:
                module.annotate = False
            if cuda_graph is not None and protocol.profile_replays:
                with record_function(f"latpred_model{k}_replay"):
                    for _ in range(protocol.profile_replays):
                        cuda_graph.replay()

    eager, replay = attribute(_trace(work), len(prepared), protocol.profile_runs)
    return [kernel_figures(e, r, protocol.profile_replays) for e, r in zip(eager, replay)]


def measure_many(graphs: list[Graph], target, protocol: CudaProtocol = CudaProtocol(),
                 kernels: bool = True) -> list[dict]:
    """Models of one target: each timed by replay, then all profiled in one session.

    A model that fails is a row with status "failed" and the error; the others go on.
    """
    import torch

    rows: list[dict] = []
    prepared: list = []
    with torch.no_grad():
        for graph in graphs:
            t0 = time.perf_counter()
            try:
                module, inputs = prepare(graph, target)
                e2e, cuda_graph = time_replay(module, inputs, protocol)
            except Exception as err:   # one bad model must not end a campaign
                rows.append({"status": "failed", "error": f"{type(err).__name__}: {err}"[:500]})
                torch.cuda.empty_cache()
                continue
            rows.append({"status": "ok", **e2e, "clocks": clocks(),
                         "time_s": round(time.perf_counter() - t0, 3)})
            prepared.append((len(rows) - 1, (module, inputs, cuda_graph)))
        if kernels and prepared:
            t0 = time.perf_counter()
            try:
                figures = profile_group([p for _, p in prepared], protocol)
                for (i, _), fig in zip(prepared, figures):
                    rows[i].update(fig, profile_s=round((time.perf_counter() - t0)
                                                        / len(prepared), 3))
            except Exception as err:
                for i, _ in prepared:
                    rows[i]["kernel_error"] = f"{type(err).__name__}: {err}"[:500]
    del prepared
    torch.cuda.empty_cache()
    return rows


def measure(graph: Graph, target, protocol: CudaProtocol = CudaProtocol(),
            kernels: bool = True) -> dict:
    """One model on one CUDA target: end-to-end figures, kernels per op, clocks after timing."""
    return measure_many([graph], target, protocol, kernels)[0]


def protocol_dict(protocol: CudaProtocol) -> dict:
    return asdict(protocol)


def write_jsonl_gz(path: str, rows) -> None:
    """Rows as gzipped JSON lines (what a campaign brings back from the device)."""
    with gzip.open(path, "at") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
