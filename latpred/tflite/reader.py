"""Read a .tflite file into a `Graph`.

The main subgraph's tensors and operators are read with `FlatReader` (bounds-checked, fast);
option tables go through the generated object API (`options.py`). Weight buffers are never
copied: only small non-quantized integer constants (shapes, axes, paddings, permutations) are
decoded into `Tensor.value`, straight from a numpy view of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from latpred.errors import LatpredError, ModelFormatError, ShapeError, UnsupportedModelError
from latpred.graph import DTYPES, Graph, Op, Quantization, Tensor
from latpred.tflite import options as opt
from latpred.tflite.checks import check_graph, conv_groups, depth_multiplier
from latpred.tflite.flat import FlatReader, corrupt

# TensorType enum value -> dtype name (only the types the Graph IR knows).
_TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string",
                 6: "bool", 7: "int16", 9: "int8"}
_NUMPY = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "uint8": "u1", "int64": "<i8",
          "bool": "?", "int16": "<i2", "int8": "i1"}
_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in _NUMPY.items()}
_INTEGER = frozenset({"int8", "uint8", "int16", "int32", "int64"})
VALUE_LIMIT = 1024            # integer constants up to this many elements keep their data
MAX_RANK = 16                 # far above anything TFLite runs; a larger rank is garbage
CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL_ONCE", "CALL"})

# Field slots of the TFLite schema tables (index of the field in schema.fbs).
M_OPCODES, M_SUBGRAPHS, M_BUFFERS = 1, 2, 4
C_DEPRECATED, C_CUSTOM, C_BUILTIN = 0, 1, 3
G_TENSORS, G_INPUTS, G_OUTPUTS, G_OPERATORS, G_NAME = 0, 1, 2, 3, 4
T_SHAPE, T_TYPE, T_BUFFER, T_NAME, T_QUANT, T_VARIABLE, T_SPARSITY, T_SIGNATURE = range(8)
Q_SCALE, Q_ZERO, Q_DIM = 2, 3, 6
O_OPCODE, O_INPUTS, O_OUTPUTS, O_OPT_TYPE, O_OPTIONS = 0, 1, 2, 3, 4
B_DATA, B_OFFSET, B_SIZE = 0, 1, 2


def read_tflite(source: str | os.PathLike | bytes | bytearray | memoryview,
                input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None = None) -> Graph:
    """Parse a .tflite model (a path or its bytes) into a Graph.

    A dynamic batch (what TFLiteConverter writes for every Keras model) is read as the batch the
    file stores, 1, as LiteRT runs it. `input_shapes` maps input tensor names to static shapes
    (a bare shape for a model with one input); it is required when the model has other dynamic
    (-1) dimensions, and LiteRT's interpreter then propagates the shapes.
    Raises ModelFormatError, UnsupportedModelError or ShapeError with one clear sentence.
    """
    data = _load(source)
    try:
        raw = _parse(data)
    except LatpredError:
        raise
    except Exception as err:  # struct/numpy/flatbuffers errors on garbage: never leak them
        raise corrupt(f"{type(err).__name__} while decoding") from err
    shapes = raw.shapes
    if input_shapes is not None or raw.dynamic:
        from latpred.tflite.dynamic import resolve_shapes
        shapes = resolve_shapes(data, raw, input_shapes)
    graph = raw.to_graph(shapes)
    try:
        check_graph(graph)
    except ShapeError:
        from latpred.tflite.dynamic import placeholder_shapes, resolve_shapes
        if shapes is not raw.shapes or not placeholder_shapes(raw):
            raise
        # Stored shapes that are the converter's placeholders (1 for each dynamic dimension)
        # fail the checks: let LiteRT compute the runtime's, at the stored input shapes.
        graph = raw.to_graph(resolve_shapes(data, raw, input_shapes, propagate=True))
        check_graph(graph)
    return graph


def _load(source) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source) if not isinstance(source, bytes) else source
        where = "The given bytes are"
    else:
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ModelFormatError(f"Model file {path!r} does not exist.") from None
        except IsADirectoryError:
            raise ModelFormatError(f"Model path {path!r} is a directory, not a .tflite file.") \
                from None
        except OSError as err:
            raise ModelFormatError(f"Cannot read model file {path!r}: {err.strerror}.") from None
        where = f"File {path!r} is"
    if len(data) < 8:
        raise ModelFormatError(f"{where} too short ({len(data)} bytes) to be a TFLite model.")
    if data[4:8] != b"TFL3":
        raise ModelFormatError(f"{where} not a TFLite model: its file identifier is "
                               f"{data[4:8]!r}, expected b'TFL3'.")
    return data


@dataclass(frozen=True)
class RawModel:
    """What the file says, before shapes are final: everything but the Graph's shapes."""

    tensors: tuple[Tensor, ...]        # with the stored shapes, which may hold -1
    shapes: tuple[tuple[int, ...], ...]
    signatures: tuple[tuple[int, ...] | None, ...]
    ops: tuple[RawOp, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str
    dynamic: bool

    def to_graph(self, shapes: tuple[tuple[int, ...], ...]) -> Graph:
        tensors = self.tensors
        if shapes is not self.shapes:
            tensors = tuple(t if t.shape == s else replace(t, shape=s)
                            for t, s in zip(tensors, shapes))
        ops = tuple(_make_op(op, tensors) for op in self.ops)
        return Graph(tensors, ops, self.inputs, self.outputs, self.name)


class RawOp(NamedTuple):
    """An operator as stored: its attributes lack the ones derived from shapes (`_make_op`)."""

    type: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict


def _parse(data: bytes) -> RawModel:
    r = FlatReader(data)
    model = r.root()
    subgraphs = r.tables(model, M_SUBGRAPHS)
    if not subgraphs:
        raise ModelFormatError("The model has no subgraph.")
    opcodes = [_opcode_name(r, r.fields(c)) for c in r.tables(model, M_OPCODES)]
    buffers = r.tables(model, M_BUFFERS)
    g = r.fields(subgraphs[0])
    tensor_tables = [r.fields(t) for t in r.tables(g, G_TENSORS)]
    n = len(tensor_tables)
    ops = tuple(_read_op(r, r.fields(t), opcodes, n) for t in r.tables(g, G_OPERATORS))
    flow = sorted({op.type for op in ops} & CONTROL_FLOW)
    if flow:
        raise UnsupportedModelError(f"The model uses control flow ({', '.join(flow)}) across "
                                    f"{len(subgraphs)} subgraphs, which latpred cannot predict.")
    inputs = _indices(r, g, G_INPUTS, n, "a graph input")
    written = {t for op in ops for t in op.outputs}.union(inputs)
    tensors, sigs = [], []
    for i, t in enumerate(tensor_tables):
        tensor, sig = _read_tensor(r, t, buffers, i, written)
        tensors.append(tensor)
        sigs.append(sig)
    shapes = tuple(t.shape for t in tensors)
    dynamic = any(-1 in s for s in shapes) or any(s is not None and -1 in s for s in sigs)
    return RawModel(tuple(tensors), shapes, tuple(sigs), ops, inputs,
                    _indices(r, g, G_OUTPUTS, n, "a graph output"), r.string(g, G_NAME) or "",
                    dynamic)


def _opcode_name(r: FlatReader, code: int) -> str:
    builtin = max(r.scalar(code, C_DEPRECATED, "i8", 0), r.scalar(code, C_BUILTIN, "i32", 0))
    name = opt.OPERATOR_NAMES.get(builtin)
    if name == "CUSTOM":
        return f"CUSTOM:{r.string(code, C_CUSTOM) or ''}"
    # A builtin newer than this schema still gets a name later stages can report.
    return name if name is not None else f"BUILTIN_{builtin}"


def _indices(r: FlatReader, f, slot: int, n: int, what: str,
             optional: bool = False) -> tuple[int, ...]:
    idx = r.ints(f, slot)
    if not idx:
        return ()
    lo, hi = min(idx), max(idx)
    if lo < (-1 if optional else 0) or hi >= n:
        raise corrupt(f"{what} refers to tensor {hi if hi >= n else lo} but the model has "
                      f"{n} tensors")
    return idx


def _read_op(r: FlatReader, op: int, opcodes: list[str], n: int) -> RawOp:
    index = r.scalar(op, O_OPCODE, "u32", 0)
    if index >= len(opcodes):
        raise corrupt(f"an operator uses opcode {index} but the model has {len(opcodes)}")
    op_type = opcodes[index]
    type_code = r.scalar(op, O_OPT_TYPE, "u8", 0)
    table_pos = r.table_pos(op, O_OPTIONS) if type_code else 0
    attrs = opt.parse_attrs(op_type, type_code, r, table_pos)
    return RawOp(op_type, _indices(r, op, O_INPUTS, n, "an operator input", optional=True),
                 _indices(r, op, O_OUTPUTS, n, "an operator output"), attrs)


def _read_tensor(r: FlatReader, t, buffers: list[int], index: int, written: set[int]
                 ) -> tuple[Tensor, tuple[int, ...] | None]:
    """The tensor (with its stored shape) and its shape signature. `written`: the tensors that
    ops or the caller fill in, which an empty buffer does not make constant."""
    type_code = r.scalar(t, T_TYPE, "i8", 0)
    dtype = _TENSOR_TYPES.get(type_code)
    name = r.string(t, T_NAME) or f"tensor_{index}"
    if dtype is None:
        raise UnsupportedModelError(f"Tensor {name!r} has TFLite type {type_code}, which latpred "
                                    f"does not support (it knows {', '.join(DTYPES)}).")
    shape = _shape(r.ints(t, T_SHAPE) or (), name)
    sig = r.ints(t, T_SIGNATURE)
    sig = _shape(sig, name) if sig is not None else None
    quant = _quantization(r, r.table(t, T_QUANT), name)
    data = _buffer(r, buffers, r.scalar(t, T_BUFFER, "u32", 0), name)
    constant = data is not None and data[1] > 0
    if constant:
        if -1 not in shape:
            _check_size(data[1], shape, dtype, name, r.table_pos(t, T_SPARSITY) != 0)
    elif data is not None and 0 in shape and index not in written \
            and not r.scalar(t, T_VARIABLE, "u8", 0):
        constant = True  # a zero-size constant: nothing to store, still constant
    value = None
    if constant and dtype in _INTEGER and quant is None and _size(shape) <= VALUE_LIMIT:
        start, size = data
        value = tuple(np.frombuffer(r.buf, dtype=_NUMPY[dtype], count=size // _ITEMSIZE[dtype],
                                    offset=start).tolist())
    return Tensor(name, shape, dtype, quant, constant, value), sig


def _shape(dims: tuple[int, ...], name: str) -> tuple[int, ...]:
    if len(dims) > MAX_RANK:
        raise corrupt(f"tensor {name!r} has rank {len(dims)}")
    if dims and min(dims) < -1:
        raise corrupt(f"tensor {name!r} has a negative dimension {min(dims)}")
    return dims


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_size(nbytes: int, shape, dtype: str, name: str, sparse: bool) -> None:
    if sparse or dtype == "string":
        return
    want = _size(shape) * _ITEMSIZE[dtype]
    if nbytes != want:
        raise corrupt(f"constant tensor {name!r} of shape {shape} holds {nbytes} bytes, "
                      f"expected {want}")


def _quantization(r: FlatReader, q, name: str) -> Quantization | None:
    if q is None:
        return None
    scale = r.array(q, Q_SCALE, "<f4")
    if scale is None or len(scale) == 0:
        return None  # min/max only (not applied) or empty parameters
    zero = r.array(q, Q_ZERO, "<i8")
    zero = np.zeros(len(scale), np.int64) if zero is None or len(zero) == 0 else zero
    if len(zero) != len(scale):
        raise corrupt(f"tensor {name!r} has {len(scale)} scales but {len(zero)} zero points")
    return Quantization(tuple(scale.tolist()), tuple(zero.tolist()), r.scalar(q, Q_DIM, "i32", 0))


def _buffer(r: FlatReader, buffers: list[int], index: int, name: str) -> tuple[int, int] | None:
    """(start, size) of a tensor's buffer bytes in the file (None for buffer 0 / none)."""
    if index == 0:
        return None
    if index >= len(buffers):
        raise corrupt(f"tensor {name!r} uses buffer {index} but the model has {len(buffers)}")
    b = r.fields(buffers[index])
    offset = r.scalar(b, B_OFFSET, "u64", 0)
    if offset > 1:  # data stored after the flatbuffer (models over 2 GB)
        size = r.scalar(b, B_SIZE, "u64", 0)
        if offset + size > r.size:
            raise corrupt(f"the data of tensor {name!r} lies outside the file")
        return offset, size
    return r.vector(b, B_DATA, 1)


def _make_op(op: RawOp, tensors: tuple[Tensor, ...]) -> Op:
    """The Op with the attributes that depend on shapes: CONV_2D groups, depthwise multiplier,
    a non-negative concat axis."""
    attrs = op.attrs
    if op.type == "CONV_2D":
        attrs = {**attrs, "groups": conv_groups(op.type, op.inputs, tensors)}
    elif op.type == "DEPTHWISE_CONV_2D":
        # The runtime derives the multiplier from the shapes; old converters wrote 0 or 1 here.
        attrs = {**attrs, "depth_multiplier": depth_multiplier(op.type, op.inputs, tensors)}
    elif op.type == "CONCATENATION" and op.outputs:
        rank = len(tensors[op.outputs[0]].shape)
        axis = attrs.get("axis", 0)
        if rank and -rank <= axis < 0:
            attrs = {**attrs, "axis": axis + rank}
    # options.py makes every attribute value hashable already: skip Op.make's freezing pass.
    return Op(op.type, op.inputs, op.outputs, tuple(sorted(attrs.items())))
