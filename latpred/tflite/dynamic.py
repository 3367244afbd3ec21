"""Static shapes for models with dynamic (-1) dimensions, given the caller's input shapes.

latpred never guesses a dynamic dimension: without `input_shapes` a -1 is an error. With them,
LiteRT's own interpreter propagates the shapes (resize_tensor_input + allocate_tensors), so every
tensor gets the shape the runtime would really run with.
"""

from __future__ import annotations

from typing import Mapping

from latpred.errors import ShapeError, UnsupportedModelError


def _fits(given: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(given) == len(declared) and all(d in (-1, g) for g, d in zip(given, declared))


def _declared(raw, i: int) -> tuple[int, ...]:
    sig = raw.signatures[i]
    return sig if sig is not None else raw.shapes[i]


def _wanted(raw, input_shapes: Mapping[str, tuple[int, ...]] | None) -> dict[int, tuple]:
    """Graph input tensor index -> the static shape it must get."""
    by_name = {raw.tensors[i].name: i for i in raw.inputs}
    given = dict(input_shapes or {})
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
        elif -1 in declared:
            fill = tuple(1 if d == -1 else d for d in declared)
            raise UnsupportedModelError(
                f"Input {name!r} has a dynamic shape {declared}; pass input_shapes="
                f"{{{name!r}: {fill}}} (or the shape you mean) to read this model.")
        else:
            wanted[i] = raw.shapes[i]
    return wanted


def resolve_shapes(data: bytes, raw, input_shapes: Mapping[str, tuple[int, ...]] | None
                   ) -> tuple[tuple[int, ...], ...]:
    """Every tensor's static shape once the graph inputs have `input_shapes`."""
    wanted = _wanted(raw, input_shapes)
    unresolved = [i for i, s in enumerate(raw.shapes) if -1 in s]
    if all(wanted[i] == raw.shapes[i] for i in wanted) and not unresolved:
        return raw.shapes  # nothing to propagate: the stored shapes are the static ones
    if input_shapes is None:
        # Never hand a file to the interpreter unasked: it has no verifier either.
        name = raw.tensors[unresolved[0]].name
        raise UnsupportedModelError(f"Tensor {name!r} has a dynamic shape "
                                    f"{raw.shapes[unresolved[0]]}; pass input_shapes to read "
                                    "this model.")
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    try:
        interp = Interpreter(
            model_content=data,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        for i, shape in wanted.items():
            interp.resize_tensor_input(i, list(shape), strict=False)
        interp.allocate_tensors()
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
