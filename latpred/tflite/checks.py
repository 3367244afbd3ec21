"""Checks the reader runs on every graph: what a file must satisfy before later stages trust it.

Shape inference proper lives in `latpred/shapes.py`, applied to the whole graph by
`latpred/graph_checks.py` (`validate_graph`, called last); this module adds what the reader
itself relies on (operand counts, ranks of convolution operands, positive strides) and derives
the shape-dependent attributes (CONV_2D groups, depthwise multiplier).
"""

from __future__ import annotations

from latpred.errors import ShapeError
from latpred.graph import Graph, Op, Tensor
from latpred.graph_checks import validate_graph

# Operand counts (minimum inputs, minimum outputs) of the ops the reader derives attributes for
# or that later stages index blindly.
_ARITY = {
    "CONV_2D": (2, 1), "DEPTHWISE_CONV_2D": (2, 1), "FULLY_CONNECTED": (2, 1),
    "AVERAGE_POOL_2D": (1, 1), "MAX_POOL_2D": (1, 1), "MEAN": (2, 1), "ADD": (2, 1),
    "SUB": (2, 1), "MUL": (2, 1), "DIV": (2, 1), "CONCATENATION": (1, 1), "SPLIT": (2, 1),
    "SPLIT_V": (3, 1), "RESHAPE": (1, 1), "TRANSPOSE": (2, 1), "PAD": (2, 1), "PADV2": (2, 1),
    "SOFTMAX": (1, 1), "STRIDED_SLICE": (4, 1), "BATCH_MATMUL": (2, 1),
}
_SPATIAL = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D")


def _operand(op_type: str, inputs: tuple[int, ...], tensors: tuple[Tensor, ...], k: int,
             rank: int, what: str) -> Tensor:
    if len(inputs) <= k or inputs[k] < 0:
        raise ShapeError(f"{op_type} has no {what} operand.")
    t = tensors[inputs[k]]
    if len(t.shape) != rank:
        raise ShapeError(f"{op_type} needs a rank-{rank} {what}, got {t.name!r} of shape "
                         f"{t.shape}.")
    return t


def conv_groups(op_type: str, inputs: tuple[int, ...], tensors: tuple[Tensor, ...]) -> int:
    """Input channels / filter input channels: a CONV_2D's group count (not stored in files)."""
    x = _operand(op_type, inputs, tensors, 0, 4, "input")
    w = _operand(op_type, inputs, tensors, 1, 4, "filter")
    cin, fin, cout = x.shape[3], w.shape[3], w.shape[0]
    if fin <= 0 or cin % fin or cout % (cin // fin or 1):
        raise ShapeError(f"CONV_2D filter {w.name!r} of shape {w.shape} does not fit input "
                         f"{x.name!r} of shape {x.shape}: input channels must be a multiple of "
                         "the filter's and output channels of the group count.")
    return cin // fin


def depth_multiplier(op_type: str, inputs: tuple[int, ...], tensors: tuple[Tensor, ...]) -> int:
    x = _operand(op_type, inputs, tensors, 0, 4, "input")
    w = _operand(op_type, inputs, tensors, 1, 4, "filter")
    cin, cout = x.shape[3], w.shape[3]
    if cin <= 0 or cout % cin:
        raise ShapeError(f"DEPTHWISE_CONV_2D filter {w.name!r} of shape {w.shape} does not fit "
                         f"input {x.name!r} of shape {x.shape}: its channels must be a multiple "
                         "of the input's.")
    return cout // cin


def _check_op(op: Op, tensors: tuple[Tensor, ...]) -> None:
    need_in, need_out = _ARITY.get(op.type, (0, 0))
    if len(op.inputs) < need_in or len(op.outputs) < need_out:
        raise ShapeError(f"{op.type} has {len(op.inputs)} inputs and {len(op.outputs)} outputs; "
                         f"it needs at least {need_in} and {need_out}.")
    required = op.inputs[:need_in]
    if required and min(required) < 0:
        k = next(k for k, t in enumerate(required) if t < 0)
        raise ShapeError(f"{op.type} lacks its required input {k}.")
    if op.type in _SPATIAL:
        _operand(op.type, op.inputs, tensors, 0, 4, "input")
        attrs = op.attr_dict
        for name in ("stride", "dilation", "filter"):
            value = attrs.get(name)
            if value is not None and min(value) < 1:
                raise ShapeError(f"{op.type} has {name} {value}; it must be at least 1.")


def check_graph(graph: Graph) -> None:
    """Raise ShapeError if the graph breaks what the reader and later stages rely on."""
    for op in graph.ops:
        _check_op(op, graph.tensors)
    validate_graph(graph)  # references, execution order, every op's output shapes
