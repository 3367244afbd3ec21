"""Tile and wave quantization features (tile-quantization-conv-latency-gpu.md, Eq. 1-2).

A GPU computes a convolution / fully connected / matmul as a GEMM cut into output tiles of
blkM x blkN, one thread block (work group) per tile. Latency then moves in steps: the grid
size g = ceil(M/blkM) * ceil(N/blkN) (Eq. 1) jumps when M or N crosses a tile edge, and the
number of waves ceil(g / SMs) jumps when g crosses a multiple of the SM count.

Lowering to GEMM (`gemm_of`), M = output pixels, N = output channels, K = reduction length:
- CONV_2D: M = N*P*Q, N = O/groups, K = (C/groups)*R*S, `groups` independent GEMMs (one for
  a "group<k>" part of a grouped conv the delegate splits).
- DEPTHWISE_CONV_2D: one GEMM per input channel: M = N*P*Q, N = depth_multiplier, K = R*S.
- FULLY_CONNECTED: M = rows, N = units, K = input features. BATCH_MATMUL: the batch of [m x k]
  x [k x n] products (adj_x / adj_y honoured).
- Winograd F(4x4, 3x3) matmul stage: 36 GEMMs of [tiles*N x C] x [C x O]
  (tiles = ceil(P/4)*ceil(Q/4)). The transform stages are element-wise: no GEMM.
Memory terms (Eq. 2, in elements): m_in = input + weights, m_out = output.

`tile_features(graph, kernel, target)` returns `gemm_m, gemm_n, gemm_k, gemm_batch, m_in,
m_out` and, per candidate tile shape of the device profile (`gpu.tile_shapes`) and its
`compute_units`: `grid_<bm>x<bn>` (g, all GEMMs of the batch), `waves_<bm>x<bn>`
(ceil(g / compute_units)), `tile_util_<bm>x<bn>` (useful share of the computed tile area),
`wave_util_<bm>x<bn>` (g / (waves * compute_units): how full the last wave keeps the GPU).
Values are NaN where the kernel has no GEMM; the per-tile columns are absent where the device
profile gives no tile shapes or compute units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from latpred.deduce.kernel import Kernel
from latpred.graph import Graph, Op

NAN = float("nan")
GEMM_KEYS = ("gemm_m", "gemm_n", "gemm_k", "gemm_batch", "m_in", "m_out")
TILE_STATS = ("grid", "waves", "tile_util", "wave_util")
WINOGRAD_TILE = 4  # TFLite's Winograd is F(4x4, 3x3): 4x4 output tiles from 6x6 input tiles
WINOGRAD_POINTS = 36


@dataclass(frozen=True)
class Gemm:
    """`batch` independent products [m x k] x [k x n]; m_in / m_out as in Eq. 2 (elements)."""

    m: int
    n: int
    k: int
    batch: int = 1
    m_in: int = 0
    m_out: int = 0


def conv_gemm(n: int, c: int, h: int, w: int, k: int, r: int, s: int, p: int, q: int,
              groups: int = 1) -> Gemm:
    """The implicit-GEMM view of an NCHW/NHWC convolution with `groups` groups."""
    cg, kg = c // groups, k // groups
    return Gemm(m=n * p * q, n=kg, k=cg * r * s, batch=groups,
                m_in=n * c * h * w + k * cg * r * s, m_out=n * p * q * k)


def grid_size(m: int, n: int, blk_m: int, blk_n: int) -> int:
    """Eq. 1: thread blocks needed to cover an m x n output with blk_m x blk_n tiles."""
    return -(-m // blk_m) * -(-n // blk_n)


def tile_stats(gemm: Gemm, blk_m: int, blk_n: int, compute_units: int) -> dict[str, float]:
    """Grid, waves and utilisations of one tile shape on `compute_units` SMs."""
    g = grid_size(gemm.m, gemm.n, blk_m, blk_n) * gemm.batch
    waves = -(-g // compute_units)
    useful = gemm.m * gemm.n * gemm.batch
    return {"grid": float(g), "waves": float(waves),
            "tile_util": useful / (g * blk_m * blk_n) if g else NAN,
            "wave_util": g / (waves * compute_units) if waves else NAN}


def gemm_features(gemm: Gemm | None, tile_shapes: Iterable[tuple[int, int]],
                  compute_units: int | None) -> dict[str, float]:
    """The feature dict of one GEMM (NaN everywhere for `None`)."""
    shapes = tuple(tile_shapes) if compute_units else ()
    if gemm is None:
        out = dict.fromkeys(GEMM_KEYS, NAN)
        for bm, bn in shapes:
            out.update({f"{st}_{bm}x{bn}": NAN for st in TILE_STATS})
        return out
    out = {"gemm_m": float(gemm.m), "gemm_n": float(gemm.n), "gemm_k": float(gemm.k),
           "gemm_batch": float(gemm.batch), "m_in": float(gemm.m_in),
           "m_out": float(gemm.m_out)}
    for bm, bn in shapes:
        for st, v in tile_stats(gemm, bm, bn, compute_units).items():
            out[f"{st}_{bm}x{bn}"] = v
    return out


def tile_features(graph: Graph, kernel: Kernel, target: Any) -> dict[str, float]:
    """Tile/wave features of `kernel` for `target`'s GPU (see the module docstring)."""
    gpu = getattr(getattr(target, "device", None), "gpu", None)
    shapes = gpu.tile_shapes if gpu is not None else ()
    units = gpu.compute_units if gpu is not None else None
    return gemm_features(gemm_of(graph, kernel), shapes, units)


def gemm_of(graph: Graph, kernel: Kernel) -> Gemm | None:
    """The GEMM `kernel` computes, or None for kernels that are no GEMM."""
    op = graph.ops[kernel.main_op]
    part = kernel.part
    if part in ("group_split", "group_concat") or part.endswith(("input_transform",
                                                                  "output_transform")):
        return None
    if op.type == "CONV_2D":
        gemm = _conv(graph, op)
        if part.startswith("group"):          # one group of a split grouped conv
            gemm = Gemm(gemm.m, gemm.n, gemm.k, 1, gemm.m_in // gemm.batch,
                        gemm.m_out // gemm.batch)
        if part.endswith("matmul") or kernel.type == "winograd_matmul":
            return _winograd(graph, op, gemm)
        return gemm
    if op.type == "DEPTHWISE_CONV_2D":
        return _depthwise(graph, op)
    if op.type == "FULLY_CONNECTED":
        return _fully_connected(graph, op)
    if op.type == "BATCH_MATMUL":
        return _batch_matmul(graph, op)
    return None


def _nhwc(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return shape if len(shape) == 4 else (1, 1, 1, shape[-1])  # type: ignore[return-value]


def _conv(graph: Graph, op: Op) -> Gemm:
    n, h, w, c = _nhwc(graph.input_tensor(op, 0).shape)
    o, r, s, cg = graph.input_tensor(op, 1).shape
    _, p, q, _ = _nhwc(graph.output_tensor(op).shape)
    return conv_gemm(n, c, h, w, o, r, s, p, q, groups=max(1, c // cg) if cg else 1)


def _winograd(graph: Graph, op: Op, conv: Gemm) -> Gemm:
    """36 GEMMs [tiles*N x C] x [C x O] on the transformed input and weights."""
    n, p, q, o = _nhwc(graph.output_tensor(op).shape)
    c = conv.k // 9 if conv.k % 9 == 0 else conv.k
    tiles = n * math.ceil(p / WINOGRAD_TILE) * math.ceil(q / WINOGRAD_TILE)
    return Gemm(m=tiles, n=conv.n, k=c, batch=WINOGRAD_POINTS,
                m_in=WINOGRAD_POINTS * (tiles * c + c * conv.n),
                m_out=WINOGRAD_POINTS * tiles * conv.n)


def _depthwise(graph: Graph, op: Op) -> Gemm:
    n, h, w, c = _nhwc(graph.input_tensor(op, 0).shape)
    _, r, s, cm = graph.input_tensor(op, 1).shape
    _, p, q, _ = _nhwc(graph.output_tensor(op).shape)
    mult = cm // c if c else 1
    return Gemm(m=n * p * q, n=mult, k=r * s, batch=c, m_in=n * h * w * c + r * s * cm,
                m_out=n * p * q * cm)


def _fully_connected(graph: Graph, op: Op) -> Gemm:
    x = graph.input_tensor(op, 0)
    units, features = graph.input_tensor(op, 1).shape
    rows = x.size // features if features else 0
    return Gemm(m=rows, n=units, k=features, m_in=x.size + units * features,
                m_out=rows * units)


def _batch_matmul(graph: Graph, op: Op) -> Gemm:
    a, b = graph.input_tensor(op, 0).shape, graph.input_tensor(op, 1).shape
    m, k = (a[-1], a[-2]) if op.attr("adj_x", False) else (a[-2], a[-1])
    n = b[-2] if op.attr("adj_y", False) else b[-1]
    batch = math.prod(graph.output_tensor(op).shape[:-2])
    return Gemm(m=m, n=n, k=k, batch=batch, m_in=math.prod(a) + math.prod(b),
                m_out=batch * m * n)


def analytical_features(graph: Graph, kernel: Kernel, target: Any) -> dict[str, float]:
    """Tile/wave features plus TMModel's terms: the analytical columns for one kernel.

    Off by default in the predictors: `LatencyModel.fit(..., analytical_features=True)` adds
    them to the conv-like kernel types (predictors/analytical.py, docs/analytical-features.md).
    """
    from latpred.features.tmmodel import tmmodel_features  # tmmodel imports nothing from here
    return {**tile_features(graph, kernel, target), **tmmodel_features(graph, kernel, target)}
