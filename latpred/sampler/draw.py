"""Drawing architectures from a search space: `sample` turns a space and a seed into
architecture descriptions, plain JSON-serialisable dicts that list every layer explicitly (so
`latpred.sampler.build.build_graph` rebuilds a model from the description alone).

Sample `index` of seed `seed` comes from its own generator, `numpy.random.default_rng([seed,
index])`: the same (space, seed, index) always gives the same architecture, however many models
are drawn and in whatever order.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from latpred.errors import ConfigError
from latpred.sampler.build import build_graph
from latpred.sampler.space import SearchSpace, load_space

ARCH_FORMAT = 1


def sample(space: SearchSpace | str | os.PathLike, n: int, seed: int) -> list[dict]:
    """`n` architecture descriptions, deterministic in (space, seed); `space` may be a path."""
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    if n < 0 or seed < 0:
        raise ConfigError("The number of models and the seed must be non-negative.")
    return [sample_one(space, seed, i) for i in range(n)]


def sample_one(space: SearchSpace, seed: int, index: int) -> dict:
    """Architecture `index` of `seed`: a JSON-serialisable dict that `build_graph` builds."""
    rng = np.random.default_rng([seed, index])

    def pick(options: Sequence) -> Any:
        value = options[int(rng.integers(len(options)))]
        return value.item() if isinstance(value, np.generic) else value

    bounded = space.max_flops is not None or space.min_flops is not None
    for _ in range(_MAX_DRAWS):
        arch = _draw(space, seed, index, pick)
        if not bounded:
            return arch
        flops = _flops(arch)
        if (space.max_flops is None or flops <= space.max_flops) and \
                (space.min_flops is None or flops >= space.min_flops):
            return arch
    raise ConfigError(f"Search space {space.name}: no draw of {_MAX_DRAWS} fits min_flops/"
                      f"max_flops {space.min_flops}/{space.max_flops}; widen the bounds or the "
                      "space.")


_MAX_DRAWS = 1000


def _flops(arch: dict) -> float:
    from latpred.features import op_features

    graph = build_graph(arch)
    return float(sum(op_features(graph, i)["flops"] for i in range(len(graph.ops))))


def make_divisible(value: float, divisor: int) -> int:
    """A scaled channel count as keras.applications rounds it (_make_divisible in
    mobilenet_v2.py): the nearest multiple of `divisor`, never more than 10% below `value`."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _draw(space: SearchSpace, seed: int, index: int, pick: Callable) -> dict:
    """One draw of an architecture (the resolution and width first, when the space scales)."""
    shape = list(space.input)
    if space.resolutions:
        shape[0] = shape[1] = pick(space.resolutions)
    width = pick(space.widths) if space.widths else 1.0

    def scale(options: tuple[int, ...]) -> tuple[int, ...]:
        if width == 1.0:
            return options
        return tuple(sorted({make_divisible(c * width, space.channel_multiple)
                             for c in options}))

    def head_scale(options: tuple[int, ...]) -> tuple[int, ...]:
        return options if space.head_keeps_width and width <= 1.0 else scale(options)

    stem = None if space.stem is None else dict(zip(("kernel", "stride", "channels"),
                                                    space.stem))
    if stem is not None:
        stem["channels"] = scale((stem["channels"],))[0]
    channels = stem["channels"] if stem else shape[2]
    layers: list[dict] = []
    pending = 0  # downsamplings a split block could not do, handed on to the next block
    for stage in space.stages:
        stage_channels = scale(stage.channels)
        btype = pick(stage.blocks or tuple(space.blocks))
        # Choices that depend on the block's channels are drawn below, not here.
        params = {k: pick(v) for k, v in space.blocks[btype].items()
                  if k not in ("group_size", "elementwise", "group_width")}
        if btype in _KEEPS_CHANNELS:
            out = channels
        elif btype == "conv":
            params["groups"], out = _groups_and_channels(
                pick, params.pop("grouped"), space.blocks["conv"]["group_size"], channels,
                stage_channels)
        elif btype == "xblock":
            params["group_width"], out = _group_width_and_channels(
                pick, space.blocks["xblock"]["group_width"], params["bottleneck"],
                stage_channels)
        else:
            out = pick(stage_channels)
        if btype == "split":  # one op per part, drawn now so every repeat shares them
            params["elementwise"] = [pick(space.blocks["split"]["elementwise"])
                                     for _ in range(params["parts"])]
        repeats, skip = pick(stage.repeats), pick(space.skip)
        for r in range(repeats):
            need = pending + (stage.stride == 2 and r == 0)
            stride = 2 if need and btype not in _NO_STRIDE else 1
            pending = need - (stride == 2)
            layers.append(_layer(btype, params, stride, out,
                                 residual=skip == "identity" and stride == 1 and channels == out
                                 and btype not in _OWN_SHORTCUT))
            channels = out
    arch = {"format": ARCH_FORMAT, "space": space.name, "seed": seed, "index": index,
            "input": shape, "activation": space.activation, "stem": stem, "blocks": layers,
            "head": {"channels": pick(head_scale(space.head_channels)),
                     "classes": space.classes, "softmax": space.softmax}}
    if space.head_styles and pick(space.head_styles) == "pooled_conv":  # drawn only if listed
        arch["head"].update(style="pooled_conv", point=pick(head_scale(space.head_point)))
    if space.widths:
        arch["width"] = width   # for the record: the channels above are already scaled
    return arch


def _groups_and_channels(pick: Callable, grouped: bool, sizes: tuple[int, ...], cin: int,
                         allowed: tuple[int, ...]) -> tuple[int, int]:
    """Groups and output channels of a conv block: group size divides cin, groups divide cout."""
    fits = [g for g in sizes if cin % g == 0 and cin // g >= 2
            and any(c % (cin // g) == 0 for c in allowed)]
    if not grouped or not fits:
        return 1, pick(allowed)
    groups = cin // pick(fits)
    return groups, pick([c for c in allowed if c % groups == 0])


def _group_width_and_channels(pick: Callable, widths: tuple[int, ...], bottleneck: int,
                              allowed: tuple[int, ...]) -> tuple[int, int]:
    """Group width and output channels of an xblock: as RegNet makes them compatible, the
    bottleneck width (channels / bottleneck) is a multiple of the group width. The group width
    is drawn among those some allowed channel count fits, then the channels among those."""
    fits = [g for g in widths if any(c % (g * bottleneck) == 0 for c in allowed)]
    if not fits:
        raise ConfigError(f"xblock: no group width in {list(widths)} with bottleneck "
                          f"{bottleneck} divides any of the channels {list(allowed)}.")
    width = pick(fits)
    return width, pick([c for c in allowed if c % (width * bottleneck) == 0])


_LAYER_KEYS = {"conv": ("kernel", "groups"), "dwsep": ("kernel",),
               "bottleneck": ("kernel", "expansion", "se"), "pool": ("kind", "size"),
               "split": ("parts", "elementwise"), "convnext": ("kernel", "expansion"),
               "xblock": ("group_width", "bottleneck", "se")}
_KEEPS_CHANNELS = ("pool", "split", "convnext")
_OWN_SHORTCUT = ("convnext", "xblock")   # blocks with their own residual connection
_NO_STRIDE = ("split", "convnext")   # blocks that cannot downsample hand the stride on


_IDIOM_KEYS = ("act", "pad", "depth_multiplier", "se_style", "se_gate")


def _layer(btype: str, params: dict, stride: int, out: int, residual: bool) -> dict:
    layer = {"type": btype, **{k: params[k] for k in _LAYER_KEYS[btype]},
             **{k: params[k] for k in _IDIOM_KEYS if k in params}}
    if btype not in _NO_STRIDE:
        layer["stride"] = stride
    if btype in ("conv", "dwsep", "bottleneck", "xblock"):
        layer["channels"] = out
    layer["residual"] = residual
    return layer

