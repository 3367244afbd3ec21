"""Activation ranges for int8 quantization, measured by running the fp32 model in LiteRT.

The fp32 model (with the same seeded weights the int8 model will get) runs on a few seeded random
inputs with `experimental_preserve_all_tensors`, without delegates (a delegate would hide its
intermediate tensors), and each non-constant float tensor's min and max are recorded: the ranges
are what the network really computes, not guesses.

Each bound is then rounded outward to 7 significant bits (a range widens by at most 1.6%). The
built-in kernels take CPU-specific SIMD paths, so the same fp32 model computes values a few
ulps apart on another CPU: unrounded, the scales of about half the int8 files of a seeded
sample changed from an AMD to an Intel VM (85 of 150 `synthetic_cnn` seed-7 files, 2026-11-27).
Rounded, a bound changes only where a CPU's value falls within those ulps of a grid step, so
the same seed writes the same int8 bytes on nearly every machine.
"""

from __future__ import annotations

import numpy as np

from latpred.errors import MeasurementError
from latpred.graph import Graph

SAMPLES = 4
RANGE_BITS = 7     # significant bits a calibrated bound keeps (rounded away from zero)


def calibrate(model: bytes, graph: Graph, seed: int, samples: int = SAMPLES
              ) -> dict[int, tuple[float, float]]:
    """Tensor index -> (min, max) over `samples` runs, for every non-constant float32 tensor,
    each bound rounded outward (`coarse`)."""
    return {i: (coarse(lo), coarse(hi)) for i, (lo, hi) in
            observed_ranges(model, graph, seed, samples).items()}


def observed_ranges(model: bytes, graph: Graph, seed: int, samples: int = SAMPLES
                    ) -> dict[int, tuple[float, float]]:
    """Tensor index -> the (min, max) LiteRT's built-in kernels computed over `samples` runs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    wanted = [i for i, t in enumerate(graph.tensors)
              if t.dtype == "float32" and not t.is_constant]
    rng = np.random.default_rng([seed, 1])  # its own stream, apart from the weights'
    lo = {i: np.inf for i in wanted}
    hi = {i: -np.inf for i in wanted}
    try:
        interp = Interpreter(
            model_content=model, experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp.allocate_tensors()
        for _ in range(samples):
            for i in graph.inputs:
                t = graph.tensors[i]
                data = rng.standard_normal(t.shape) if t.dtype == "float32" else np.zeros(t.shape)
                interp.set_tensor(i, data.astype(t.dtype))
            interp.invoke()
            for i in wanted:
                x = interp.get_tensor(i)
                if x.size:
                    _check_finite(x, graph.tensors[i].name)
                    lo[i] = min(lo[i], float(np.min(x)))
                    hi[i] = max(hi[i], float(np.max(x)))
    except (RuntimeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MeasurementError(f"LiteRT cannot run the fp32 model to calibrate int8 ranges: "
                               f"{first}") from None
    # A zero-size tensor never shows a value: give it an empty range at zero.
    return {i: (lo[i], hi[i]) if np.isfinite(lo[i]) else (0.0, 0.0) for i in wanted}


def coarse(v: float, bits: int = RANGE_BITS) -> float:
    """`v` rounded away from zero to `bits` significant bits (0 stays 0)."""
    if v == 0.0:
        return 0.0
    mantissa, exponent = np.frexp(abs(v))          # abs(v) = mantissa * 2**exponent, [0.5, 1)
    rounded = np.ceil(mantissa * 2.0 ** bits) / 2.0 ** bits
    return float(np.copysign(np.ldexp(rounded, exponent), v))


def _check_finite(x: np.ndarray, name: str) -> None:
    if not np.isfinite(x).all():
        raise MeasurementError(f"Tensor {name!r} is not finite on calibration inputs, so its "
                               "int8 range cannot be set.")
