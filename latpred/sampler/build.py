"""Building: an architecture description (drawn by `latpred.sampler.draw`, or a zoo model's
or a measured file's) -> the Graph it stands for."""

from __future__ import annotations

from typing import Any, Mapping

from latpred.errors import ConfigError, LatpredError
from latpred.graph import Graph
from latpred.sampler.space import BINARY


def model_id(space: str, seed: int, index: int) -> str:
    """Sample `index` of `seed` from `space`: its graph's name and its files' stem."""
    return f"{space}-s{seed}-{index:05d}"


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

