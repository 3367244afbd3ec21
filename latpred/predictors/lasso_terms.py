"""The linear family's design: cost terms a non-negative linear model can add up.

A linear model over a kernel type's raw columns (H, W, C, kernel size, ...) cannot express a
product such as FLOPs = 2*H*W*C*k*k, nor a cost per FLOP that depends on the kernel: XNNPACK's
7x7 depthwise kernels run ~10x slower per FLOP than its 3x3 ones, and every kernel slows once
its working set leaves the caches. On host-cpu-synthetic (docs/results/protocol-b-host-cpu,
900 training models) a Lasso on the raw columns had 46% MAPE on depthwise kernels and 40% end
to end; with these terms, 14% and 11%. The `physics` design keeps the raw columns
(copies and element-wise ops are linear in them already) and adds, where the columns exist:

- `pixels` = output_h * output_w (one micro-kernel pass per output position);
- `flops@k<w>s<1|2>`: the FLOPs of kernels whose window kh*kw is w (1, 9, 25, 49) and whose
  stride is 1 or larger, zero elsewhere, so each window/stride class gets its own cost per
  FLOP; windows outside that set count in `flops` only;
- `flops@pad<t>`: FLOPs with the channels the kernel vectorises over (depthwise: input
  channels, other convolutions: filters per group) rounded up to a multiple of t (4, 8, 16),
  the work a SIMD tile of width t really does; grouped convolutions add `pixels*groups`, one
  GEMM call per group and output position (their cost per FLOP grows with the group count);
- `flops@ws><b>`, `bytes@ws><b>`: FLOPs and bytes moved of kernels whose bytes read + written
  exceed b (64 KiB, 256 KiB, 1 MiB, 4 MiB: cache-sized knots), zero below: a cost per FLOP
  and per byte that steps up as the working set spills out of each cache level.
- `flops@kpad<t>` (convolutions that are not depthwise, only where the rows are quantized:
  `packs_reduction`): FLOPs with the input channels per group rounded up to a multiple of t
  (4, 8, 16). XNNPACK's quantized GEMM and IGEMM micro-kernels take the reduction kr bytes at
  a time and pack the weights' input channels to a multiple of kr (x86 AVX512-VNNI QS8 QC8W
  kernels 7x16c8: log2_kr = 3, XNNPACK bench/qs8-qc8w-gemm-e2e.cc; the c8 kernels round kc
  up, `kc = round_up_po2(kc, 8 * sizeof(int8_t))`); its f32 kernels have kr = 1. A 3-channel
  stem convolution in int8 runs ~3.5x the time per FLOP of a 32-channel one (second VM,
  int8 synthetic set; fp32 1.3x). Without the terms, the few 3-channel stems of a NAS space
  set the cost of their whole window/stride class: a fit on 30 int8 synthetic models priced
  the zoo's other 3x3 stride-2 convolutions 46% too slow and its 7x7 3-channel stems 62% too
  fast (docs/fewshot.md).
- `@<OP>`, `bytes@<OP>` (kernel types with an `op_code` column, which gather different ops):
  1 and the bytes moved when the kernel runs that op, zero otherwise, for each op the training
  rows run (`op_codes_of`; the fitted model stores the list), so each op gets its own call
  cost and cost per byte (a LOGISTIC costs ~4x a RELU per element on the host CPU). The code
  itself is an identity, not a cost: it is left out.

Every term is a non-negative cost, so the family's non-negative weights keep their meaning.
The design is a pure function of the column names, the training ops and whether the training
rows are quantized, which the fitted model stores; `raw` (the paper's design) is the columns as
they are.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

DESIGNS = ("raw", "physics")
WINDOWS = (1, 9, 25, 49)
SIMD_TILES = (4, 8, 16)
# Weights of at most this many bytes an element (median over the rows) are quantized: int8
# weights count 1 byte (their int32 bias too under an int8 target, `features.operation`),
# fp16 2, fp32 4.
QUANTIZED_BYTES = 1.5
WORKING_SET_KNOTS = (64 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024)

Column = Callable[[str], np.ndarray]


def _pixels(col: Column) -> dict[str, np.ndarray]:
    return {"pixels": col("output_h") * col("output_w")}


def _window_stride(col: Column) -> dict[str, np.ndarray]:
    flops, window = col("flops"), col("kernel_h") * col("kernel_w")
    strided = np.maximum(col("stride_h"), col("stride_w")) > 1
    return {f"flops@k{w}s{1 + s}": flops * ((window == w) & (strided == bool(s)))
            for w in WINDOWS for s in (0, 1)}


def _simd_padding(col: Column, names: Sequence[str]) -> dict[str, np.ndarray]:
    if "depth_multiplier" in names:
        channels, groups = col("input_c"), 1.0
    else:   # a grouped convolution runs one GEMM per group over its filters / groups outputs
        groups = _groups(col, names)
        channels = col("filters") / groups
    terms = _padded(col("flops"), channels, "flops@pad")
    if "groups" in names:   # and pays a call per group and output position
        terms["pixels*groups"] = col("output_h") * col("output_w") * groups
    return terms


def _packed_reduction(col: Column, names: Sequence[str]) -> dict[str, np.ndarray]:
    return _padded(col("flops"), col("input_c") / _groups(col, names), "flops@kpad")


def _groups(col: Column, names: Sequence[str]) -> np.ndarray | float:
    return np.maximum(col("groups"), 1) if "groups" in names else 1.0


def _padded(flops: np.ndarray, channels: np.ndarray, prefix: str) -> dict[str, np.ndarray]:
    """FLOPs with `channels` rounded up to each of SIMD_TILES."""
    per_channel = flops / np.maximum(channels, 1)
    return {f"{prefix}{t}": per_channel * np.ceil(channels / t) * t for t in SIMD_TILES}


def packs_reduction(X: np.ndarray, names: Sequence[str] | None) -> bool:
    """Whether the rows are convolutions (not depthwise) whose weights are quantized, so the
    runtime packs their input channels in blocks (the `flops@kpad<t>` terms)."""
    need = {"flops", "input_c", "filters", "kernel_h", "kernel_w", "param_bytes"}
    if names is None or not need <= set(names) or "depth_multiplier" in names or not len(X):
        return False
    col = _columns(X, names)
    weights = (col("filters") * col("kernel_h") * col("kernel_w") * col("input_c")
               / _groups(col, names))
    ok = weights > 0
    return bool(ok.any() and np.median(col("param_bytes")[ok] / weights[ok])
                <= QUANTIZED_BYTES)


def _columns(X: np.ndarray, names: Sequence[str]) -> Column:
    index = {n: i for i, n in enumerate(names)}
    return lambda name: X[:, index[name]]


def _working_set(col: Column) -> dict[str, np.ndarray]:
    moved = col("bytes_read") + col("bytes_written")
    flops = col("flops")
    out = {}
    for b in WORKING_SET_KNOTS:
        spilled = moved > b
        out[f"flops@ws>{b}"] = flops * spilled
        out[f"bytes@ws>{b}"] = moved * spilled
    return out


def op_codes_of(X: np.ndarray, names: Sequence[str] | None) -> tuple[int, ...]:
    """The op codes of a kernel type's rows: the keys of its per-op terms."""
    if names is None or "op_code" not in names:
        return ()
    return tuple(int(c) for c in np.unique(X[:, list(names).index("op_code")]))


def _per_op(col: Column, op_codes: Sequence[int]) -> dict[str, np.ndarray]:
    from latpred.tflite.options import OPERATOR_NAMES

    code, moved = col("op_code"), col("bytes_read") + col("bytes_written")
    out = {}
    for c in op_codes:
        runs = (code == c).astype(np.float64)
        name = OPERATOR_NAMES.get(c, str(c))
        out[f"@{name}"], out[f"bytes@{name}"] = runs, moved * runs
    return out


def _physics_terms(X: np.ndarray, names: Sequence[str], op_codes: Sequence[int],
                   packed: bool = False) -> dict[str, np.ndarray]:
    col = _columns(X, names)
    have = set(names)
    terms: dict[str, np.ndarray] = {}
    if {"output_h", "output_w"} <= have:
        terms.update(_pixels(col))
    if {"flops", "kernel_h", "kernel_w", "stride_h", "stride_w"} <= have:
        terms.update(_window_stride(col))
        channel = "input_c" if "depth_multiplier" in have else "filters"
        if {channel, "output_h", "output_w"} <= have:
            terms.update(_simd_padding(col, names))
        if packed:      # only ever fitted where packs_reduction found the columns
            terms.update(_packed_reduction(col, names))
    if {"flops", "bytes_read", "bytes_written"} <= have:
        terms.update(_working_set(col))
    if op_codes and {"op_code", "bytes_read", "bytes_written"} <= have:
        terms.update(_per_op(col, op_codes))
    return terms


def design_matrix(X: np.ndarray, names: Sequence[str] | None, design: str,
                  op_codes: Sequence[int] = (), packed: bool = False) -> np.ndarray:
    """X (columns named `names`) expanded into the design's columns (per-op terms for
    `op_codes`; the packed-reduction terms where `packed`, see `packs_reduction`).

    Without names (a bare matrix) only the raw design is possible, and that is what is used.
    """
    return np.column_stack(list(_build(X, names, design, op_codes, packed).values()))


def _build(X: np.ndarray, names: Sequence[str] | None, design: str,
           op_codes: Sequence[int] = (), packed: bool = False) -> dict[str, np.ndarray]:
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, not {design!r}")
    if names is not None and len(names) != X.shape[1]:
        raise ValueError(f"{len(names)} feature names for {X.shape[1]} columns")
    labels = list(names) if names is not None else [f"x{i}" for i in range(X.shape[1])]
    raw = {n: X[:, i] for i, n in enumerate(labels)}
    if design == "raw" or names is None:
        return raw
    raw.pop("op_code", None)
    return {**raw, **_physics_terms(X, names, op_codes, packed)}
