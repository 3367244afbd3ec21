"""The unit of latency: one kernel the runtime dispatches."""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_PREFIX = "builtin_"
# Kernel types latpred knows. A regressor is trained per kernel type and target.
KERNEL_TYPES = (
    "conv2d", "grouped_conv2d", "dwconv2d",
    # A depthwise convolution XNNPACK runs as a grouped IGEMM instead of a depthwise microkernel
    # (more than 25 taps, or a depth multiplier above 1: `CpuRuleSet.dwconv_max_taps`); in int8
    # it is ~15x the fp32 time, where the depthwise microkernels run at about one speed in both.
    # It has dwconv2d's features.
    "dwconv2d_igemm",
    "winograd_input_transform", "winograd_matmul", "winograd_output_transform",
    "fc", "batch_matmul", "pool", "mean", "concat", "split", "pad", "elementwise",
    "activation", "softmax", "reshape", "transpose", "strided_slice", "quantize", "shape",
    "gather", "other",
) + tuple(BUILTIN_PREFIX + t for t in (
    # A quantized op the XNNPACK delegate declines (`xnnpack_int8.declined`) runs as TFLite's
    # own integer kernel, another implementation with another cost (int8 RELU / HARD_SWISH /
    # AVERAGE_POOL_2D: 10-46x XNNPACK's fp32 time on the host), so it is a type of its own with
    # the features of its base type (builtin_activation: without the shape's dims,
    # features.kernel).
    "conv2d", "grouped_conv2d", "dwconv2d", "fc", "pool", "concat", "split", "elementwise",
    "activation", "softmax"))


# Kernel types that are another implementation of a base type's op, with its features.
_VARIANT_OF = {"dwconv2d_igemm": "dwconv2d"}


def base_type(kernel_type: str) -> str:
    """The kernel type whose features a type has: `builtin_pool` -> `pool`, `dwconv2d_igemm`
    -> `dwconv2d`."""
    t = kernel_type.removeprefix(BUILTIN_PREFIX)
    return _VARIANT_OF.get(t, t)


@dataclass(frozen=True)
class Kernel:
    """One dispatched kernel.

    - `type`: one of KERNEL_TYPES.
    - `ops`: indices (into Graph.ops) of the operations fused into this kernel, in order; the
      first is the one the kernel's features come from (`main_op`), the rest were linked into
      it (activations, element-wise ops) by the GPU delegate's fusion. On CPU, one op only.
    - `device`: where it runs: "gpu" or "cpu" (a GPU model falls back to CPU for ops the
      delegate does not support).
    - `rule`: one human sentence saying which rule decided the kernel type, for `inspect`.
    - `multithreaded`: on CPU, whether TFLite spreads this op over threads.
    - `part`: for kernels that are one stage of a multi-kernel lowering (Winograd), the stage
      name; empty otherwise.
    """

    type: str
    ops: tuple[int, ...]
    device: str = "cpu"
    rule: str = ""
    multithreaded: bool = False
    part: str = ""

    @property
    def main_op(self) -> int:
        return self.ops[0]

    @property
    def fused_ops(self) -> tuple[int, ...]:
        return self.ops[1:]
