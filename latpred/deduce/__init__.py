"""Kernel deduction: what a runtime really dispatches for a graph on a target.

`deduce(graph, target)` is pure and deterministic. On a CPU target each operation is one kernel.
On a GPU target the delegate's rules for the target's runtime version decide which ops run on the
GPU, how convolutions are implemented (Winograd, grouped, plain) and which ops fuse
(`rulesets.py` lists the versions; each rule cites the delegate source it follows).
"""

from __future__ import annotations

import sys

from latpred.deduce.cpu import deduce_cpu
from latpred.deduce.gpu import deduce_gpu
from latpred.deduce.kernel import KERNEL_TYPES, Kernel
from latpred.deduce.rulesets import CPU_RULES, CUDA_RULES, GPU_RULES
from latpred.graph import Graph
from latpred.target import Target, parse_target

__all__ = ["deduce", "Kernel", "KERNEL_TYPES", "GPU_RULES", "CPU_RULES", "CUDA_RULES"]


def deduce(graph: Graph, target: Target | str) -> list[Kernel]:
    """The kernels `target`'s runtime executes for `graph`, in execution order.

    Every operation of the graph belongs to exactly one kernel, or to the kernels of one
    multi-kernel lowering (a Winograd convolution's three stages, a grouped convolution's
    split/convolutions/concat), whose `part` fields are then set.
    """
    if isinstance(target, str):
        target = parse_target(target)
    if target.processor == "cuda":
        from latpred.deduce.cuda import deduce_cuda

        return deduce_cuda(graph, CUDA_RULES[target.device.cuda.rules])
    if target.processor == "gpu":
        return deduce_gpu(graph, target)
    return deduce_cpu(graph, CPU_RULES[target.device.cpu_rules], target.precision)


class _CallablePackage(type(sys.modules[__name__])):
    """`latpred.deduce(graph, target)` works whichever object the name is bound to.

    The public API documents `latpred.deduce` as a function, but importing this package (which
    `latpred.predictors` and others do) makes the import system bind the name `deduce` on
    `latpred` to the package itself. Making the package callable keeps both meanings working.
    """

    def __call__(self, graph: Graph, target: Target | str) -> list[Kernel]:
        return deduce(graph, target)


sys.modules[__name__].__class__ = _CallablePackage
