"""A Graph as plain JSON, so a dataset row can be rebuilt without the file it was measured from.

Sampled and zoo models are described by their architecture (the sampler rebuilds them); a
user's or a converter's `.tflite` has no such description, so the profiler stores its Graph in
the row's `arch` column (`{"graph": ...}`). Weights are not part of a Graph, so this is small:
shapes, dtypes, quantization, the small integer constants, and every op's attributes.
"""

from __future__ import annotations

from typing import Any

from latpred.graph import Graph, Op, Quantization, Tensor

FORMAT = 1


def graph_to_json(graph: Graph) -> dict[str, Any]:
    """A JSON-serialisable description that `graph_from_json` turns back into an equal Graph."""
    return {"format": FORMAT, "name": graph.name,
            "tensors": [_tensor(t) for t in graph.tensors],
            "ops": [[op.type, list(op.inputs), list(op.outputs),
                     [[k, _plain(v)] for k, v in op.attrs]] for op in graph.ops],
            "inputs": list(graph.inputs), "outputs": list(graph.outputs)}


def graph_from_json(data: dict[str, Any]) -> Graph:
    """The Graph `graph_to_json` described (KeyError/TypeError/ValueError when malformed)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"graph format {data.get('format')!r}, expected {FORMAT}")
    tensors = tuple(Tensor(t[0], tuple(t[1]), t[2], _quant(t[3]), bool(t[4]),
                           None if t[5] is None else tuple(int(v) for v in t[5]))
                    for t in data["tensors"])
    ops = tuple(Op(o[0], tuple(o[1]), tuple(o[2]), tuple((k, _frozen(v)) for k, v in o[3]))
                for o in data["ops"])
    return Graph(tensors, ops, tuple(data["inputs"]), tuple(data["outputs"]), data["name"])


def _tensor(t: Tensor) -> list:
    q = t.quantization
    return [t.name, list(t.shape), t.dtype,
            None if q is None else [list(q.scale), list(q.zero_point), q.axis],
            t.is_constant, None if t.value is None else list(t.value)]


def _quant(q) -> Quantization | None:
    return None if q is None else Quantization(tuple(float(s) for s in q[0]),
                                               tuple(int(z) for z in q[1]), int(q[2]))


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def _frozen(v: Any) -> Any:
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v
