"""A NAS search space: its YAML file read and validated into a `SearchSpace`.

A space (see search_space/*.yaml) is a stem, a list of stages and a head. Each stage allows, for
all of its layers, block types and their parameters, output channel counts, numbers of layers
and skip ops; `latpred.sampler.draw` picks among them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import yaml

from latpred.errors import ConfigError

ACTIVATIONS = ("NONE", "RELU", "RELU6")
SKIPS = ("none", "identity")
POOL_KINDS = ("avg", "max")
# Element-wise ops of a split block's parts: builder method names; a binary op's second operand
# is a per-channel constant.
UNARY = ("relu", "relu6", "sigmoid", "tanh", "hard_swish", "swish")
BINARY = ("add", "mul")
ELEMENTWISE = UNARY + BINARY


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

