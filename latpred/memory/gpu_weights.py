"""What LiteRT's GPU accelerator (ML Drift) holds of a model's weights, per fused node.

- **Constant tensors** (`constant_bytes`, the accelerator's reported constant memory; measured
  on the H100, `datasets/h100-gpu-memory`): fully-connected weights and biases, and a Winograd
  convolution's transformed weights, laid out for the matmul kernel that reads them.
- **Kernel arguments** (`weight_bytes`, estimated, not reported by the accelerator): the
  other convolutions' weights and biases travel with their kernels.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

from latpred.deduce.fusion import GpuNode
from latpred.deduce.optypes import bhwc, conv_groups
from latpred.device_profile import GpuSpec
from latpred.graph import Graph
from latpred.memory.arena import align_up
from latpred.memory.gpu_compiled import GROUP_CONV, group_code

ELEMENT_BYTES = {"fp16": 2, "fp32": 4}
CONSTANT_TYPES = frozenset({"winograd_matmul", "fc"})    # the nodes `constant_bytes` counts
# the nodes whose convolutions hold their weights as kernel arguments (`weight_bytes`)
KERNEL_WEIGHT_TYPES = frozenset({"conv2d", "dwconv2d", "thin_pointwise", "grouped_conv2d"})
_CONVOLUTIONS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})


def groups_of(graph: Graph, node: GpuNode, op) -> int:
    """How many groups share `op`'s weights in `node`: a resolved grouped convolution's
    per-group node holds one group's slice (ResolveGroupedConvolution: each group's
    convolution gets weights OHWI(dst_group_size, kh, kw, src_group_size) and a bias of
    dst_group_size, where groups = input channels / the weights' I; google-ai-edge/LiteRT
    ml_drift_delegate/tflite/convert/convert_conv.cc @ 924eb524); 1 for any other node."""
    return conv_groups(graph, op) if group_code(node.part) == GROUP_CONV else 1


def constant_bytes(graph: Graph, node: GpuNode, precision: str, gpu: GpuSpec) -> int:
    """The constant tensors the accelerator allocates for one fused node."""
    e = ELEMENT_BYTES[precision]
    op = graph.ops[node.ops[0]]
    total = 0
    if node.type == "winograd_matmul":
        o, _, _, i = graph.tensors[op.inputs[1]].shape
        o //= groups_of(graph, node, op)
        b, h, w, _ = bhwc(graph.tensors[op.outputs[0]].shape)
        group = winograd_output_group(gpu, b * -(-h // 4) * -(-w // 4), o)
        total += 36 * align_up(i, 4) * align_up(o, 4 * group) * e
    elif node.type == "fc" and len(op.inputs) > 1:   # also a 1x1 CONV_2D on a small map
        w = graph.tensors[op.inputs[1]].shape
        o, i = w[0] // groups_of(graph, node, op), w[-1]
        # a bias only where the op has one: the accelerator adds no zeros (the MobileNetV2
        # fixture's bias-less classifier, 1280 x 100, holds 1280 x 100 elements)
        has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
        total += (align_up(i, 4) * align_up(o, 4) + align_up(o, 4) * has_bias) * e
    # Element-wise ops' constant operands are not counted: with them, 146 readings of the
    # synthetic, converter and zoo models planned the constants a few dozen to 800 bytes high
    # (exact on 1,568 of 1,720 readings), without them on 1,714 (session 29). Those operands
    # were scalars and per-channel vectors; a full-size constant operand was never measured.
    return total


def winograd_output_group(gpu: GpuSpec, tiles: int, cout: int) -> int:
    """The output slices (4 channels each) one thread of a Winograd convolution's matmul
    computes (ConvGeneric's block_size.w): its transformed weights pad the output channels to
    a multiple of 4 x this (WeightsLayout kOSpatialIOGroupI4O4, output_group_size =
    block_size.w; ml_drift/common/task/weights_conversion.cc @ 5e6f42e4).

    On NVIDIA (google-ai-edge/ml-drift ml_drift/common/kernels/conv_generic.cc @ 0b521cc1,
    GetKernelParamsNvidia, reached from CreateConvGenericExternalWeights for the matmul of
    GpuModelBuilder::WinoConvolution, whose destination is (b, 36, tiles, cout)): a block of
    2 x 1 x 4, w halved to 2 or 1 for few dst slices, then halved again where the task gives a
    compute unit fewer than 4, then 2, warps of 32 threads. ML Drift counts 132 compute units
    on an H100 or H200 (ml_drift/common/gpu_info.cc @ 42f5ec52). Measured (session 30): 100
    output channels stay 100 on a 32x32 output (64 tiles) and become 112 on 56x56 (196).
    Other vendors' kernel parameters are not modelled: output channels aligned to 4."""
    slices = -(-cout // 4)
    if gpu.vendor != "nvidia" or not gpu.compute_units:
        return 1
    group = 4 if slices % 4 == 0 or slices >= 8 else 2 if slices % 2 == 0 or slices >= 4 \
        else slices
    warps = tiles * 36 * slices / gpu.compute_units / (2 * group) / 32
    if warps < 4 and group >= 4:
        group //= 2
    if warps < 2 and group >= 2:
        group //= 2
    return group


def weight_bytes(graph: Graph, nodes: Sequence[GpuNode], precision: str, gpu: GpuSpec
                 ) -> tuple[int, int]:
    """(kernel arguments, constants) of the nodes' weights. Kernel arguments (estimated: the
    accelerator does not report them) are the convolution kernels' own weights and biases,
    channels aligned to 4; a convolution run as fully connected or Winograd holds constants
    instead (`constant_bytes`). A thin pointwise chain holds its steps' weights, so the totals
    are the same before and after chains are joined; a resolved grouped convolution's groups
    hold a slice each (`groups_of`)."""
    ops, tensors = graph.ops, graph.tensors
    packed = constant = 0    # packed in elements ((n + 3) & ~3 is align_up(n, 4))
    for node in nodes:
        if node.type in CONSTANT_TYPES:
            constant += constant_bytes(graph, node, precision, gpu)
        elif node.type in KERNEL_WEIGHT_TYPES:
            for i in node.ops:
                op = ops[i]
                if op.type in _CONVOLUTIONS and len(op.inputs) > 1:
                    ins = op.inputs
                    o, kh, kw, c = tensors[ins[1]].shape
                    groups = groups_of(graph, node, op)
                    packed += o // groups * kh * kw * ((c + 3) & ~3)
                    if len(ins) > 2 and ins[2] >= 0:
                        packed += (prod(tensors[ins[2]].shape) // groups + 3) & ~3
    return packed * ELEMENT_BYTES[precision], constant
