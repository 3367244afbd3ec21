"""ML Drift's thin pointwise chains: which fused nodes can be a chain's steps, and the node a
chain becomes.

ThinPointwiseFuser (google-ai-edge/ml-drift ml_drift/common/kernels/special/
thin_pointwise_fuser.cc @ 3220ff1; on for LiteRT's accelerator: its delegate_kernel.cc adds
ModelHints::kAllowSpecialKernels) joins a depthwise or any convolution and the 1x1
convolutions after it into one kernel whose inner tensors are never allocated. Which nodes
join is decided in `gpu_compiled.thin_chains` from the step bytes `thin_step` gives.
"""

from __future__ import annotations

from latpred.deduce.fusion import GpuNode
from latpred.graph import Graph
from latpred.memory.arena import align_up
from latpred.memory.gpu_weights import ELEMENT_BYTES

# The limits of the fuser's branch for NVIDIA and other desktop GPUs. "F16" is the fp16
# target (the builder's precision exactly F16); fp32 takes the other limits.
_THIN = {  # precision -> (dw max channels, dw max C*kh*kw, conv max C_in*kh*kw*C_out)
    "fp16": (32, 3 * 3 * 32, 32 * 32),
    "fp32": (16, 3 * 3 * 16, 16 * 32),
}
_THIN_MAX_OUT = 32           # a conv's output channels
THIN_TYPES = frozenset({"dwconv2d", "conv2d"})   # what a chain's steps can be


def thin_step(graph: Graph, node: GpuNode, first: bool, precision: str) -> int | None:
    """The weight bytes the fuser counts for `node` as a step of a chain, or None if it cannot
    be one (a depthwise only first; later convolutions only 1x1, stride 1)."""
    op = graph.ops[node.ops[0]]
    if node.type not in THIN_TYPES or len(op.inputs) < 2:
        return None
    w = graph.tensors[op.inputs[1]].shape
    # a step's output channels are at most 32 (most convolutions of a model fail here)
    if w[-1 if node.type == "dwconv2d" else 0] > _THIN_MAX_OUT:
        return None
    dw_c, dw_taps, conv_size = _THIN[precision]
    size = ELEMENT_BYTES[precision]
    if node.type == "dwconv2d" and op.type == "DEPTHWISE_CONV_2D" and first:
        c, kh, kw = w[3], w[1], w[2]
        if c > dw_c or c * kh * kw > dw_taps or op.attr("depth_multiplier", 1) != 1:
            return None
        return (align_up(c, 4) + align_up(c, 4) * kh * kw) * size
    if node.type != "conv2d" or op.type != "CONV_2D":
        return None
    o, kh, kw, i = w
    if i * kh * kw * o > conv_size or op.attr("groups", 1) != 1:
        return None
    if not first and ((kh, kw) != (1, 1) or tuple(op.attr("stride", (1, 1))) != (1, 1)):
        return None
    return (align_up(o, 4) + align_up(i, 4) * align_up(o, 4) * kh * kw) * size


def joined(chain: list[GpuNode]) -> GpuNode:
    """The one node a chain becomes: its steps' ops, the inputs from outside the chain, the
    last step's outputs."""
    if len(chain) == 1:
        return chain[0]
    inner = {t for n in chain[:-1] for t in n.outputs}
    ins = tuple(dict.fromkeys(t for n in chain for t in n.inputs if t not in inner))
    return GpuNode("thin_pointwise", tuple(i for n in chain for i in n.ops), ins,
                   chain[-1].outputs, chain[-1].out_shape, False, "ThinPointwiseFuser")
