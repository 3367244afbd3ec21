"""Window geometry: how TFLite sizes and pads a window op (convolution, pooling), and how
PyTorch pads one to match. Shared by the shape rules (`latpred.shapes`), the builder, the
PyTorch module (`latpred.pytorch`) and the CUDA memory planner (`latpred.memory.torch_plan`);
it imports neither torch nor the graph.
"""

from __future__ import annotations

import math
import operator
from functools import lru_cache
from numbers import Integral

from latpred.errors import ShapeError


def pair(v, name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as a pair of positive ints."""
    if type(v) is tuple and len(v) == 2 and type(v[0]) is int and type(v[1]) is int:
        if v[0] >= 1 and v[1] >= 1:
            return v           # the common case, checked without the generic path below
    elif type(v) is int and v >= 1:
        return v, v
    try:
        h, w = (v, v) if isinstance(v, Integral) else v
        h, w = operator.index(h), operator.index(w)
    except (TypeError, ValueError):
        raise ShapeError(f"{name} must be an int or a pair of ints, got {v!r}.") from None
    if h < 1 or w < 1:
        raise ShapeError(f"{name} must be positive, got {v!r}.")
    return h, w


def out_size(size: int, filt: int, stride: int, dilation: int, padding: str) -> int:
    """TFLite's ComputeOutSize: spatial output extent of a window op."""
    if padding == "SAME":
        return (size + stride - 1) // stride
    if padding == "VALID":
        effective = (filt - 1) * dilation + 1
        return (size + stride - effective) // stride
    raise ShapeError(f"padding must be 'SAME' or 'VALID', got {padding!r}.")


def same_padding(size: int, filt: int, stride: int, dilation: int) -> tuple[int, int]:
    """Implicit (before, after) padding TFLite adds for SAME (the extra pixel goes after)."""
    effective = (filt - 1) * dilation + 1
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


@lru_cache(maxsize=1 << 14)
def window_padding(size_hw, kernel_hw, stride_hw, dilation_hw, padding: str):
    """How PyTorch pads a window op that TFLite pads `padding` ("SAME" or "VALID"): (symmetric
    (ph, pw), with None where no symmetric padding keeps TFLite's output size, and the exact
    F.pad tuple (left, right, top, bottom) or None), pairs as tuples; cached: the CUDA memory
    planner asks for every window op of every candidate."""
    if padding == "VALID":
        return (0, 0), None
    sym, pads = [], []
    for size, k, s, d in zip(size_hw, kernel_hw, stride_hw, dilation_hw):
        before, after = same_padding(size, k, s, d)
        pads.append((before, after))
        p = math.ceil((before + after) / 2)
        # symmetric ceil padding keeps TFLite's output size unless stride 1 and an odd total
        if out_size(size, k, s, d, "SAME") != (size + 2 * p - ((k - 1) * d + 1)) // s + 1:
            p = None
        sym.append(p)
    exact = None
    if any(b != a for b, a in pads) or None in sym:
        (t, b), (l, r) = pads
        exact = (l, r, t, b)
    return tuple(sym), exact
