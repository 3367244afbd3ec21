"""XNNPACK operators' packed weights and indirection buffers, compiled (numba) over arrays.

A loop-for-loop port of `xnnpack_operators._packed` + `_indirection` (the rules and their
XNNPACK sources are cited there), for `flat.py`: one call sizes every operator configuration
of a batch from its type code, attributes and tensor dims, where the Python version builds a
signature tuple per configuration. tests/test_memory_compiled.py compares the two on random
signatures; scripts/memory_fast_check.py on every graph of its corpus.

`Sizer` gathers those inputs from a planned batch for `flat.py`. Inputs per operator: `code`
(`CODES`), `attrs` (`ATTRS`, from `attr_row`), three dims rows
(`DIMS`: rank, the first four dims, the product) for input 0, the weights and output 0, and
whether the weights are 8-bit (XNNPACK's qs8 rules, `xnn_ops._qs8_packed`). An
operator whose dims the Python rules would read out of range is reported not ok (the caller
sizes it in Python, which raises where it raises).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain
from math import prod
from typing import Any, Callable

import numpy as np
from numba import njit

from latpred.memory import xnnpack_operators as xnn_ops
from latpred.memory.compiled import leaf
from latpred.memory.xnnpack_configs import F32Config, Qs8Config, f32_config, qs8_config

CODES = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 1, "FULLY_CONNECTED": 2, "MAX_POOL_2D": 3,
         "AVERAGE_POOL_2D": 4}
ATTRS = ("groups", "depth_multiplier", "stride_h", "stride_w", "dilation_w", "filter_h",
         "filter_w", "same_padding")
DIMS = ("rank", "d0", "d1", "d2", "d3", "product")
ALIGNMENT, POINTER = xnn_ops.ALIGNMENT, xnn_ops.POINTER
assert xnn_ops.DW_TILES == (3, 4, 9, 25) and xnn_ops.QS8_DW_TILES == (3, 9, 25)
DW_CHANNEL_TILE, QS8_EXTRA = xnn_ops.DW_CHANNEL_TILE, xnn_ops.QS8_EXTRA
FC, IGEMM, NR2, QS8 = 0, 1, 2, 3        # rows of `config_table`


def _mrs(mrs: tuple[int, ...]) -> tuple[int, int, int]:
    # a shorter list repeats its last mr, which changes no choice of `xnn_ops.heuristic_mr`
    # (ties go to the later)
    return (mrs + (mrs[-1],) * 3)[:3]


@lru_cache(maxsize=8)
def config_table(cfg: F32Config, qs8: Qs8Config) -> np.ndarray:
    """The configurations as the port reads them: one row per f32 GemmConfig (fc, igemm, nr2)
    of nr, k_round, three mrs and the depthwise channel tile, then the qs8 one (nr, kr, mrs,
    channel tile: 8-bit weights)."""
    rows = [(g.nr, g.k_round, *_mrs(g.mrs), DW_CHANNEL_TILE) for g in cfg]
    rows.append((qs8.nr, qs8.kr, *_mrs(qs8.mrs), qs8.dw_channel_tile))
    return np.array(rows, np.int64)


def active_table() -> np.ndarray:
    """`config_table` of the CPU level in force (`xnnpack_configs.active_level`)."""
    return config_table(f32_config(), qs8_config())


def attr_row(op_type: str, attrs: tuple) -> tuple[int, ...] | None:
    """The `ATTRS` an operator's rules read, by the same expressions as `xnnpack_operators`;
    None for attributes of another form (strides of other than two values, ...): such an
    operator is sized in Python, which raises where it raises."""
    try:
        sig = xnn_ops.OpSignature(op_type, attrs, (), (), ())
        stride = tuple(sig.attr("stride", (1, 1)))
        dilation = tuple(sig.attr("dilation", (1, 1)))
        fh, fw = sig.attr("filter", (1, 1))
        if len(stride) != 2 or len(dilation) != 2:
            return None
        return (int(sig.attr("groups", 1) or 1), int(sig.attr("depth_multiplier", 1) or 1),
                int(stride[0]), int(stride[1]), int(dilation[1]), int(fh), int(fw),
                int(sig.attr("padding", "VALID") == "SAME"))
    except (TypeError, ValueError):
        return None


def dims_rows(shapes: list[tuple]) -> np.ndarray:
    """`DIMS` rows of shapes: missing dims read 1, dims past the fourth count only in the
    product (the port checks the rank before it reads a dim)."""
    n = len(shapes)
    out = np.empty((n, len(DIMS)), np.int64)
    out[:, 0] = np.fromiter(map(len, shapes), np.int64, n)
    out[:, 1:5] = np.fromiter(chain.from_iterable((s + _ONES)[:4] for s in shapes), np.int64,
                              4 * n).reshape(n, 4)
    out[:, 5] = out[:, 1:5].prod(axis=1)
    for i in np.flatnonzero(out[:, 0] > 4).tolist():
        out[i, 5] = prod(shapes[i])
    return out


_ONES = (1, 1, 1, 1)


@leaf
def _align(value, alignment):
    return -(-value // alignment) * alignment


@leaf
def _use_nr2(nr, nr2, channels):
    over, over2 = (nr - channels % nr) % nr, (nr2 - channels % nr2) % nr2
    return nr > channels or (over2 < over and over * 100 > channels)


@leaf
def _heuristic_mr(rows, g):
    """`xnn_ops.heuristic_mr` over the mrs of config row `g`."""
    nr = g[0]
    if rows == 0:
        return g[4]
    for k in range(2, 5):
        if rows == g[k]:
            return rows
    best, cost = g[4], -1
    for k in range(2, 5):
        mr = g[k]
        c = -(-rows // mr) * (3 * (mr + nr) + mr * nr)
        if cost < 0 or c <= cost:
            best, cost = mr, c
    return best


@leaf
def _fc_packed(cin, cout, cfg):
    g = cfg[NR2] if _use_nr2(cfg[FC, 0], cfg[NR2, 0], cout) else cfg[FC]
    return _align((_align(cin, g[1]) * 4 + 4) * _align(cout, g[0]), ALIGNMENT)


@leaf
def _qs8_fc_packed(cin, cout, q):
    return _align((_align(cin, q[1]) + QS8_EXTRA) * _align(cout, q[0]), ALIGNMENT)


@leaf
def _dw_tile(kernel_size, eight):
    if eight:
        for tile in (3, 9, 25):
            if tile >= kernel_size:
                return tile
        return -1
    for tile in (3, 4, 9, 25):
        if tile >= kernel_size:
            return tile
    return -1


@leaf
def _conv(code, a, w, out, cfg, eight):
    """(packed, indirection) of a CONV_2D (code 0) or DEPTHWISE_CONV_2D (1); `eight`: 8-bit
    weights (`xnn_ops._qs8_packed`)."""
    groups_attr, multiplier, sh, sw, dw = a[0], a[1], a[2], a[3], a[4]
    if code == 0 and w[2] == 1 and w[3] == 1 and sh == 1 and sw == 1 and groups_attr == 1:
        if eight:                                  # _runs_as_fc
            return _qs8_fc_packed(w[4], w[1], cfg[QS8]), 0
        return _fc_packed(w[4], w[1], cfg), 0
    kh, kw = w[2], w[3]
    pixels = out[2] * out[3]
    if code == 1:
        ks, gin, gout, groups = kh * kw, 1, multiplier, w[4] // multiplier
    else:
        ks, gin, gout, groups = kh * kw, w[4], w[1] // groups_attr, groups_attr
    tile = _dw_tile(ks, eight) if gin == 1 and gout == 1 else -1
    if tile > 0:
        if eight:
            packed = _align((tile + QS8_EXTRA) * _align(groups, cfg[QS8, 5]), ALIGNMENT)
        else:
            packed = _align((tile * 4 + 4) * _align(groups, cfg[FC, 5]), ALIGNMENT)
        oh, ow = out[2], out[3]
        step_w = sw if dw == 1 else kw
        step_h = ks + (ow - 1) * step_w * kh
        return packed, _align((tile - ks + oh * step_h) * POINTER, ALIGNMENT)
    if eight:
        g = cfg[QS8]
        per_group = (ks * _align(gin, g[1]) + QS8_EXTRA) * _align(gout, g[0])
    else:
        g = cfg[NR2] if gout < cfg[IGEMM, 0] else cfg[IGEMM]
        per_group = (ks * _align(gin, g[1]) * 4 + 4) * _align(gout, g[0])
    return _align(per_group * groups, ALIGNMENT), \
        ks * _align(pixels, _heuristic_mr(pixels, g)) * POINTER


@leaf
def _pool(code, a, x, out):
    """Indirection (and divisors) of a MAX_POOL_2D (code 3) or AVERAGE_POOL_2D (4)."""
    sh, sw, kh, kw, same = a[2], a[3], a[5], a[6], a[7]
    if kh == 1 and kw == 1:
        return 0
    ih, oh, ow = x[2], out[2], out[3]
    size = kh * kw
    step_h = size + (ow - 1) * min(sw, kw) * kh
    if code == 3:
        return (oh * step_h + size - 1) * POINTER
    pad_h = max((oh - 1) * sh + kh - ih, 0) if same else 0
    top = pad_h // 2
    bottom = pad_h - top
    rows = -(-top // sh) + -(-bottom // sh) + 1
    divisors = oh * ow * 4 if same else 0
    return (rows * step_h + size - 1) * POINTER + divisors


@njit(cache=True)
def op_buffers(code, attrs, x, w, out, eight, cfg):
    """Per operator: packed weights + indirection bytes, and whether the port sized it (False
    where the Python rules would index a dim that is not there); `eight`: per operator,
    whether its weights are 8-bit (`OpSignature.eight_bit`); `cfg`: `config_table`."""
    n = len(code)
    values = np.zeros(n, np.int64)
    ok = np.ones(n, np.bool_)
    for i in range(n):
        c = code[i]
        if c <= 1:
            if w[i, 0] != 4 or out[i, 0] < 3:
                ok[i] = False
                continue
            packed, indirection = _conv(c, attrs[i], w[i], out[i], cfg, eight[i])
            values[i] = packed + indirection
        elif c == 2:
            if w[i, 0] < 1:
                ok[i] = False
                continue
            cin = w[i, 5] // max(w[i, 1], 1)
            values[i] = _qs8_fc_packed(cin, w[i, 1], cfg[QS8]) if eight[i] else \
                _fc_packed(cin, w[i, 1], cfg)
        else:
            if out[i, 0] < 3 or x[i, 0] < 2 or attrs[i, 2] == 0:
                ok[i] = False
                continue
            values[i] = _pool(c, attrs[i], x[i], out[i])
    return values, ok


class Sizer:
    """Packed weights + indirection of the ops of a `flat.Planned` batch (all graphs' ops in
    a row), by `op_buffers` from each op's type and attributes (read once per kind of op,
    `FeatureBatch.config_kind`, where the op's configuration is known) and its tensors' dims
    (`key_dims[key_ids[flat tensor index]]`: `DIMS` rows); `python(j)` sizes the ops the port
    leaves out."""

    def __init__(self, planned: Any, key_ids: np.ndarray, key_dims: np.ndarray,
                 python: Callable[[int], int], config_kind: np.ndarray | None = None) -> None:
        self.planned, self.key_ids, self.key_dims = planned, key_ids, key_dims
        self.python, self.config_kind = python, config_kind

    def __call__(self, reps: np.ndarray, configs: np.ndarray) -> np.ndarray:
        """Ops `reps` of configurations `configs` (-1: none)."""
        p = self.planned
        if not len(reps):
            return np.zeros(0, np.int64)
        table, odd = self._attrs(reps, configs)
        x, w, out, eight, missing = operands(reps, p.g_ops, p.tensors.g_tens, p.in_ptr, p.ins,
                                             p.out_ptr, p.outs, self.key_ids, self.key_dims,
                                             p.tensors.eight_bit)
        values, ok = op_buffers(table[:, 0], table[:, 1:], x, w, out, eight, active_table())
        for k in np.flatnonzero(odd | missing | ~ok).tolist():
            values[k] = self.python(int(reps[k]))
        return values

    def _attrs(self, reps: np.ndarray, configs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each op's code and attribute row, and whether it must be sized in Python."""
        kinds = np.full(len(reps), -1, np.intp)
        if self.config_kind is not None:
            known = configs >= 0
            kinds[known] = self.config_kind[configs[known]]
        table = np.empty((len(reps), 1 + len(ATTRS)), np.int64)
        odd = np.zeros(len(reps), np.bool_)
        by_kind = kinds >= 0
        if by_kind.any():
            _, first, back = np.unique(kinds[by_kind], return_index=True, return_inverse=True)
            rows, rows_odd = _attr_rows(self.planned.ops, reps[by_kind][first])
            table[by_kind], odd[by_kind] = rows[back.reshape(-1)], rows_odd[back.reshape(-1)]
        if not by_kind.all():
            table[~by_kind], odd[~by_kind] = _attr_rows(self.planned.ops, reps[~by_kind])
        return table, odd


def _attr_rows(ops: list, reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_code_and_attrs` of ops `reps` as a table, and which have none (sized in Python)."""
    rows = [_code_and_attrs(ops[j].type, ops[j].attrs) for j in reps.tolist()]
    odd = np.fromiter((r is None for r in rows), np.bool_, len(rows))
    table = np.array([r or _NO_ROW for r in rows], np.int64)
    return table.reshape(len(rows), 1 + len(ATTRS)), odd


_NO_ROW = (2,) + (1,) * len(ATTRS)      # a stand-in row for ops sized in Python


@njit(cache=True)
def operands(reps, g_ops, g_tens, in_ptr, ins, out_ptr, outs, key_ids, key_dims, eight_bit):
    """For ops `reps` (all graphs' ops in a row): the `DIMS` rows of input 0, input 1 (the
    weights) and output 0 (zeros where absent; `key_dims[key_ids[flat tensor index]]`),
    whether the weights are 8-bit, and whether the op lacks an input or an output 0 (sized in
    Python)."""
    n, width = len(reps), key_dims.shape[1]
    x, w = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
    out = np.zeros((n, width), np.int64)
    eight, missing = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    for i in range(n):
        j = reps[i]
        base = g_tens[np.searchsorted(g_ops, j, side="right") - 1]
        a, b, c = in_ptr[j], in_ptr[j + 1], out_ptr[j]
        if b - a < 1 or out_ptr[j + 1] - c < 1 or outs[c] < 0:
            missing[i] = True
        if b - a > 0 and ins[a] >= 0:
            x[i] = key_dims[key_ids[base + ins[a]]]
        if b - a > 1 and ins[a + 1] >= 0:
            w[i] = key_dims[key_ids[base + ins[a + 1]]]
            eight[i] = eight_bit[base + ins[a + 1]]
        if out_ptr[j + 1] - c > 0 and outs[c] >= 0:
            out[i] = key_dims[key_ids[base + outs[c]]]
    return x, w, out, eight, missing


@lru_cache(maxsize=4096)
def _code_and_attrs(op_type: str, attrs: tuple) -> tuple[int, ...] | None:
    """`CODES` of the type, then its `attr_row` (None: sized in Python)."""
    row, code = attr_row(op_type, attrs), CODES.get(op_type)
    return None if row is None or code is None else (code, *row)
