"""Static shapes for models with dynamic (-1) dimensions.

TensorFlow's converter marks the batch of every Keras model as dynamic: a tensor's
`shape_signature` holds -1 in dimension 0 while its `shape` holds 1. LiteRT allocates tensors
from `shape` (tensorflow/lite/core/subgraph.cc, `Subgraph::AddTensors` reads `shape` into the
tensor's dims, and `shape_signature` only into `dims_signature`), and `benchmark_model` runs
such a file as it is, at batch 1. So does latpred: a dynamic batch on the graph inputs, with
every stored shape static, is read as stored, on the fast path, without a flag.

Any other dynamic dimension (spatial, sequence length, a stored -1) is never guessed: it needs
the caller's `input_shapes` (`--input-shape` on the command line), and LiteRT's own interpreter
then propagates them (resize_tensor_input + allocate_tensors), so every tensor gets the shape the
runtime would really run with.
"""

from __future__ import annotations

import struct
from typing import Mapping, Sequence

from latpred.errors import ShapeError, UnsupportedModelError


def _fits(given: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(given) == len(declared) and all(d in (-1, g) for g, d in zip(given, declared))


def _declared(raw, i: int) -> tuple[int, ...]:
    sig = raw.signatures[i]
    return sig if sig is not None else raw.shapes[i]


def _batch_only(declared: tuple[int, ...], stored: tuple[int, ...]) -> bool:
    """Only dimension 0 is free, and the file stores a static size for it (LiteRT's batch)."""
    return -1 not in declared[1:] and -1 not in stored


InputShapes = Mapping[str, Sequence[int]] | Sequence[int]


def parse_input_shape(spec: str) -> tuple[str | None, tuple[int, ...]]:
    """`NAME=1x224x224x3` or `1x224x224x3` (the only input) -> (name or None, shape)."""
    name, _, dims = spec.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ShapeError(f"--input-shape {spec!r} is not NAME=1x224x224x3 or 1x224x224x3 "
                         "(positive sizes joined by 'x').")
    return (name or None), shape


def input_shapes_from_specs(specs: Sequence[str]) -> InputShapes | None:
    """The `input_shapes=` argument for repeated `--input-shape` options (None for none)."""
    if not specs:
        return None
    parsed = [parse_input_shape(s) for s in specs]
    if len(parsed) == 1 and parsed[0][0] is None:
        return parsed[0][1]
    if any(name is None for name, _ in parsed):
        raise ShapeError("With several --input-shape options, each must name its input: "
                         "NAME=1x224x224x3.")
    return {name: shape for name, shape in parsed}


def _by_name(raw, input_shapes: InputShapes | None, by_name: dict[str, int]) -> dict:
    """`input_shapes` as a name -> shape dict; a bare shape is the only input's."""
    if input_shapes is None or isinstance(input_shapes, Mapping):
        return dict(input_shapes or {})
    if len(by_name) != 1:
        raise ShapeError(f"A bare input shape fits a model with one input, but this one has "
                         f"{len(by_name)}: {sorted(by_name)}; name each (NAME=1x224x224x3).")
    return {next(iter(by_name)): tuple(input_shapes)}


def _placeholder(declared: tuple[int, ...]) -> str:
    """`1xHxWx3` for a declared (-1, -1, -1, 3): what the user must fill in, spelled out."""
    names = "BHWC" if len(declared) == 4 else "B" + "N" * (len(declared) - 1)
    return "x".join(("1" if i == 0 else names[i]) if d == -1 else str(d)
                    for i, d in enumerate(declared))


def _wanted(raw, input_shapes: InputShapes | None) -> dict[int, tuple]:
    """Graph input tensor index -> the static shape it must get."""
    by_name = {raw.tensors[i].name: i for i in raw.inputs}
    given = _by_name(raw, input_shapes, by_name)
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise ShapeError(f"input_shapes names {unknown}, but the model's inputs are "
                         f"{sorted(by_name)}.")
    wanted: dict[int, tuple] = {}
    for name, i in by_name.items():
        declared = _declared(raw, i)
        if name in given:
            shape = tuple(int(d) for d in given[name])
            if min(shape, default=1) < 1 or not _fits(shape, declared):
                raise ShapeError(f"Input shape {shape} for {name!r} does not fit its declared "
                                 f"shape {declared} (-1 marks a free dimension).")
            wanted[i] = shape
        elif -1 in declared and not _batch_only(declared, raw.shapes[i]):
            raise UnsupportedModelError(
                f"Input {name!r} has dynamic dimensions {declared} beyond the batch; give its "
                f"shape with --input-shape {name}={_placeholder(declared)} (input_shapes= in "
                "Python).")
        else:
            wanted[i] = raw.shapes[i]
    return wanted


def placeholder_shapes(raw) -> bool:
    """Whether some stored shapes are only placeholders for the runtime's.

    The converter stores 1 for every dynamic dimension. Where a tensor's signature is dynamic
    only in the batch, the stored shape is the batch-1 one LiteRT runs; where it is dynamic in
    other dimensions (the (-1, -1) of the reshape Keras's Dense writes around a 4-D input, as in
    ConvNeXt), the stored (1, 1) is not the runtime's (3136, 96): the runtime computes it.
    """
    return any(sig is not None and -1 in sig[1:] for sig in raw.signatures)


def resolve_shapes(data: bytes, raw, input_shapes: InputShapes | None,
                   propagate: bool = False) -> tuple[tuple[int, ...], ...]:
    """Every tensor's static shape once the graph inputs have `input_shapes`.

    `propagate` asks LiteRT to compute every shape even when the stored ones look static (the
    reader does so when they are placeholders that fail latpred's shape checks).
    """
    wanted = _wanted(raw, input_shapes)
    unresolved = [i for i, s in enumerate(raw.shapes) if -1 in s]
    if all(wanted[i] == raw.shapes[i] for i in wanted) and not unresolved and not propagate:
        return raw.shapes  # nothing to propagate: the stored shapes are the static ones
    if input_shapes is None and unresolved:
        # Never hand a file to the interpreter unasked: it has no verifier either.
        name = raw.tensors[unresolved[0]].name
        raise UnsupportedModelError(f"Tensor {name!r} has a dynamic shape "
                                    f"{raw.shapes[unresolved[0]]}; give the input shapes with "
                                    "--input-shape (input_shapes= in Python) to read this model.")
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    try:
        interp = Interpreter(
            model_content=data,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        for i, shape in wanted.items():
            interp.resize_tensor_input(i, list(shape), strict=False)
        interp.allocate_tensors()
        if propagate:
            # A tensor whose shape is data (a RESHAPE to a computed shape) is sized only when
            # its op runs: one invoke on the zero-filled arena sizes them all.
            interp.invoke()
        found = {d["index"]: tuple(int(x) for x in d["shape"])
                 for d in interp.get_tensor_details()}
    except (RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ShapeError(f"LiteRT cannot propagate the input shapes through this model: "
                         f"{first}") from None
    shapes = tuple(found.get(i, s) for i, s in enumerate(raw.shapes))
    left = [raw.tensors[i].name for i, s in enumerate(shapes) if -1 in s]
    if left:
        raise UnsupportedModelError(f"Tensor {left[0]!r} keeps a dynamic shape even with the "
                                    "given input shapes (its size depends on the data).")
    return shapes


def with_input_shapes(data: bytes, input_shapes: InputShapes | None) -> bytes:
    """The model's bytes with its graph inputs fixed to `input_shapes`, weights untouched.

    None fixes a dynamic batch to the stored one. What `latpred profile` measures: each input
    tensor's `shape` and
    `shape_signature` vectors are overwritten in place with the static shape (same rank, so
    the flatbuffer's layout does not move); LiteRT then derives every other shape when it
    allocates tensors, as it does after resize_tensor_input.
    """
    from latpred.tflite.flat import FlatReader
    from latpred.tflite.reader import (G_OUTPUTS, G_TENSORS, M_SUBGRAPHS, T_SHAPE,
                                       T_SIGNATURE, _parse)

    raw = _parse(data)
    if not raw.dynamic and input_shapes is None:
        return data
    wanted = _wanted(raw, input_shapes)
    r = FlatReader(data)
    g = r.fields(r.tables(r.root(), M_SUBGRAPHS)[0])
    tables = r.tables(g, G_TENSORS)
    out = bytearray(data)

    def fix(shapes: dict[int, tuple[int, ...]]) -> None:
        for i, shape in shapes.items():
            fields = r.fields(tables[i])
            for slot in (T_SHAPE, T_SIGNATURE):
                start, n = r.vector(fields, slot, 4)
                if start and n == len(shape):
                    out[start:start + 4 * n] = struct.pack(f"<{n}i", *shape)

    fix(wanted)
    # The outputs too: a runtime that sizes its output buffers from the signature (LiteRT's
    # CompiledModel) needs them static; their shapes are what the fixed inputs give.
    from latpred.tflite.reader import read_tflite

    graph = read_tflite(bytes(out))
    fix({o: graph.tensors[o].shape for o in r.ints(g, G_OUTPUTS) or ()})
    return bytes(out)
