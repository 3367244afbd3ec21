"""Int8 values of a graph's constants and the parameters of a range, as TFLite's converter
makes them (`quantize.quantize`, which decides which tensors are int8):

- CONV_2D / DEPTHWISE_CONV_2D filters: int8, symmetric, per output channel (quantized dimension 0
  for CONV_2D [O, H, W, I], 3 for DEPTHWISE [1, H, W, C]); FULLY_CONNECTED and constant
  BATCH_MATMUL weights: int8 symmetric per tensor (their kernels need zero point 0).
- Biases: int32 with scale = input scale * weight scale (per channel), zero point 0.
- Other float constants (an ADD's operand) and activations: asymmetric per tensor (`affine`).
"""

from __future__ import annotations

import numpy as np

from latpred.errors import UnsupportedModelError
from latpred.graph import Graph, Op, Quantization, Tensor

# the quantized dimension of per-channel weights, and the ops whose input 1 is weights, 2 a bias
WEIGHT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3}
WEIGHTS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL"})
HAS_BIAS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})


def affine(lo: float, hi: float) -> Quantization:
    """Asymmetric int8 parameters covering [lo, hi] (widened to include 0, as TFLite needs).

    A tensor that is 0 on every calibration input (a ReLU that never fires, x - x) gets scale
    1.0 and zero point -128, as the converter gives it (mlir FakeQuantSupport.cpp: "The tensor
    contents are all 0.0s, so the scale is set to 1.0"). A tiny scale instead makes the next
    op's requantization ratio (input scale x weight scale / output scale) too small for
    XNNPACK, which then fails to create its runtime for the whole model."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo == 0.0:
        return Quantization((1.0,), (-128,))
    scale = max(hi - lo, 1e-6) / 255.0
    zero = min(max(round(-128 - lo / scale), -128), 127)    # np.clip costs ~10 us a call
    return Quantization((scale,), (zero,))


def to_int8(x: np.ndarray, q: Quantization) -> np.ndarray:
    """x in per-tensor int8 parameters q."""
    return np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)


def quantize_constants(op: Op, graph: Graph, params, data, tensors, qdata) -> None:
    """Int8 weights, int32 biases and int8 other float constants of one int8 op."""
    for k, t in enumerate(op.inputs):
        if t < 0 or not graph.tensors[t].is_constant or t in params \
                or graph.tensors[t].dtype != "float32" or tensors[t].dtype != "float32":
            continue  # absent, an activation, already done (shared), or an int operand
        src = graph.tensors[t]
        if k == 1 and op.type in WEIGHTS:
            q, qx = _symmetric(data[t], WEIGHT_AXIS.get(op.type))
        elif k == 2 and op.type in HAS_BIAS:
            q, qx = _bias(data[t], params.get(op.inputs[0]), tensors[op.inputs[1]])
        else:
            lo, hi = float(data[t].min(initial=0.0)), float(data[t].max(initial=0.0))
            q = affine(lo, hi)
            qx = to_int8(data[t], q)
        tensors[t] = Tensor(src.name, src.shape, str(qx.dtype), q, True, None)
        qdata[t] = qx


def _symmetric(w: np.ndarray, axis: int | None) -> tuple[Quantization, np.ndarray]:
    """Symmetric int8 (zero point 0) per channel along `axis`, or per tensor when None."""
    if axis is None:
        scale = np.array([max(float(np.abs(w).max(initial=0.0)), 1e-8) / 127.0])
        q = np.clip(np.round(w / scale[0]), -127, 127)
        return Quantization((float(scale[0]),), (0,)), q.astype(np.int8)
    other = tuple(d for d in range(w.ndim) if d != axis)
    scale = np.maximum(np.abs(w).max(axis=other, initial=0.0), 1e-8) / 127.0
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return Quantization(tuple(scale.tolist()), (0,) * len(scale), axis), q


def _bias(b: np.ndarray, x_q: Quantization | None, w: Tensor) -> tuple[Quantization, np.ndarray]:
    """Int32 bias whose scale is input scale * weight scale, per channel like the weights."""
    if x_q is None or w.quantization is None:
        raise UnsupportedModelError("A bias can only be quantized after its input and weights.")
    w_scale = np.asarray(w.quantization.scale)
    scale = x_q.scale[0] * (w_scale if len(w_scale) > 1 else np.full(len(b), w_scale[0]))
    q = np.clip(np.round(b / scale), -2**31, 2**31 - 1).astype(np.int32)
    return Quantization(tuple(scale.tolist()), (0,) * len(scale), 0), q
