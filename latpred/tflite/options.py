"""Operator options: flatbuffer option tables <-> the attribute dicts of `docs/interfaces.md`.

Reading learns each options table's layout (slot, type, default of every field) from the generated
schema module once, then reads scalar fields straight from the file; defaults come from the schema
when a file leaves the table out. Ops with an entry in `_PARSERS` get the exact
attribute names of the interface table; every other op gets its options table's fields in
snake_case (enums as ints) so later stages can at least report it. Writing is the inverse.
"""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
from ai_edge_litert import schema_py_generated as fb
from flatbuffers.table import Table

from latpred.errors import ModelFormatError, UnsupportedOpError
from latpred.graph import ACTIVATIONS
from latpred.tflite.flat import SCALARS, FlatReader, corrupt

PADDINGS = ("SAME", "VALID")

# Enum tables of the schema, by value. Built once from the generated classes (read-only).
OPERATOR_NAMES: dict[int, str] = {v: k for k, v in vars(fb.BuiltinOperator).items()
                                  if not k.startswith("_")}
OPERATOR_CODES: dict[str, int] = {v: k for k, v in OPERATOR_NAMES.items()}
OPTION_NAMES: dict[int, str] = {v: k for k, v in vars(fb.BuiltinOptions).items()
                                if not k.startswith("_")}
OPTION_CODES: dict[str, int] = {v: k for k, v in OPTION_NAMES.items()}
_OPTION_BY_KEY = {name.lower(): name for name in OPTION_CODES if name != "NONE"}

# Ops whose options table is not named after the op (the rest follow "<OpName>Options").
_IRREGULAR = {
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions", "REDUCE_ALL": "ReducerOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions", "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions", "LESS": "LessOptions",
    "CONCAT_EMBEDDINGS": "ConcatEmbeddingsOptions", "LSTM": "LSTMOptions",
    "BIDIRECTIONAL_SEQUENCE_LSTM": "BidirectionalSequenceLSTMOptions",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTMOptions",
    "RNN": "RNNOptions", "SVDF": "SVDFOptions", "LSH_PROJECTION": "LSHProjectionOptions",
}

# Ops whose interface attributes are "none": whatever options table the file has is ignored.
NO_ATTRS = frozenset({
    "RESHAPE", "TRANSPOSE", "PAD", "PADV2", "RELU", "RELU6", "LOGISTIC", "TANH", "HARD_SWISH",
    "QUANTIZE", "DEQUANTIZE",
})


def options_name(op_type: str) -> str | None:
    """The BuiltinOptions union member an op type uses, or None if it has no options table."""
    if op_type in _IRREGULAR:
        return _IRREGULAR[op_type]
    return _OPTION_BY_KEY.get(op_type.replace("_", "").lower() + "options")


def options_class(name: str) -> type:
    return getattr(fb, name + "T")


# -- reading --------------------------------------------------------------------------------------

def _activation(code: int) -> str:
    if not 0 <= code < len(ACTIVATIONS):
        raise ModelFormatError(f"The model uses an unknown fused activation code {code}.")
    return ACTIVATIONS[code]


def _padding(code: int) -> str:
    if not 0 <= code < len(PADDINGS):
        raise ModelFormatError(f"The model uses an unknown padding code {code}.")
    return PADDINGS[code]


def _f32(x: float) -> float:
    """A float32 field as the Python float it denotes (already exact; kept for clarity)."""
    return float(x)


def _conv(o) -> dict[str, Any]:
    return {"stride": (o.strideH, o.strideW), "padding": _padding(o.padding),
            "dilation": (o.dilationHFactor, o.dilationWFactor),
            "activation": _activation(o.fusedActivationFunction)}


def _dwconv(o) -> dict[str, Any]:
    return {**_conv(o), "depth_multiplier": o.depthMultiplier}


def _pool(o) -> dict[str, Any]:
    return {"stride": (o.strideH, o.strideW), "padding": _padding(o.padding),
            "filter": (o.filterHeight, o.filterWidth),
            "activation": _activation(o.fusedActivationFunction)}


def _act_only(o) -> dict[str, Any]:
    return {"activation": _activation(o.fusedActivationFunction)}


_PARSERS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "CONV_2D": ("Conv2DOptions", _conv),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", _dwconv),
    "FULLY_CONNECTED": ("FullyConnectedOptions", lambda o: {
        "activation": _activation(o.fusedActivationFunction),
        "keep_num_dims": bool(o.keepNumDims)}),
    "AVERAGE_POOL_2D": ("Pool2DOptions", _pool),
    "MAX_POOL_2D": ("Pool2DOptions", _pool),
    "MEAN": ("ReducerOptions", lambda o: {"keep_dims": bool(o.keepDims)}),
    "ADD": ("AddOptions", _act_only),
    "SUB": ("SubOptions", _act_only),
    "MUL": ("MulOptions", _act_only),
    "DIV": ("DivOptions", _act_only),
    "CONCATENATION": ("ConcatenationOptions", lambda o: {
        "axis": o.axis, "activation": _activation(o.fusedActivationFunction)}),
    "SPLIT": ("SplitOptions", lambda o: {"num_splits": o.numSplits}),
    "SPLIT_V": ("SplitVOptions", lambda o: {"num_splits": o.numSplits}),
    "SOFTMAX": ("SoftmaxOptions", lambda o: {"beta": _f32(o.beta)}),
    "STRIDED_SLICE": ("StridedSliceOptions", lambda o: {
        "begin_mask": o.beginMask, "end_mask": o.endMask, "ellipsis_mask": o.ellipsisMask,
        "new_axis_mask": o.newAxisMask, "shrink_axis_mask": o.shrinkAxisMask,
        "offset": bool(o.offset)}),
    "BATCH_MATMUL": ("BatchMatMulOptions", lambda o: {"adj_x": bool(o.adjX),
                                                      "adj_y": bool(o.adjY)}),
    "GELU": ("GeluOptions", lambda o: {"approximate": bool(o.approximate)}),
    "LEAKY_RELU": ("LeakyReluOptions", lambda o: {"alpha": _f32(o.alpha)}),
}


class _Recorder:
    """Stands in for a flatbuffers Builder to learn a field's slot, type and default."""

    seen: tuple[str, int, Any] = ("ref", -1, None)

    def __getattr__(self, method: str):
        def record(slot: int, value: Any, default: Any) -> None:
            self.seen = (_SLOT_KINDS.get(method, "ref"), slot, default)
        return record


_SLOT_KINDS = {"PrependBoolSlot": "bool", "PrependInt8Slot": "i8", "PrependUint8Slot": "u8",
               "PrependInt16Slot": "i16", "PrependUint16Slot": "u16",
               "PrependInt32Slot": "i32", "PrependUint32Slot": "u32",
               "PrependInt64Slot": "i64", "PrependUint64Slot": "u64",
               "PrependFloat32Slot": "f32", "PrependFloat64Slot": "f64"}


@functools.lru_cache(maxsize=None)
def layout(name: str) -> tuple[tuple[str, str, int, Any], ...]:
    """(field, kind, slot, default) of each field of an options table, learned from the
    generated ``<Name>Add<Field>`` builder functions so the schema stays the source of truth."""
    fields = []
    for field in vars(options_class(name)()):
        adder = getattr(fb, f"{name}Add{field[:1].upper()}{field[1:]}")
        rec = _Recorder()
        adder(rec, 0)
        fields.append((field, *rec.seen))
    return tuple(fields)


@functools.lru_cache(maxsize=None)
def _scalar_layout(name: str) -> tuple[tuple[str, Any, int, Any, bool], ...]:
    """`layout(name)` with each scalar kind resolved to its struct (None for a reference)."""
    return tuple((field, None if kind == "ref" else SCALARS[kind], slot, default, kind == "bool")
                 for field, kind, slot, default in layout(name))


def read_options(r: FlatReader, type_code: int, pos: int) -> Any:
    """The fields of an options table as attributes (None for NONE or an unknown member).

    Scalar fields are read directly (fast); a table that holds vectors or nested tables goes
    through the generated object API.
    """
    name = OPTION_NAMES.get(type_code)
    if name is None or name == "NONE" or not pos:
        return None
    f = r.fields(pos)
    n, buf, size = len(f), r.buf, r.size
    values: dict[str, Any] = {}
    for field, fmt, slot, default, is_bool in _scalar_layout(name):
        at = f[slot] if slot < n else 0
        if fmt is None:
            if at:
                return fb.BuiltinOptionsCreator(type_code, Table(r.buf, pos))
            values[field] = None
        elif not at:
            values[field] = default
        elif at + fmt.size > size:  # `at` is positive: see FlatReader's raw reads
            raise corrupt(f"offset {at} is outside the {size}-byte file")
        else:
            v = fmt.unpack_from(buf, at)[0]
            values[field] = bool(v) if is_bool else v
    return SimpleNamespace(**values)


def parse_attrs(op_type: str, type_code: int, r: FlatReader, pos: int) -> dict[str, Any]:
    """Interface attributes of one op from its options union (the table at `pos`, 0 if none)."""
    if op_type in NO_ATTRS:
        return {}
    parser = _PARSERS.get(op_type)
    if parser is not None:
        name, fn = parser
        # A table of another type is ignored, as TFLite does (builtin_options_as_X is null).
        obj = read_options(r, type_code, pos) if OPTION_NAMES.get(type_code) == name else None
        return fn(obj if obj is not None else options_class(name)())
    obj = read_options(r, type_code, pos)
    return generic_attrs(obj) if obj is not None else {}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _plain(v: Any) -> Any:
    """An options field as a hashable attribute value."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (np.ndarray, list, tuple)):
        return tuple(_plain(x) for x in (v.tolist() if isinstance(v, np.ndarray) else v))
    # A nested table (StableHLO ops): its own fields, as sorted pairs.
    return tuple(sorted((_snake(k), _plain(x)) for k, x in vars(v).items()))


def generic_attrs(obj: Any) -> dict[str, Any]:
    return {_snake(k): _plain(v) for k, v in vars(obj).items()}


# -- writing --------------------------------------------------------------------------------------

def _code(table: tuple[str, ...], value: str, what: str) -> int:
    try:
        return table.index(value)
    except ValueError:
        raise UnsupportedOpError(f"Unknown {what} {value!r}; expected one of {table}.") from None


def _build_conv(o, a: dict[str, Any]) -> None:
    o.strideH, o.strideW = a.get("stride", (1, 1))
    o.padding = _code(PADDINGS, a.get("padding", "SAME"), "padding")
    o.dilationHFactor, o.dilationWFactor = a.get("dilation", (1, 1))
    o.fusedActivationFunction = _code(ACTIVATIONS, a.get("activation", "NONE"), "activation")


def _build_pool(o, a: dict[str, Any]) -> None:
    o.strideH, o.strideW = a.get("stride", (1, 1))
    o.padding = _code(PADDINGS, a.get("padding", "VALID"), "padding")
    o.filterHeight, o.filterWidth = a.get("filter", (1, 1))
    o.fusedActivationFunction = _code(ACTIVATIONS, a.get("activation", "NONE"), "activation")


def _build_act(o, a: dict[str, Any]) -> None:
    o.fusedActivationFunction = _code(ACTIVATIONS, a.get("activation", "NONE"), "activation")


def _build_fields(**fields: str) -> Callable[[Any, dict[str, Any]], None]:
    """A builder that copies interface attributes (keys) to option fields (values)."""
    def build(o, a: dict[str, Any]) -> None:
        for attr, field in fields.items():
            if attr in a:
                setattr(o, field, a[attr])
    return build


def _build_dwconv(o, a: dict[str, Any]) -> None:
    _build_conv(o, a)
    o.depthMultiplier = a.get("depth_multiplier", 1)


_BUILDERS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "CONV_2D": _build_conv,
    "DEPTHWISE_CONV_2D": _build_dwconv,
    "FULLY_CONNECTED": lambda o, a: (_build_act(o, a),
                                     setattr(o, "keepNumDims", a.get("keep_num_dims", False))),
    "AVERAGE_POOL_2D": _build_pool,
    "MAX_POOL_2D": _build_pool,
    "MEAN": _build_fields(keep_dims="keepDims"),
    "ADD": _build_act, "SUB": _build_act, "MUL": _build_act, "DIV": _build_act,
    "CONCATENATION": lambda o, a: (_build_act(o, a), setattr(o, "axis", a.get("axis", 0))),
    "SPLIT": _build_fields(num_splits="numSplits"),
    "SPLIT_V": _build_fields(num_splits="numSplits"),
    "SOFTMAX": lambda o, a: setattr(o, "beta", a.get("beta", 1.0)),
    "STRIDED_SLICE": _build_fields(begin_mask="beginMask", end_mask="endMask",
                                   ellipsis_mask="ellipsisMask", new_axis_mask="newAxisMask",
                                   shrink_axis_mask="shrinkAxisMask", offset="offset"),
    "BATCH_MATMUL": _build_fields(adj_x="adjX", adj_y="adjY"),
    "GELU": _build_fields(approximate="approximate"),
    "LEAKY_RELU": _build_fields(alpha="alpha"),
}


def build_options(op_type: str, attrs: dict[str, Any]) -> tuple[int, Any]:
    """(BuiltinOptions type code, ``...OptionsT`` object or None) that encode `attrs`."""
    if op_type in _BUILDERS:
        name = _PARSERS[op_type][0]
        obj = options_class(name)()
        _BUILDERS[op_type](obj, attrs)
        return OPTION_CODES[name], obj
    if op_type in NO_ATTRS or not attrs:
        return 0, None
    name = options_name(op_type)
    if name is None:
        raise UnsupportedOpError(f"Cannot write attributes of {op_type}: TFLite has no options "
                                 "table for it.")
    obj = options_class(name)()
    for key, value in attrs.items():
        field = _camel(key)
        if not hasattr(obj, field) or isinstance(value, tuple) and value and \
                isinstance(value[0], tuple):
            raise UnsupportedOpError(f"Cannot write attribute {key!r} of {op_type}.")
        setattr(obj, field, list(value) if isinstance(value, tuple) else value)
    return OPTION_CODES[name], obj
