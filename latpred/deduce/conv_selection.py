"""Convolution kernel selection on the GPU (Algorithm 3.2 of the operation-wise paper).

A CONV_2D becomes a grouped convolution, a Winograd 4x4-to-6x6 convolution (three kernels), a
plain convolution, or, in some runtimes, a fully connected or depthwise kernel. The Winograd
thresholds depend on the GPU vendor and changed across runtime versions; each rule below cites
the delegate source it transcribes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from latpred.deduce.optypes import conv_groups
from latpred.graph import Graph, Op
from latpred.device_profile import GpuSpec

_VENDOR = {"adreno": "Adreno", "mali": "Mali", "powervr": "PowerVR", "apple": "Apple",
           "nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}


@dataclass(frozen=True)
class ConvGeom:
    """The parameters of a CONV_2D that kernel selection reads."""

    batch: int
    in_h: int
    in_w: int
    cin: int
    cout: int
    kh: int
    kw: int
    out_h: int
    out_w: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    padded: bool

    @property
    def src_group_size(self) -> int:
        return self.cin // self.groups

    @property
    def dst_group_size(self) -> int:
        return self.cout // self.groups


def conv_geom(graph: Graph, op: Op) -> ConvGeom:
    n, in_h, in_w, cin = graph.tensors[op.inputs[0]].shape
    cout, kh, kw, _ = graph.tensors[op.inputs[1]].shape
    _, out_h, out_w, _ = graph.tensors[op.outputs[0]].shape
    return ConvGeom(n, in_h, in_w, cin, cout, kh, kw, out_h, out_w,
                    tuple(op.attr("stride", (1, 1))), tuple(op.attr("dilation", (1, 1))),
                    conv_groups(graph, op),
                    op.attr("padding", "VALID") == "SAME" and (kh > 1 or kw > 1))


@dataclass(frozen=True)
class ConvChoice:
    """The kernel(s) one CONV_2D becomes.

    `kind`: "conv2d", "winograd", "grouped_conv2d", "fc", "dwconv2d", or "split_groups" (the
    delegate replaces an unsupported grouped convolution with split + one convolution per group +
    concat; `per_group` is then the choice for each group's convolution).
    """

    kind: str
    rule: str
    per_group: "ConvChoice | None" = None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _suitable_3x3(g: ConvGeom) -> str | None:
    """IsSuitableForWinograd4x4To6x6 (common/winograd_util.cc): why not, or None if suitable."""
    if (g.kh, g.kw) != (3, 3):
        return f"kernel {g.kh}x{g.kw} is not 3x3"
    if g.stride != (1, 1):
        return f"stride {g.stride[0]}x{g.stride[1]} is not 1"
    if g.dilation != (1, 1):
        return f"dilation {g.dilation[0]}x{g.dilation[1]} is not 1"
    if g.groups != 1:
        return f"{g.groups} groups"
    return None


def _verdict(checks: list[tuple[str, int, int]], where: str) -> tuple[bool, str]:
    text = ", ".join(f"{name} {value} {'>=' if value >= need else '<'} {need}"
                     for name, value, need in checks)
    if any(value < need for _, value, need in checks):
        return False, f"conv2d: Winograd not recommended: {text} ({where})"
    return True, f"winograd: {text} ({where})"


def _vendor(gpu: GpuSpec) -> str:
    if gpu.vendor == "adreno" and gpu.generation is not None:
        return f"Adreno {gpu.generation}xx"
    return _VENDOR[gpu.vendor]


def winograd_tflite29(g: ConvGeom, gpu: GpuSpec, label: str) -> tuple[bool, str]:
    """IsRecommendedForWinograd4x4To6x6, TFLite 2.9 era.

    Source: tensorflow/tensorflow tensorflow/lite/delegates/gpu/common/selectors/
    operation_selector.cc @ 02ef3719757952ddccad972679dc245b8f0dbdba (identical in
    google-ai-edge/LiteRT tflite/delegates/gpu/common/selectors/operation_selector.cc @ 106b723c):
    min depth 16/16, Adreno 32/32, AMD dst 8; min tiles 32, Adreno 6xx 128, other Adreno 64;
    tiles = ceil(H/4) * ceil(W/4) of the output. This is Algorithm 3.2 of the paper.
    """
    reason = _suitable_3x3(g)
    if reason:
        return False, f"conv2d: no Winograd, {reason} ({label})"
    min_src, min_dst, min_tiles = 16, 16, 32
    if gpu.vendor == "adreno":
        min_src = min_dst = 32
        min_tiles = 128 if gpu.generation == 6 else 64
    elif gpu.vendor == "amd":
        min_dst = 8
    tiles = _ceil_div(g.out_h, 4) * _ceil_div(g.out_w, 4)
    return _verdict([("src_depth", _ceil_div(g.cin, 4), min_src),
                     ("dst_depth", _ceil_div(g.cout, 4), min_dst),
                     ("total_tiles", tiles, min_tiles)], f"{_vendor(gpu)}, {label}")


def winograd_mldrift(g: ConvGeom, gpu: GpuSpec, label: str) -> tuple[bool, str]:
    """IsRecommendedForWinograd3x3TileNxN with tile 6 (= 4x4 outputs), ML Drift.

    Source: google-ai-edge/ml-drift ml_drift/common/winograd_util.cc @ 512f203d (called from
    GpuModelBuilder::Convolution, ml_drift/common/gpu_model_builder.cc, kTileSize = 6). Changes
    from TFLite 2.9: tiles count the batch; Adreno 3xx needs 32 tiles, 4xx/5xx 64, newer 128;
    PowerVR C/D-series also need src_depth * dst_depth >= 16 * 32.
    """
    reason = _suitable_3x3(g)
    if reason:
        return False, f"conv2d: no Winograd, {reason} ({label})"
    min_src, min_dst, min_tiles = 16, 16, 32
    if gpu.vendor == "adreno":
        min_src = min_dst = 32
        gen = gpu.generation or 6
        min_tiles = 32 if gen == 3 else 64 if gen in (4, 5) else 128
    elif gpu.vendor == "amd":
        min_dst = 8
    src_depth, dst_depth = _ceil_div(g.cin, 4), _ceil_div(g.cout, 4)
    checks = [("src_depth", src_depth, min_src), ("dst_depth", dst_depth, min_dst)]
    if gpu.vendor == "powervr" and gpu.family in ("cxt", "dxt"):
        checks.append(("src_depth*dst_depth", src_depth * dst_depth, 16 * 32))
    tiles = _ceil_div(g.out_h, 4) * _ceil_div(g.out_w, 4) * g.batch
    checks.append(("total_tiles", tiles, min_tiles))
    return _verdict(checks, f"{_vendor(gpu)}, {label}")


WinogradRule = Callable[[ConvGeom, GpuSpec, str], tuple[bool, str]]


def fc_max_pixels(conv_as_fc: bool, gpu: GpuSpec, precision: str) -> int:
    """The most output pixels (batch x height x width) of a 1x1 convolution ML Drift runs as
    fully connected, 0 for a delegate without the rewrite: GpuModelBuilder::Convolution
    (google-ai-edge/ml-drift ml_drift/common/gpu_model_builder.cc @ 48cfed7e) compares it with
    GetRecommendedMaxTotalSpatialSize (kernels/fully_connected.cc): 4, x2 for F16, x2 on a GPU
    other than Mali, x2 on Adreno 7xx and later, at most 16. Measured on the H100 (session 29):
    1x1 to 4x4 maps in fp16, 1x1 and 2x2 in fp32 keep their weights as FC constants."""
    if not conv_as_fc:
        return 0
    limit = 4 * (2 if precision == "fp16" else 1) * (1 if gpu.vendor == "mali" else 2)
    if gpu.vendor == "adreno" and (gpu.generation or 0) >= 7:
        limit *= 2
    return min(limit, 16)


def select_conv(g: ConvGeom, gpu: GpuSpec, winograd: WinogradRule, label: str,
                fc_pixels: int, grouped_as_depthwise: bool) -> ConvChoice:
    """Algorithm 3.2: grouped convolution first, then Winograd, else a plain convolution.

    The grouped-convolution test is the delegate's Conv2DOperationParser: groups whose input and
    output sizes are multiples of 4 run as one grouped kernel, other grouped convolutions are
    replaced by split + per-group convolutions + concat (ResolveGroupedConvolution;
    tensorflow/lite/delegates/gpu/common/model_builder.cc, and the ML Drift frontend in
    google-ai-edge/LiteRT ml_drift_delegate/tflite/model_builder.cc @ 8f02221e, which first turns
    a convolution with one input channel per group and as many outputs as inputs into a
    depthwise convolution).
    """
    if _equivalent_to_fc(g) and g.batch * g.out_h * g.out_w <= fc_pixels:
        # ML Drift's GpuModelBuilder::Convolution runs a 1x1 convolution on a small map as a
        # fully connected kernel (IsConvEquivalentToFullyConnected; `fc_max_pixels`).
        return ConvChoice("fc", f"fc: 1x1 convolution on {g.batch * g.out_h * g.out_w} "
                                f"output pixels, at most {fc_pixels} ({label})")
    if g.groups != 1:
        if grouped_as_depthwise and g.src_group_size == 1 and g.cout == g.cin:
            return ConvChoice("dwconv2d", f"dwconv2d: grouped convolution with one channel per "
                                          f"group runs as depthwise ({label})")
        src_ok, dst_ok = g.src_group_size % 4 == 0, g.dst_group_size % 4 == 0
        sizes = f"src_group_size {g.src_group_size}, dst_group_size {g.dst_group_size}"
        if src_ok and dst_ok:
            return ConvChoice("grouped_conv2d", f"grouped_conv2d: {g.groups} groups, {sizes} "
                                                f"are multiples of 4 ({label})")
        single = ConvGeom(g.batch, g.in_h, g.in_w, g.src_group_size, g.dst_group_size, g.kh,
                          g.kw, g.out_h, g.out_w, g.stride, g.dilation, 1, g.padded)
        per_group = select_conv(single, gpu, winograd, label, fc_pixels, grouped_as_depthwise)
        return ConvChoice("split_groups", f"split + {g.groups} convolutions + concat: {sizes} "
                                          f"not both multiples of 4 ({label})", per_group)
    ok, rule = winograd(g, gpu, label)
    return ConvChoice("winograd" if ok else "conv2d", rule)


def _equivalent_to_fc(g: ConvGeom) -> bool:
    """IsConvEquivalentToFullyConnected: a 1x1 kernel, stride and dilation 1, one group (and
    no padding, which a 1x1 kernel never has here: `padded` is SAME with a larger kernel)."""
    return ((g.kh, g.kw) == (1, 1) and g.stride == (1, 1) and g.dilation == (1, 1)
            and g.groups == 1)
