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
   reordered and matched by name: `cuda_trace.match_replay`), each kernel's in-context time
   is its median over the replays (`kernel_source` "replay" / "replay-matched"), else its
   median over the eager runs ("eager"). A run's time is split among the kernels running at
   each instant (`cuda_trace.exclusive_us`: cuDNN runs a grouped convolution's kernels side by
   side), so a model's kernel times add up to its GPU busy time. Several models share one
   profiler session (`measure_many`), whose start and stop cost more than a small model's runs.

`measure(graph, target, protocol)` / `measure_many(graphs, ...)` return JSON-ready dicts;
`environment()` the torch, CUDA, cuDNN versions, GPU name and clocks a manifest records.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

from latpred.graph import Graph
from latpred.profile.cuda_trace import attribute, kernel_figures


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
