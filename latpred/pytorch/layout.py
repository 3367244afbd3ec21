"""Layouts of exported tensors inside a latpred graph (used by `export.py`).

A torch tensor of shape `S` lives in the graph as a tensor whose axis `i` is torch axis
`perm[i]` (NCHW activations are NHWC: perm (0, 2, 3, 1)). Torch's `permute`/`transpose` only
change `perm`; an op that needs a particular order gets it through `to_layout`, which writes a
TRANSPOSE, or a RESHAPE when the transpose moves size-1 axes only (the TFLite converter's
trivial-transpose-to-reshape rewrite).
"""

from __future__ import annotations

from typing import Sequence

Perm = tuple[int, ...]


def canonical(rank: int) -> Perm:
    """The layout a converter gives a torch tensor of `rank`: NHWC for 4-D, else torch order."""
    return (0, 2, 3, 1) if rank == 4 else tuple(range(rank))


def graph_shape(torch_shape: Sequence[int], perm: Perm) -> tuple[int, ...]:
    return tuple(int(torch_shape[a]) for a in perm)


def non_unit(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """The axes of `order` whose torch extent is not 1, in that order."""
    return [a for a in order if shape[a] != 1]


def transpose_perm(src: Perm, dst: Perm) -> tuple[int, ...]:
    """The TRANSPOSE permutation turning a graph tensor of layout `src` into layout `dst`."""
    return tuple(src.index(a) for a in dst)


def is_trivial(torch_shape: Sequence[int], src: Perm, dst: Perm) -> bool:
    """True when going from `src` to `dst` moves size-1 axes only (a RESHAPE does it)."""
    return non_unit(torch_shape, src) == non_unit(torch_shape, dst)


def reduce_perm(perm: Perm, dropped: Sequence[int]) -> Perm:
    """The layout left when the torch axes `dropped` are removed (a reduction without keepdim)."""
    gone = set(dropped)
    return tuple(a - sum(1 for d in gone if d < a) for a in perm if a not in gone)


def permuted(perm: Perm, dims: Sequence[int]) -> Perm:
    """The layout after torch's `x.permute(dims)` (no data moves: only the labels change)."""
    inverse = {old: new for new, old in enumerate(dims)}
    return tuple(inverse[a] for a in perm)
