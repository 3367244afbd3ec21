"""What each XNNPACK operator allocates for itself on this host: packed weights and
indirection buffers, from the microkernel configuration it picks.

Source: google/XNNPACK at 75db3c093 (the newest stored snapshot before the ai-edge-litert
2.3.0 wheel; the wheel's exact pin is not in the LiteRT tree). Every rule here was checked
against the wheel by tracing its allocations (malloc interposed, each call attributed to
its XNNPACK caller: `create_igemm`, `create_dwconv_path`, `create_fully_connected_nc`,
`reshape_igemm`, `reshape_dwconv`, `reshape_max_pooling2d`, `reshape_average_pooling2d`;
docs/memory.md): byte-exact on the models traced.

The microkernel configurations (nr, kr, mr) depend on the CPU's instruction sets: they come from
`xnnpack_configs` (f32 and qs8 levels, read from /proc/cpuinfo; `for_cpu` plans for another
x86 CPU). 8-bit operators (int8 weights) take the qs8_qc8w rules: weights one byte each with
the input channels rounded to `kr`, an int32 bias and a float scale per output channel
(`extra_weights_bytes = sizeof(float)` of every qs8 convolution and fully connected variant);
no nr2 config.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod
from typing import NamedTuple

from latpred.deduce.xnnpack_int8 import EIGHT_BIT_TYPES
from latpred.graph import Graph, Op
from latpred.memory.arena import align_up
from latpred.memory.configs import OpConfigs
from latpred.memory.xnnpack_configs import (F32Config, GemmConfig, active_level, f32_config,
                                             qs8_config)

ALIGNMENT = 64              # XNN_ALLOCATION_ALIGNMENT
POINTER = 8
DW_TILES, DW_CHANNEL_TILE = (3, 4, 9, 25), 16     # src/configs/dwconv-config.c, FMA3 / AVX-512F
QS8_DW_TILES = (3, 9, 25)       # init_qs8_qc8w_dwconv_config, x86: 3p, 9p, 25p
QS8_EXTRA = 4 + 4               # per output channel: int32 bias + float scale


class OpSignature(NamedTuple):
    """All an operator's buffers depend on: a NAS space's candidates share most of them, so
    the sizes are computed once per signature (`operator_buffers`)."""

    type: str
    attrs: tuple
    x: tuple[int, ...]          # input 0's shape
    w: tuple[int, ...]          # input 1's shape (the weights), () without one
    out: tuple[int, ...]        # output 0's shape
    w_dtype: str = "float32"    # the weights' data type: int8 / uint8 take the qs8 rules

    @property
    def eight_bit(self) -> bool:
        return self.w_dtype in EIGHT_BIT_TYPES

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)


_WITH_BUFFERS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D",
                           "AVERAGE_POOL_2D"})


def operator_buffers(graph: Graph, op: Op) -> tuple[int, int]:
    """(packed weight bytes, indirection bytes) of a delegated operator."""
    if op.type not in _WITH_BUFFERS:
        return 0, 0
    return _buffers(_signature(graph.tensors, op))


def buffers_total(graph: Graph, ops, configs: OpConfigs | None = None) -> int:
    """Packed weights plus indirection buffers of the delegated operators `ops` (indices);
    with `configs` (`configs.batch_configs`), once per op configuration."""
    if configs is None:
        return sum(_op_buffers(graph, i) for i in ops)
    known, of_op = configs.buffers, configs.of_op
    total = 0
    for i in ops:
        c = of_op[i]
        both = known.get(c)
        if both is None:
            both = _op_buffers(graph, i)
            if c >= 0:
                known[c] = both
        total += both
    return total


def _op_buffers(graph: Graph, i: int) -> int:
    """Packed weights plus indirection buffer of op `i` (0 for an op without them)."""
    op = graph.ops[i]
    return sum(_buffers(_signature(graph.tensors, op))) if op.type in _WITH_BUFFERS else 0


def _signature(tensors, op: Op) -> tuple:
    """`OpSignature`'s fields as a plain tuple: it hashes faster than the NamedTuple, which is
    built only on a cache miss."""
    ins = op.inputs
    w = tensors[ins[1]] if len(ins) > 1 and ins[1] >= 0 else None
    return (op.type, op.attrs, tensors[ins[0]].shape if ins[0] >= 0 else (),
            w.shape if w is not None else (), tensors[op.outputs[0]].shape,
            w.dtype if w is not None else "float32")


def packed_weights(graph: Graph, op: Op) -> int:
    """Bytes of the weights XNNPACK packs for `op` (0 for ops without packed weights); the
    delegate's default has no weights cache, so every operator packs its own copy."""
    return operator_buffers(graph, op)[0]


def indirection_bytes(graph: Graph, op: Op) -> int:
    """Bytes of the operator's indirection buffer, kept by the operator (the delegate does not
    set XNN_FLAG_TRANSIENT_INDIRECTION_BUFFER)."""
    return operator_buffers(graph, op)[1]


def _buffers(key: tuple) -> tuple[int, int]:
    """(packed, indirection) of an operator signature (`_signature`), for the CPU level in
    force (`xnnpack_configs.active_level`)."""
    return _buffers_at(key, active_level())


@lru_cache(maxsize=1 << 16)
def _buffers_at(key: tuple, level: str) -> tuple[int, int]:
    op = OpSignature(*key)
    return _packed(op), _indirection(op)


def use_nr2(nr: int, nr2: int, channels: int) -> bool:
    """src/microkernel-utils.c `xnn_use_nr2`: a fully connected layer takes the narrow config
    when the wide one is wider than its outputs, or wastes more than 1% of them in padding
    that the narrow one would not."""
    over, over2 = (nr - channels % nr) % nr, (nr2 - channels % nr2) % nr2
    return nr > channels or (over2 < over and over * 100 > channels)


def heuristic_mr(rows: int, mrs: tuple[int, ...], nr: int) -> int:
    """src/operator-utils.c `xnn_get_heuristic_mr_igemm`: an exact-size kernel when one
    exists, else the cheapest by ceil(rows / mr) * (3 * (mr + nr) + mr * nr), ties to the
    larger mr."""
    if rows == 0:
        return mrs[-1]
    if rows in mrs:
        return rows
    best, cost = mrs[-1], None
    for mr in mrs:
        c = -(-rows // mr) * (3 * (mr + nr) + mr * nr)
        if cost is None or c <= cost:
            best, cost = mr, c
    return best


def fc_config(cout: int, cfg: F32Config) -> GemmConfig:
    """fully-connected-nc.c `create_fully_connected_nc`: the narrow config where
    `xnn_use_nr2` says so."""
    return cfg.nr2 if use_nr2(cfg.fc.nr, cfg.nr2.nr, cout) else cfg.fc


def igemm_config(group_out: int, cfg: F32Config) -> GemmConfig:
    """convolution-nhwc.c `select_gemm_config`: the IGEMM config, or the nr2 one when the
    IGEMM's nr exceeds the group's output channels."""
    return cfg.nr2 if group_out < cfg.igemm.nr else cfg.igemm


def _fc_packed(cin: int, cout: int) -> int:
    """src/operators/fully-connected-nc.c (`create_fully_connected_nc`): (round_up(cin, kr *
    sr) * 4 + 4) * round_up(cout, nr), 64-aligned."""
    g = fc_config(cout, f32_config())
    return align_up((align_up(cin, g.k_round) * 4 + 4) * align_up(cout, g.nr), ALIGNMENT)


def _igemm_packed(kernel_size: int, group_in: int, group_out: int, groups: int) -> int:
    """convolution-nhwc.c `create_igemm`: ((kernel_size * round_up(group_in, kr * sr) * 4) +
    4) * round_up(group_out, nr) per group, the total 64-aligned."""
    g = igemm_config(group_out, f32_config())
    per_group = (kernel_size * align_up(group_in, g.k_round) * 4 + 4) * align_up(group_out, g.nr)
    return align_up(per_group * groups, ALIGNMENT)


def dw_tile(kernel_size: int, tiles: tuple[int, ...] = DW_TILES) -> int | None:
    """convolution-nhwc.c `find_dwconv_ukernel`: the smallest unipass primary tile of `tiles`
    (f32's, or QS8_DW_TILES) that holds the kernel; None above 25 taps (the convolution then
    runs as an IGEMM)."""
    return next((t for t in tiles if t >= kernel_size), None)


def _conv_geometry(op: OpSignature) -> tuple[int, int, int, int, int]:
    """(kernel size, group input channels, group output channels, groups, output pixels)."""
    w = op.w
    pixels = op.out[1] * op.out[2]
    if op.type == "DEPTHWISE_CONV_2D":
        # groups = input channels, each making depth_multiplier outputs (xnn_define_
        # depthwise_convolution_2d); only a multiplier of 1 can take the dwconv path
        multiplier = int(op.attr("depth_multiplier", 1) or 1)
        return w[1] * w[2], 1, multiplier, w[3] // multiplier, pixels
    cout, kh, kw, cin = w
    groups = int(op.attr("groups", 1) or 1)
    return kh * kw, cin, cout // groups, groups, pixels


def _runs_as_fc(op: OpSignature) -> bool:
    """tflite/delegates/xnnpack/xnnpack_delegate.cc `VisitConv2DNode`: a 1x1, stride-1,
    ungrouped convolution is defined as a fully connected node (traced:
    `xnn_define_fully_connected` <- `VisitConv2DNode`)."""
    if op.type != "CONV_2D":
        return False
    return (op.w[1], op.w[2]) == (1, 1) and tuple(op.attr("stride", (1, 1))) == (1, 1) \
        and int(op.attr("groups", 1) or 1) == 1


def _qs8_packed(op: OpSignature) -> int:
    """8-bit weights (convolution-nhwc.c `create_igemm` / `create_dwconv_path`,
    fully-connected-nc.c `create_fully_connected_nc`): per output channel its weights, one
    byte each, the input channels rounded up to kr, plus QS8_EXTRA; output channels rounded
    up to nr (channel_tile for the depthwise path); the total 64-aligned."""
    cfg = qs8_config()
    if op.type == "FULLY_CONNECTED" or _runs_as_fc(op):
        cin = op.w[3] if op.type == "CONV_2D" else prod(op.w) // max(op.w[0], 1)
        return align_up((align_up(cin, cfg.kr) + QS8_EXTRA) * align_up(op.w[0], cfg.nr),
                        ALIGNMENT)
    ks, gin, gout, groups, _ = _conv_geometry(op)
    tile = dw_tile(ks, QS8_DW_TILES) if gin == 1 and gout == 1 else None
    if tile is not None:
        return align_up((tile + QS8_EXTRA) * align_up(groups, cfg.dw_channel_tile), ALIGNMENT)
    per_group = (ks * align_up(gin, cfg.kr) + QS8_EXTRA) * align_up(gout, cfg.nr)
    return align_up(per_group * groups, ALIGNMENT)


def _packed(op: OpSignature) -> int:
    """The weights XNNPACK packs for the operator."""
    if op.eight_bit and op.type in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"):
        return _qs8_packed(op)
    if op.type == "FULLY_CONNECTED":
        return _fc_packed(prod(op.w) // max(op.w[0], 1), op.w[0])
    if op.type not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return 0
    if _runs_as_fc(op):
        return _fc_packed(op.w[3], op.w[0])
    ks, gin, gout, groups, _ = _conv_geometry(op)
    tile = dw_tile(ks) if gin == 1 and gout == 1 else None
    if tile is not None:
        # create_dwconv_path: (primary_tile * 4 + 4) * round_up_po2(channels, channel_tile)
        return align_up((tile * 4 + 4) * align_up(groups, DW_CHANNEL_TILE), ALIGNMENT)
    return _igemm_packed(ks, gin, gout, groups)


def _indirection(op: OpSignature) -> int:
    """The operator's indirection buffer."""
    if op.type in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return _pool_buffers(op)
    if op.type not in ("CONV_2D", "DEPTHWISE_CONV_2D") or _runs_as_fc(op):
        return 0
    ks, gin, gout, groups, pixels = _conv_geometry(op)
    kh, kw = op.w[1], op.w[2]
    tiles = QS8_DW_TILES if op.eight_bit else DW_TILES
    tile = dw_tile(ks, tiles) if gin == 1 and gout == 1 else None
    if tile is not None:
        # convolution-nhwc.c `reshape_dwconv`: (primary_tile - kernel_size + OH * step_height)
        # pointers, 64-aligned; step_height = KH*KW + (OW - 1) * step_width * KH
        oh, ow = op.out[1], op.out[2]
        stride, dil = tuple(op.attr("stride", (1, 1))), tuple(op.attr("dilation", (1, 1)))
        step_w = stride[1] if dil[1] == 1 else kw
        step_h = ks + (ow - 1) * step_w * kh
        return align_up((tile - ks + oh * step_h) * POINTER, ALIGNMENT)
    # convolution-nhwc.c `reshape_igemm`: kernel_size * round_up(OH * OW, mr) pointers, mr
    # from `xnn_get_heuristic_mr_igemm` over the chosen config's kernels
    if op.eight_bit:
        cfg = qs8_config()
        return ks * align_up(pixels, heuristic_mr(pixels, cfg.mrs, cfg.nr)) * POINTER
    g = igemm_config(gout, f32_config())
    return ks * align_up(pixels, heuristic_mr(pixels, g.mrs, g.nr)) * POINTER


def _pool_buffers(op: OpSignature) -> int:
    """Pooling indirection (src/operators/max-pooling-nhwc.c `reshape_max_pooling2d`,
    average-pooling-nhwc.c `reshape_average_pooling2d`): (rows * step_height + pooling_size -
    1) pointers with step_height = pooling_size + (OW - 1) * min(stride_w, KW) * KH; max
    pooling indexes every output row, average pooling only the padded top and bottom rows
    plus one, and with padding keeps a per-pixel divisor buffer (OH * OW floats)."""
    kh, kw = op.attr("filter", (1, 1))
    sh, sw = op.attr("stride", (1, 1))
    if (kh, kw) == (1, 1):
        return 0           # defined as a clamp (xnnpack.py `_in_place`): no pooling operator
    ih = op.x[1]
    oh, ow = op.out[1:3]
    size = kh * kw
    step_h = size + (ow - 1) * min(sw, kw) * kh
    if op.type == "MAX_POOL_2D":
        return (oh * step_h + size - 1) * POINTER
    pad_h = max((oh - 1) * sh + kh - ih, 0) if op.attr("padding", "VALID") == "SAME" else 0
    top, bottom = pad_h // 2, pad_h - pad_h // 2
    rows = -(-top // sh) + -(-bottom // sh) + 1
    # SAME padding sets XNN_FLAG_TENSORFLOW_SAME_PADDING: the pixelwise kernel, with divisors
    divisors = oh * ow * 4 if op.attr("padding", "VALID") == "SAME" else 0
    return (rows * step_h + size - 1) * POINTER + divisors
