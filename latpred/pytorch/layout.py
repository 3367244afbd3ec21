"""Layouts of exported tensors inside a latpred graph (used by `export.py`).

A torch tensor of shape `S` lives in the graph as a tensor whose axis `i` is torch axis
`perm[i]` (NCHW activations are NHWC: perm (0, 2, 3, 1)). Torch's `permute`/`transpose` only
change `perm`; an op that needs a particular order gets it through `to_layout`, which writes a
TRANSPOSE, or a RESHAPE when the transpose moves size-1 axes only (the TFLite converter's
trivial-transpose-to-reshape rewrite). `plan_view` decides how a torch `view`/`reshape`/`flatten`
runs on a permuted tensor: a RESHAPE alone when each group of merged or split axes lies
together and in torch order in the graph tensor, else a TRANSPOSE that puts them so first (the
converter's channel shuffle: RESHAPE, TRANSPOSE, RESHAPE).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ViewPlan:
    """How to run a torch view: an optional graph transpose of the input (to `mid` layout),
    then a reshape to `out_perm` layout (graph shape `out_shape`)."""

    mid: Perm            # input layout after the transpose (== input perm: no transpose)
    out_perm: Perm
    out_shape: tuple[int, ...]


def _groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Split two dimension lists (no 1s) with equal products into minimal groups of equal
    product: indices into `old` and `new`."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [i], [j]
        po, pn = old[i], new[j]
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                po *= old[i]
                gi.append(i)
                i += 1
            else:
                pn *= new[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups


def plan_view(old_shape: Sequence[int], perm: Perm, new_shape: Sequence[int]) -> ViewPlan:
    """Plan a torch view of a tensor (torch shape `old_shape`, layout `perm`) to `new_shape`."""
    old_nz = [a for a in range(len(old_shape)) if old_shape[a] != 1]
    new_nz = [a for a in range(len(new_shape)) if new_shape[a] != 1]
    groups = [([old_nz[i] for i in gi], [new_nz[j] for j in gj])
              for gi, gj in _groups([old_shape[a] for a in old_nz],
                                    [new_shape[a] for a in new_nz])]
    placed = non_unit(old_shape, perm)          # graph order of the non-unit torch axes
    pos = {a: k for k, a in enumerate(placed)}
    groups.sort(key=lambda g: min(pos[a] for a in g[0]))
    wanted = [a for g in groups for a in g[0]]  # groups together, torch order inside
    if wanted == placed:
        mid = perm
    else:                                       # keep size-1 axes where they are
        it = iter(wanted)
        mid = tuple(next(it) if old_shape[a] != 1 else a for a in perm)
    new_order = [a for g in groups for a in g[1]]
    rank = len(new_shape)
    pref = canonical(rank)
    if non_unit(new_shape, pref) == new_order:
        out = pref
    else:
        it = iter(new_order)
        out = tuple(next(it) if new_shape[a] != 1 else a for a in range(rank))
    return ViewPlan(mid, out, graph_shape(new_shape, out))


def reduce_perm(perm: Perm, dropped: Sequence[int]) -> Perm:
    """The layout left when the torch axes `dropped` are removed (a reduction without keepdim)."""
    gone = set(dropped)
    return tuple(a - sum(1 for d in gone if d < a) for a in perm if a not in gone)


def permuted(perm: Perm, dims: Sequence[int]) -> Perm:
    """The layout after torch's `x.permute(dims)` (no data moves: only the labels change)."""
    inverse = {old: new for new, old in enumerate(dims)}
    return tuple(inverse[a] for a in perm)
