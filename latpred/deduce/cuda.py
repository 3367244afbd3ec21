"""The `pytorch-cuda` path: what PyTorch eager launches for each op on cuDNN / cuBLAS.

latpred's PyTorch runtime (`latpred.pytorch`) runs a graph op by op, in NHWC (= channels_last)
memory, without fusing across ops. Each op launches its own CUDA kernels, listed by
`launches(graph, index)` as kinds, in order (read off `torch.profiler` kernel lists of PyTorch
2.11 / cuDNN 9.19 on the H100, datasets/h100-cuda-*):

- CONV_2D: the convolution (cuDNN implicit GEMM `sm80_xmma_fprop_*`, or an `nvjet` GEMM for
  1x1 convolutions), the bias as a separate broadcast add (`elementwise_kernel<CUDAFunctor_add>`:
  F.conv2d with cuDNN does not fuse it), the fused activation as its own in-place kernel
  (`clamp` for RELU/RELU6). cuDNN's heuristics sometimes add a `Memset` or a second conv kernel
  (split-K), and for grouped convolutions layout transforms (`tensorTransformGeneric`) or one
  kernel per group: `variable` ops.
- DEPTHWISE_CONV_2D: `conv2d_c1_k1_nhwc` (one kernel), bias add, activation.
- FULLY_CONNECTED: one cuBLAS GEMM with the bias in its epilogue (addmm), activation.
- pools, MEAN (a `reduce_kernel`, sometimes after a `Memset`), SOFTMAX, element-wise ops and
  standalone activations: one kernel (+ the fused activation); CONCATENATION: one
  `CatArrayBatchedCopy`; TRANSPOSE: one copy; SPLIT / SPLIT_V: one copy per part that is not
  contiguous in NHWC memory (a split along any axis but the first non-unit one).
- RESHAPE (and SQUEEZE / EXPAND_DIMS) of a contiguous tensor is a view: no kernel. latpred's
  Kernel is a unit with a latency, so such an op joins the kernel of its first reader (its
  producer's when no op reads it): `Kernel.ops` = (reader, view op).

`deduce_cuda(graph, target)` gives one latpred Kernel per op that launches anything, in order;
its latency is the sum of the CUDA kernels its ops launch, and `Kernel.rule` lists them.
"""

from __future__ import annotations

from latpred.deduce.kernel import Kernel
from latpred.deduce.optypes import conv_groups, kernel_type
from latpred.deduce.rulesets import CudaRuleSet
from latpred.graph import Graph, Op

VIEW_OPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})
# Op types whose kernel lists cuDNN's heuristics vary (Memset, split-K, transforms).
VARIABLE_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "MEAN"})
_ONE = {"AVERAGE_POOL_2D": "pool", "MAX_POOL_2D": "pool", "MEAN": "reduce",
        "CONCATENATION": "cat", "TRANSPOSE": "copy", "PAD": "pad", "PADV2": "pad",
        "SOFTMAX": "softmax", "BATCH_MATMUL": "gemm", "GELU": "activation",
        "LEAKY_RELU": "activation"}


def _has_bias(op: Op) -> bool:
    return len(op.inputs) > 2 and op.inputs[2] >= 0


def _act(op: Op) -> tuple[str, ...]:
    return ("activation",) if op.activation != "NONE" else ()


def _split_parts(graph: Graph, op: Op) -> int:
    """Copies a split launches: one per part unless the parts are contiguous slices."""
    data = op.inputs[1] if op.type == "SPLIT" else op.inputs[0]
    shape = graph.tensors[data].shape
    out = graph.tensors[op.outputs[0]].shape
    axis = next((d for d, (a, b) in enumerate(zip(shape, out)) if a != b), 0)
    contiguous = all(s == 1 for s in shape[:axis])
    return 0 if contiguous else len(op.outputs)


def launches(graph: Graph, index: int) -> tuple[str, ...]:
    """The CUDA kernels (kinds) PyTorch eager launches for op `index`, in order (the usual
    list; for VARIABLE_OPS cuDNN may add memsets, split-K or layout-transform kernels)."""
    op = graph.ops[index]
    t = op.type
    if t in VIEW_OPS:
        return ()
    if t == "CONV_2D":
        main = "grouped_conv" if conv_groups(graph, op) > 1 else "conv"
        return (main,) + (("bias",) if _has_bias(op) else ()) + _act(op)
    if t == "DEPTHWISE_CONV_2D":
        return ("dwconv",) + (("bias",) if _has_bias(op) else ()) + _act(op)
    if t == "FULLY_CONNECTED":
        return ("gemm",) + _act(op)
    if t in ("SPLIT", "SPLIT_V"):
        return ("copy",) * _split_parts(graph, op)
    if t == "STRIDED_SLICE":
        return ("copy",)
    if t == "SOFTMAX" and float(op.attr("beta", 1.0)) != 1.0:
        return ("elementwise", "softmax")
    if t in _ONE:
        return (_ONE[t],) + _act(op)
    if t == "SQUARED_DIFFERENCE":
        return ("elementwise", "elementwise")
    return ("elementwise",) + _act(op)


def deduce_cuda(graph: Graph, rules: CudaRuleSet) -> list[Kernel]:
    """One Kernel per op that launches CUDA kernels; view ops join a neighbour's kernel."""
    counts = [launches(graph, i) for i in range(len(graph.ops))]
    host: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        if counts[i]:
            continue
        readers = [j for t in op.outputs for j in graph.consumers.get(t, ())]
        target = _launching(graph, counts, min(readers), forward=True) if readers else None
        if target is None:
            prod = graph.producers.get(op.inputs[0])
            target = _launching(graph, counts, prod, forward=False) if prod is not None else None
        if target is not None:
            host[i] = target
    members: dict[int, list[int]] = {}
    for i, t in host.items():
        members.setdefault(t, []).append(i)
    kernels = []
    for i, op in enumerate(graph.ops):
        if i in host:
            continue
        ops = (i, *sorted(members.get(i, ())))
        listed = " + ".join(counts[i]) or "no kernel (a view)"
        extra = "".join(f", with the view {graph.ops[j].type} (op {j})" for j in ops[1:])
        rule = f"{kernel_type(graph, op)}: {op.type} launches {listed}{extra} ({rules.label})"
        kernels.append(Kernel(kernel_type(graph, op), ops, "gpu", rule))
    return kernels


def _launching(graph: Graph, counts, j: int, forward: bool) -> int | None:
    """The nearest op from `j` (along readers or producers) that launches a kernel."""
    seen = 0
    while j is not None and seen < len(graph.ops):
        if counts[j]:
            return j
        seen += 1
        op = graph.ops[j]
        if forward:
            readers = [k for t in op.outputs for k in graph.consumers.get(t, ())]
            j = min(readers) if readers else None
        else:
            j = graph.producers.get(op.inputs[0])
    return None
