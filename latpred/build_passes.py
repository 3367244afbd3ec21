"""The passes `GraphBuilder.build()` runs on the ops it accumulated before they become a Graph.

They do what the TFLite converter does on its way out: a standalone RELU, RELU6 or RELU_N1_TO_1
that is the only reader of an op able to carry a fused activation is folded into it
(`_fuse_activations`), operations whose results reach no graph output are dropped (`_live_ops`),
and the tensors left are renumbered (`_finish`). They need nothing of the builder but its lists of
tensors and ops, so what `build()` changes is read here, apart from the builder's naming and
shape checks.
"""

from __future__ import annotations

from latpred.graph import Graph, Op, Tensor

_FUSABLE_ACTIVATIONS = {"RELU": "RELU", "RELU6": "RELU6", "RELU_N1_TO_1": "RELU_N1_TO_1"}
_TAKES_FUSED_ACTIVATION = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D",
                           "MAX_POOL_2D", "ADD", "SUB", "MUL", "DIV"}


def _finish(tensors: list[Tensor], ops: list[Op], inputs: list[int], outputs: list[int],
            name: str, fuse: bool) -> Graph:
    if not outputs:
        read = {t for op in ops for t in op.inputs}
        outputs = [t for op in ops for t in op.outputs if t not in read]
    ops = _fuse_activations(ops, set(outputs)) if fuse else list(ops)
    ops = _live_ops(ops, outputs)
    keep = dict.fromkeys([*inputs, *(t for op in ops for t in (*op.inputs, *op.outputs)),
                          *outputs])
    keep.pop(-1, None)
    if len(keep) == len(tensors):   # nothing dropped: ids stay as they are
        return Graph(tuple(tensors), tuple(ops), tuple(inputs), tuple(outputs), name)
    new = {old: i for i, old in enumerate(sorted(keep))}
    new[-1] = -1
    return Graph(tensors=tuple(tensors[t] for t in sorted(keep)),
                 ops=tuple(Op(op.type, tuple(new[t] for t in op.inputs),
                              tuple(new[t] for t in op.outputs), op.attrs) for op in ops),
                 inputs=tuple(new[t] for t in inputs), outputs=tuple(new[t] for t in outputs),
                 name=name)


def _fuse_activations(ops: list[Op], outputs: set[int]) -> list[Op]:
    """Fold RELU/RELU6/RELU_N1_TO_1 into the op producing their input, when that is its only
    use and the producer can carry a fused activation."""
    readers: dict[int, int] = {}
    for op in ops:
        for t in set(op.inputs):
            readers[t] = readers.get(t, 0) + 1
    producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
    result: list[Op | None] = list(ops)
    for j, op in enumerate(ops):
        act = _FUSABLE_ACTIVATIONS.get(op.type)
        t = op.inputs[0] if act else -1
        p = producer.get(t)
        if p is None or readers.get(t) != 1 or t in outputs:
            continue
        prev = result[p]
        if prev is None or prev.type not in _TAKES_FUSED_ACTIVATION or prev.activation != "NONE":
            continue
        result[p] = Op.make(prev.type, prev.inputs, op.outputs,
                            **{**prev.attr_dict, "activation": act})
        producer[op.outputs[0]] = p
        result[j] = None
    return [op for op in result if op is not None]


def _live_ops(ops: list[Op], outputs: list[int]) -> list[Op]:
    """Drop ops none of whose results reach a graph output (the converter prunes them)."""
    needed = set(outputs)
    live = []
    for op in reversed(ops):
        if needed.intersection(op.outputs):
            live.append(op)
            needed.update(op.inputs)
    return live[::-1]
