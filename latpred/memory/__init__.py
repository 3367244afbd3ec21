"""Peak memory per runtime (Augur, section 4.2): weights as stored and as the runtime repacks
them, the activation arena exactly as the runtime plans it, and workspace.

One planner per runtime: `host_cpu` (LiteRT 2.3 on the CPU: TFLite's ArenaPlanner in
`litert_plan`/`arena`, XNNPACK's delegate in `xnnpack`); `cuda` (PyTorch on an NVIDIA GPU,
targets such as h100/cuda/fp16: the caching allocator replayed in `cuda_alloc` over the
allocations `torch_plan` lists); `gpu_delegate` (LiteRT's GPU accelerator, ML Drift, on GPUs it
runs over WebGPU such as h100/gpu/fp16: the delegate's shared buffers as `gpu_assign` packs
them). `measure` and `gpu_measure` read the runtimes' own figures (ground truth).
"""

from __future__ import annotations

from latpred.errors import TargetError
from latpred.graph import Graph
from latpred.memory.prediction import MemoryPrediction, OpMemory
from latpred.memory.xnnpack_configs import for_cpu

__all__ = ["predict_memory", "MemoryPrediction", "OpMemory", "naive_sum", "largest_layer",
           "memory_totals", "predict_many_with_memory", "for_cpu"]


def _check_target(target):
    """The Target for `target`, if this package has a planner for its runtime."""
    from latpred.target import Target, parse_target

    t = target if isinstance(target, Target) else parse_target(str(target))
    if t.processor == "cuda" and t.runtime == "pytorch-cuda":
        if t.precision not in ("fp16", "fp32"):
            raise TargetError(f"Memory prediction on CUDA covers fp16 and fp32, not {t}.")
        return t
    if t.processor == "gpu" and t.device.gpu.api == "webgpu":
        return t
    if t.processor != "cpu" or t.runtime != "litert":
        why = (f"its runtime ({t.runtime}) plans the arena and XNNPACK's workspace by its own "
               f"version's rules, which latpred has not measured" if t.processor == "cpu" else
               "the OpenCL delegate phones run plans textures by other rules")
        raise TargetError(f"Memory prediction covers LiteRT on the CPU (e.g. host/cpu/fp32/t1), "
                          f"LiteRT's GPU accelerator over WebGPU (h100/gpu/fp16) and PyTorch on "
                          f"CUDA (e.g. h100/cuda/fp16) so far, not {t}: {why}.")
    return t


def predict_memory(graph: Graph, target, kernels: str | None = None,
                   model_bytes: int | None = None) -> MemoryPrediction:
    """Peak memory of `graph` on `target` (a Target or a target string).

    `kernels`: "xnnpack" (default: what LiteRT uses on the CPU) or "builtin" (TFLite's own
    kernels, no delegate). `model_bytes`: the .tflite file's size when known (else estimated).
    A float graph on an int8 target is planned as the int8 model latpred writes of it.
    On a CUDA target (`pytorch-cuda`) both are ignored: the prediction is the peak
    `torch.cuda.max_memory_allocated` of loading `latpred.pytorch.to_torch`'s module and one
    inference at the target's batch and precision (`latpred.memory.cuda`).
    """
    t = _check_target(target)
    if t.processor == "gpu":
        from latpred.memory.gpu_delegate import predict_gpu_delegate

        return predict_gpu_delegate(graph, t, model_bytes)
    if t.processor == "cuda":
        from latpred.memory.cuda import predict_cuda

        return predict_cuda(graph, t)
    from latpred.memory.host_cpu import for_precision, predict_host_cpu

    return predict_host_cpu(for_precision(graph, t.precision), str(t), kernels or "xnnpack",
                            model_bytes)


def naive_sum(graph: Graph) -> int:
    """Baseline: every tensor's bytes added up (weights and all activations at once)."""
    return sum(t.nbytes for t in graph.tensors)


def largest_layer(graph: Graph) -> int:
    """Baseline: all weights plus the largest op's inputs and outputs (one layer at a time)."""
    weights = sum(t.nbytes for t in graph.tensors if t.is_constant)
    widest = max((sum(graph.tensors[t].nbytes for t in (*op.inputs, *op.outputs)
                      if t >= 0 and not graph.tensors[t].is_constant) for op in graph.ops),
                 default=0)
    return weights + widest


def memory_totals(graphs, target="host/cpu/fp32/t1", kernels: str = "xnnpack"):
    """Peak bytes of each graph (the `predict_memory` totals, without per-op rows)."""
    from latpred.memory.fast import memory_totals as run

    return run(graphs, target, kernels)


def predict_many_with_memory(model, graphs, *, kernels: str = "xnnpack",
                             allow_fallback: bool = False):
    """(latency predictions, peak bytes array) for `graphs` in one call."""
    from latpred.memory.fast import predict_many_with_memory as run

    return run(model, graphs, kernels=kernels, allow_fallback=allow_fallback)
