"""NAS-space sampling: a search space (YAML) -> architecture descriptions -> Graphs.

A space (see search_space/*.yaml) is a stem, a list of stages and a head. Each stage draws, once
for all of its layers, a block type and its parameters, an output channel count, a number of
layers and a skip op; its first layer has the stage's stride. `sample` turns a space and a seed
into architecture descriptions: plain JSON-serialisable dicts that list every layer explicitly,
so `build_graph` rebuilds a model from the description alone, without the space file.

Sample `index` of seed `seed` comes from its own generator, `numpy.random.default_rng([seed,
index])`: the same (space, seed, index) always gives the same architecture, however many models
are drawn and in whatever order.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import yaml

from latpred.errors import ConfigError, LatpredError
from latpred.graph import Graph

ARCH_FORMAT = 1
ACTIVATIONS = ("NONE", "RELU", "RELU6")
SKIPS = ("none", "identity")
POOL_KINDS = ("avg", "max")
# Element-wise ops of a split block's parts: builder method names; a binary op's second operand
# is a per-channel constant.
UNARY = ("relu", "relu6", "sigmoid", "tanh", "hard_swish", "swish")
BINARY = ("add", "mul")
ELEMENTWISE = UNARY + BINARY


# -- the space ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    stride: int
    channels: tuple[int, ...]          # allowed output counts (ignored by pool and split blocks)
    repeats: tuple[int, ...] = (1,)
    blocks: tuple[str, ...] = ()       # block types allowed here; empty: all of the space's


@dataclass(frozen=True)
class SearchSpace:
    name: str
    input: tuple[int, int, int]
    activation: str
    stem: tuple[int, int, int] | None  # (kernel, stride, channels)
    stages: tuple[Stage, ...]
    blocks: Mapping[str, Mapping[str, tuple]]   # block type -> parameter -> its choices
    skip: tuple[str, ...]
    head_channels: tuple[int, ...]
    classes: int
    softmax: bool
    # Model-family scaling, as MobileNet and EfficientNet scale (optional; empty: the fixed
    # `input` and channel ranges): an input resolution and a width multiplier drawn per model,
    # and a FLOPs window a draw must fit (redrawn from the same stream until it does).
    resolutions: tuple[int, ...] = ()
    widths: tuple[float, ...] = ()
    max_flops: float | None = None
    min_flops: float | None = None
    channel_multiple: int = 1
    # Head styles (optional; empty: "fc" only): "fc" is MobileNetV2's (1x1 conv, MEAN, FC);
    # "pooled_conv" is MobileNetV3's as keras.applications writes it: 1x1 conv, MEAN keeping
    # H and W, a 1x1 conv to `point` channels on the 1x1 map (+ activation), a 1x1 conv to
    # the classes, a reshape and the softmax. Its two 1x1 convs on a 1x1 map read megabytes
    # of weights for a few microseconds of compute, a kernel no other head produces.
    head_styles: tuple[str, ...] = ()
    head_point: tuple[int, ...] = ()
    # keras.applications' MobileNets keep the head's channels (1280; V3's point 1024/1280) for
    # width multipliers up to 1 and scale them only above (mobilenet_v2.py, mobilenet_v3.py).
    head_keeps_width: bool = False


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"Search space {where}: {what}.")


def _ints(value: Any, where: str, key: str, low: int = 1) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low for v in value):
        raise _fail(where, f"{key!r} must be a non-empty list of integers >= {low}")
    return tuple(value)


def _odd(value: Any, where: str, key: str) -> tuple[int, ...]:
    sizes = _ints(value, where, key)
    if any(k % 2 == 0 for k in sizes):
        raise _fail(where, f"{key!r} must list odd kernel sizes (SAME padding stays centred)")
    return sizes


def _positive(value: Any, where: str, key: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value):
        raise _fail(where, f"{key!r} must be a non-empty list of positive numbers")
    return tuple(float(v) for v in value)


def _bools(value: Any, where: str, key: str) -> tuple[bool, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, bool) for v in value):
        raise _fail(where, f"{key!r} must be a non-empty list of true/false")
    return tuple(value)


def _names(allowed: Sequence[str]) -> Callable[[Any, str, str], tuple[str, ...]]:
    def check(value: Any, where: str, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value or not all(v in allowed for v in value):
            raise _fail(where, f"{key!r} must be a non-empty list drawn from {list(allowed)}")
        return tuple(value)
    return check


# Converter idioms (what TFLiteConverter writes for Keras models, search_space/converter_cnn.yaml):
# - act: the block's activation: the space's fused one, or HARD_SWISH / swish (LOGISTIC + MUL)
#   as separate ops, as MobileNetV3 and EfficientNet convert;
# - pad: "same", or "explicit": a stride-2 convolution as PAD then VALID (Keras's ZeroPadding2D
#   + Conv2D(padding="valid") in MobileNetV1/V2, ResNet, EfficientNet);
# - se_style: "keep_dims" (MEAN keeping H, W) or "keras" (GlobalAveragePooling2D then
#   Reshape((1, 1, C)): MEAN without keep_dims, then the dynamic-batch chain SHAPE ->
#   STRIDED_SLICE -> PACK -> RESHAPE); se_gate: sigmoid or hard_sigmoid;
# - depth_multiplier of a depthwise convolution.
# Absent keys keep the original behaviour, so older architecture files rebuild unchanged.
ACTS = ("fused", "hard_swish", "swish")
HEAD_STYLES = ("fc", "pooled_conv")
PADS = ("same", "explicit")
SE_STYLES = ("keep_dims", "keras")
SE_GATES = ("sigmoid", "hard_sigmoid")
_IDIOMS = {"act": (_names(ACTS), ()), "pad": (_names(PADS), ())}

# Block type -> parameter -> (validator, default choices; None when required, () when an
# optional idiom is simply not drawn).
_BLOCKS: dict[str, dict[str, tuple[Callable, tuple | None]]] = {
    "conv": {"kernel": (_odd, None), "grouped": (_bools, (False,)), "group_size": (_ints, (4,)),
             **_IDIOMS},
    "dwsep": {"kernel": (_odd, None), "depth_multiplier": (_ints, ()), **_IDIOMS},
    "bottleneck": {"kernel": (_odd, None), "expansion": (_ints, None), "se": (_bools, (False,)),
                   "se_style": (_names(SE_STYLES), ()), "se_gate": (_names(SE_GATES), ()),
                   **_IDIOMS},
    # pad "explicit": ZeroPadding2D then a VALID pool, as Keras's ResNet and NASNet write it
    # (XNNPACK folds a PAD only into a convolution, so this PAD is a kernel of its own).
    "pool": {"kind": (_names(POOL_KINDS), None), "size": (_ints, None),
             "pad": (_names(PADS), ())},
    # ConvNeXt's block as Keras 3 writes it: a 7x7 CONV_2D with groups = channels, the
    # converter's LayerNormalization, Dense(expansion * C) on the NHWC tensor (the run-time
    # reshape chain around FULLY_CONNECTED), GELU, Dense(C), layer scale, residual ADD.
    "convnext": {"kernel": (_odd, None), "expansion": (_ints, None)},
    "split": {"parts": (lambda v, w, k: _ints(v, w, k, low=2), None),
              "elementwise": (_names(ELEMENTWISE), None)},
    # RegNet's X / Y block (Radosavovic et al. 2020, "Designing Network Design Spaces", the
    # AnyNetX block; torchvision's ResBottleneckBlock): 1x1 conv to w / bottleneck, a 3x3
    # grouped conv of `group_width` channels per group (stride here), [squeeze-and-excite to a
    # quarter of the block's input width (RegNetY)], 1x1 linear conv to w, and the block's own
    # shortcut (identity, or a 1x1 strided projection where the shape changes) added with the
    # space's activation. Real RegNets run grouped convs with 14-55 groups of 8-24 channels.
    "xblock": {"group_width": (_ints, None), "bottleneck": (_ints, (1,)),
               "se": (_bools, (False,))},
}


def _mapping(value: Any, where: str, keys: Sequence[str], required: Sequence[str]) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, "must be a mapping")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; allowed: {list(keys)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise _fail(where, f"missing key(s) {missing}")
    return value


def _channels(value: Any, where: str, multiple: int) -> tuple[int, ...]:
    """A list of counts, or {min, max}: every multiple of `multiple` in that range."""
    if isinstance(value, list):
        return _ints(value, where, "channels")
    spec = _mapping(value, f"{where} channels", ("min", "max"), ("min", "max"))
    low, high = _ints([spec["min"], spec["max"]], where, "channels min/max")
    options = tuple(range(math.ceil(low / multiple) * multiple, high + 1, multiple))
    if not options:
        raise _fail(where, f"no multiple of {multiple} lies in channels [{low}, {high}]")
    return options


def parse_space(data: Any, where: str = "") -> SearchSpace:
    """Validate a space given as parsed YAML; raises ConfigError naming the first problem."""
    top = _mapping(data, where or "file", ("name", "input", "channel_multiple", "activation",
                                           "stem", "stages", "blocks", "skip", "head",
                                           "resolution", "width", "max_flops", "min_flops"),
                   ("name", "input", "stages", "blocks", "head"))
    name = top["name"]
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise _fail(where, "'name' must be a word of letters, digits, '-' and '_'")
    where = where or name
    shape = _ints(top["input"], where, "input")
    if len(shape) != 3:
        raise _fail(where, "'input' must be [height, width, channels]")
    multiple = _ints([top.get("channel_multiple", 1)], where, "channel_multiple")[0]
    activation = top.get("activation", "RELU6")
    if activation not in ACTIVATIONS:
        raise _fail(where, f"'activation' must be one of {list(ACTIVATIONS)}")
    stem = None
    if top.get("stem") is not None:
        s = _mapping(top["stem"], f"{where} stem", ("kernel", "stride", "channels"),
                     ("kernel", "stride", "channels"))
        stem = (_odd([s["kernel"]], where, "stem kernel")[0], _stride(s["stride"], where),
                _ints([s["channels"]], where, "stem channels")[0])
    blocks = _parse_blocks(top["blocks"], where)
    if not isinstance(top["stages"], list) or not top["stages"]:
        raise _fail(where, "'stages' must be a non-empty list")
    stages = tuple(_parse_stage(s, f"{where} stage {i + 1}", multiple, blocks)
                   for i, s in enumerate(top["stages"]))
    head = _mapping(top["head"], f"{where} head",
                    ("channels", "classes", "softmax", "style", "point", "keras_width"),
                    ("channels", "classes"))
    styles = _names(HEAD_STYLES)(head["style"], where, "head style") if "style" in head else ()
    if "pooled_conv" in styles and "point" not in head:
        raise _fail(where, "a 'pooled_conv' head style needs 'point' channels")
    softmax = head.get("softmax", True)
    if not isinstance(softmax, bool):
        raise _fail(where, "head 'softmax' must be true or false")
    return SearchSpace(
        name=name, input=shape, activation=activation, stem=stem, stages=stages, blocks=blocks,
        skip=_names(SKIPS)(top.get("skip", ["none"]), where, "skip"),
        head_channels=_channels(head["channels"], f"{where} head", multiple),
        classes=_ints([head["classes"]], where, "head classes")[0], softmax=softmax,
        resolutions=_ints(top["resolution"], where, "resolution") if "resolution" in top else (),
        widths=_positive(top["width"], where, "width") if "width" in top else (),
        max_flops=_positive([top["max_flops"]], where, "max_flops")[0]
        if "max_flops" in top else None,
        min_flops=_positive([top["min_flops"]], where, "min_flops")[0]
        if "min_flops" in top else None, channel_multiple=multiple, head_styles=styles,
        head_point=_channels(head["point"], f"{where} head point", multiple)
        if "point" in head else (), head_keeps_width=_bools([head.get("keras_width", False)],
                                                           where, "head keras_width")[0])


def _stride(value: Any, where: str) -> int:
    if value not in (1, 2) or isinstance(value, bool):
        raise _fail(where, f"stride must be 1 or 2, not {value!r}")
    return value


def _parse_blocks(value: Any, where: str) -> dict[str, dict[str, tuple]]:
    spec = _mapping(value, f"{where} blocks", tuple(_BLOCKS), ())
    if not spec:
        raise _fail(where, "'blocks' must name at least one block type")
    blocks = {}
    for btype, params in spec.items():
        schema = _BLOCKS[btype]
        params = _mapping(params or {}, f"{where} block {btype!r}", tuple(schema),
                          [k for k, (_, default) in schema.items() if default is None])
        blocks[btype] = {k: (check(params[k], f"{where} block {btype!r}", k) if k in params
                             else default) for k, (check, default) in schema.items()
                         if k in params or default != ()}
    return blocks


def _parse_stage(value: Any, where: str, multiple: int, blocks: Mapping) -> Stage:
    s = _mapping(value, where, ("stride", "channels", "repeats", "blocks"),
                 ("stride", "channels"))
    allowed = _names(tuple(blocks))(s["blocks"], where, "blocks") if "blocks" in s else ()
    return Stage(stride=_stride(s["stride"], where),
                 channels=_channels(s["channels"], where, multiple),
                 repeats=_ints(s.get("repeats", [1]), where, "repeats"), blocks=allowed)


def load_space(path: str | os.PathLike) -> SearchSpace:
    """Read and validate a search-space YAML file."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as err:
        raise ConfigError(f"Cannot read search space {path}: {err.strerror}.") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"Search space {path} is not valid YAML: {err}.") from err
    return parse_space(data, str(path))


# -- sampling ----------------------------------------------------------------------------------
def model_id(space: str, seed: int, index: int) -> str:
    return f"{space}-s{seed}-{index:05d}"


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


# -- building ----------------------------------------------------------------------------------
def build_graph(arch: Mapping[str, Any]) -> Graph:
    """The Graph an architecture description stands for (ConfigError if it is malformed)."""
    from latpred.builder import GraphBuilder

    if isinstance(arch, Mapping) and "zoo" in arch:  # a real-world model (latpred.zoo.arch)
        from latpred import zoo

        return zoo.build(arch["zoo"], **arch.get("knobs", {}))
    if isinstance(arch, Mapping) and "graph" in arch:  # a measured file's own graph
        from latpred.graph_json import graph_from_json

        try:
            return graph_from_json(arch["graph"])
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ConfigError(f"Malformed graph description: {type(err).__name__} {err}.") \
                from err
    try:
        name = model_id(arch["space"], arch["seed"], arch["index"]) if "index" in arch else ""
        b = GraphBuilder(name=name)
        act = arch["activation"]
        x = b.input(tuple([1, *arch["input"]]), name="input")
        cin = arch["input"][2]
        if arch["stem"]:
            s = arch["stem"]
            x = b.conv2d(x, s["channels"], s["kernel"], stride=s["stride"], activation=act)
            cin = s["channels"]
        for layer in arch["blocks"]:
            y = _BUILD[layer["type"]](b, x, layer, act, cin)
            x = b.add(x, y) if layer["residual"] else y
            cin = layer.get("channels", cin)
        head = arch["head"]
        x = b.conv2d(x, head["channels"], 1, activation=act)
        if head.get("style", "fc") == "pooled_conv":
            x = b.mean(x, axes=(1, 2), keep_dims=True)
            x = b.conv2d(x, head["point"], 1, activation=act)
            x = b.reshape(b.conv2d(x, head["classes"], 1), (1, head["classes"]))
        else:
            x = b.mean(x, axes=(1, 2), keep_dims=False)
            x = b.fully_connected(x, head["classes"])
        if head["softmax"]:
            x = b.softmax(x)
        b.output(x)
        return b.build()
    except LatpredError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ConfigError(f"Malformed architecture description: {type(err).__name__} {err}.") \
            from err


def _activate(b, x: int, layer: dict) -> int:
    """The block's activation when it is a separate op (HARD_SWISH, swish); else `x`."""
    act = layer.get("act", "fused")
    return x if act == "fused" else getattr(b, act)(x)


def _fused(layer: dict, act: str) -> str:
    return act if layer.get("act", "fused") == "fused" else "NONE"


def _spatial(b, x: int, layer: dict, conv, **kw) -> int:
    """A k x k convolution (`conv` a builder method): SAME, or PAD + VALID as Keras writes a
    strided one (ZeroPadding2D(correct_pad) pads (k-1)//2 - 1 before and (k-1)//2 after when
    the input is even, as keras.applications' imagenet_utils.correct_pad does)."""
    k, stride = layer["kernel"], layer["stride"]
    if layer.get("pad", "same") == "explicit" and stride == 2 and k > 1:
        h = b.shape(x)[1]
        before = (k - 1) // 2 - (1 if h % 2 == 0 else 0)
        x = b.pad(x, ((before, (k - 1) // 2), (before, (k - 1) // 2)))
        return conv(x, kernel=k, stride=stride, padding="VALID", **kw)
    return conv(x, kernel=k, stride=stride, padding="SAME", **kw)


def _conv(b, x: int, layer: dict, act: str, cin: int) -> int:
    x = _spatial(b, x, layer, lambda y, **kw: b.conv2d(y, layer["channels"], **kw),
                 groups=layer["groups"], activation=_fused(layer, act))
    return _activate(b, x, layer)


def _dwsep(b, x: int, layer: dict, act: str, cin: int) -> int:
    x = _spatial(b, x, layer, b.depthwise_conv2d, activation=_fused(layer, act),
                 depth_multiplier=layer.get("depth_multiplier", 1))
    x = _activate(b, x, layer)
    return _activate(b, b.conv2d(x, layer["channels"], 1, activation=_fused(layer, act)), layer)


def _bottleneck(b, x: int, layer: dict, act: str, cin: int) -> int:
    if layer["expansion"] != 1:
        x = _activate(b, b.conv2d(x, cin * layer["expansion"], 1,
                                  activation=_fused(layer, act)), layer)
    x = _activate(b, _spatial(b, x, layer, b.depthwise_conv2d, activation=_fused(layer, act)),
                  layer)
    if layer["se"]:
        x = b.squeeze_excite(x, ratio=0.25, gate=layer.get("se_gate", "sigmoid"),
                             keep_dims=layer.get("se_style", "keep_dims") == "keep_dims")
    return b.conv2d(x, layer["channels"], 1)  # the linear projection: no activation


def _pool(b, x: int, layer: dict, act: str, cin: int) -> int:
    pool = b.avg_pool if layer["kind"] == "avg" else b.max_pool
    size = layer["size"]
    if layer.get("pad", "same") == "explicit" and size > 1:   # ZeroPadding2D + VALID pool
        side = (size - 1) // 2
        x = b.pad(x, ((side, side), (side, side)))
        return pool(x, size, stride=layer["stride"], padding="VALID")
    return pool(x, size, stride=layer["stride"], padding="SAME")


def _split(b, x: int, layer: dict, act: str, cin: int) -> int:
    parts = layer["parts"]
    if cin % parts == 0:
        pieces = b.split(x, parts, axis=-1)
    else:  # near-even sizes, the larger ones first
        sizes = [cin // parts + (i < cin % parts) for i in range(parts)]
        pieces = b.split_v(x, sizes, axis=-1)
    outs = []
    for piece, op in zip(pieces, layer["elementwise"], strict=True):
        fn = getattr(b, op)
        if op in BINARY:  # with a per-channel constant, as an unfused batch norm's scale/shift
            outs.append(fn(piece, b.constant((b.shape(piece)[-1],))))
        else:
            outs.append(fn(piece))
    return b.concat(outs, axis=-1)


def _convnext(b, x: int, layer: dict, act: str, cin: int) -> int:
    from latpred.idioms import layer_norm, tensordot_dense

    y = b.conv2d(x, cin, layer["kernel"], groups=cin)
    y = tensordot_dense(b, layer_norm(b, y), cin * layer["expansion"])
    y = tensordot_dense(b, b.gelu(y), cin)
    y = b.mul(y, b.constant((cin,)))              # layer scale
    return b.add(x, y)                            # the block's own residual


def _xblock(b, x: int, layer: dict, act: str, cin: int) -> int:
    out, stride = layer["channels"], layer["stride"]
    width = out // layer["bottleneck"]
    y = b.conv2d(x, width, 1, activation=act)
    y = b.conv2d(y, width, 3, stride=stride, groups=width // layer["group_width"],
                 activation=act)
    if layer["se"]:
        y = b.squeeze_excite(y, reduced=max(1, round(0.25 * cin)))
    y = b.conv2d(y, out, 1)
    if stride != 1 or cin != out:
        x = b.conv2d(x, out, 1, stride=stride)
    return b.add(x, y, activation=act)


_BUILD = {"conv": _conv, "dwsep": _dwsep, "bottleneck": _bottleneck, "pool": _pool,
          "split": _split, "convnext": _convnext, "xblock": _xblock}


# -- writing -----------------------------------------------------------------------------------
def write_samples(space: SearchSpace, n: int, seed: int, out: str | os.PathLike,
                  precision: str = "fp32", progress: Callable[[], Any] | None = None) -> list[str]:
    """Write `<model_id>.tflite` and `<model_id>.json` for `n` samples; returns the .tflite paths.

    Same (space, seed, precision): byte-identical files, weights included (seeded per model).
    """
    import json
    from pathlib import Path

    from latpred.tflite import write_tflite

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for arch in sample(space, n, seed):
        mid = model_id(space.name, seed, arch["index"])
        weights_seed = int(np.random.SeedSequence([seed, arch["index"]]).generate_state(1)[0])
        graph = build_graph(arch)
        # The JSON first, atomically: a .tflite on disk always has its architecture beside it.
        tmp = folder / f".{mid}.json.tmp"
        tmp.write_text(json.dumps(arch, indent=1) + "\n")
        os.replace(tmp, folder / f"{mid}.json")
        write_tflite(graph, folder / f"{mid}.tflite", precision, seed=weights_seed)
        paths.append(str(folder / f"{mid}.tflite"))
        if progress is not None:
            progress()
    return paths
