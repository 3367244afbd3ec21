"""Op sequences TFLiteConverter writes for Keras layers, built with a `GraphBuilder`.

A Keras model's batch is dynamic, so the converter cannot fold shapes into constants: a Reshape,
or a Dense on a 4-D tensor, computes its new shape at run time from SHAPE. LayerNormalization
becomes ten element-wise ops. Each function below emits exactly the converter's sequence (op
types, attributes, constant operands), checked op by op against TensorFlow 2.21's own files
(tests/fixtures/corpus, scripts/converter_corpus.py), so sampled models hold the kernels real
converter files run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from latpred.shapes import reshape_target

if TYPE_CHECKING:
    from latpred.builder import GraphBuilder

_SLICE = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
          "shrink_axis_mask": 1, "offset": False}


def dynamic_reshape(b: GraphBuilder, x: int, shape: Sequence[int], name: str | None = None
                    ) -> int:
    """RESHAPE to `shape` (batch first) as a Keras Reshape with a dynamic batch converts:
    SHAPE(x) -> STRIDED_SLICE (the batch, a scalar) -> PACK(batch, *shape[1:]) -> RESHAPE."""
    target = reshape_target(b._get(x).size, tuple(int(d) for d in shape))
    base = b._base(name, "dynamic_reshape")
    dims = _shape_of(b, x, base)
    one = b._int_const((1,), (1,), f"{base}/one")
    batch = b._raw("STRIDED_SLICE", (dims, b._int_const((1,), (0,), f"{base}/begin"), one, one),
                   [((), "int32")], f"{base}/batch", **_SLICE)[0]
    rest = [b._int_const((), (d,), f"{base}/dim{i + 1}") for i, d in enumerate(target[1:])]
    packed = b._raw("PACK", (batch, *rest), [((len(target),), "int32")], f"{base}/pack",
                    values_count=len(target), axis=0)[0]
    return b._raw("RESHAPE", (x, packed), [(target, b._get(x).dtype)], base)[0]


def tensordot_dense(b: GraphBuilder, x: int, units: int, name: str | None = None) -> int:
    """A Keras Dense on an NHWC tensor (ConvNeXt's pointwise layers): the converter flattens
    the leading axes with a shape computed at run time (SHAPE, GATHER, REDUCE_PROD, PACK),
    runs FULLY_CONNECTED on the rows, and reshapes back (GATHER, CONCATENATION)."""
    n, h, w, c = b.shape(x)
    base = b._base(name, "dense")
    dims = _shape_of(b, x, base)
    lead = b._raw("GATHER", (dims, b._int_const((3,), (0, 1, 2), f"{base}/lead_axes")),
                  [((3,), "int32")], f"{base}/lead", axis=0, batch_dims=0)[0]
    zero = b._int_const((1,), (0,), f"{base}/axis0")
    rows = b._raw("REDUCE_PROD", (lead, zero), [((), "int32")], f"{base}/rows",
                  keep_dims=False)[0]
    back = b._raw("CONCATENATION", (lead, b._int_const((1,), (units,), f"{base}/units")),
                  [((4,), "int32")], f"{base}/back_shape", axis=0, activation="NONE")[0]
    last = b._raw("GATHER", (dims, b._int_const((1,), (3,), f"{base}/last_axis")),
                  [((1,), "int32")], f"{base}/last", axis=0, batch_dims=0)[0]
    cols = b._raw("REDUCE_PROD", (last, zero), [((), "int32")], f"{base}/cols",
                  keep_dims=False)[0]
    flat_shape = b._raw("PACK", (rows, cols), [((2,), "int32")], f"{base}/stack",
                        values_count=2, axis=0)[0]
    flat = b._raw("RESHAPE", (x, flat_shape), [((n * h * w, c), b._get(x).dtype)],
                  f"{base}/flat")[0]
    y = b.fully_connected(flat, units, bias=False, name=f"{base}/matmul")
    return b._raw("RESHAPE", (y, back), [((n, h, w, units), b._get(x).dtype)], base)[0]


def layer_norm(b: GraphBuilder, x: int, name: str | None = None) -> int:
    """Keras LayerNormalization over channels as the converter writes it: MEAN, NEG,
    SQUARED_DIFFERENCE, MEAN, ADD(epsilon), RSQRT, MUL(gamma), MUL(mean), MUL(x), ADD."""
    c = b.shape(x)[-1]
    base = b._base(name, "layer_norm")
    axis = b._int_const((1,), (-1,), f"{base}/axis")
    mean = b._op("MEAN", (x, axis), f"{base}/mean", keep_dims=True)[0]
    neg = b._op("NEG", (mean,), f"{base}/neg")[0]
    var = b._op("MEAN", (b._op("SQUARED_DIFFERENCE", (x, mean), f"{base}/sqdiff")[0], axis),
                f"{base}/var", keep_dims=True)[0]
    inv = b._op("RSQRT", (b.add(var, b.constant((), name=f"{base}/epsilon")),),
                f"{base}/rsqrt")[0]
    scale = b.mul(inv, b.constant((1, 1, 1, c), name=f"{base}/gamma"), name=f"{base}/scale")
    shift = b.mul(neg, scale, name=f"{base}/shift")
    return b.add(b.mul(x, scale, name=f"{base}/scaled"), shift, name=base)


def _shape_of(b: GraphBuilder, x: int, base: str) -> int:
    return b._raw("SHAPE", (x,), [((len(b.shape(x)),), "int32")], f"{base}/shape",
                  out_type=2)[0]
