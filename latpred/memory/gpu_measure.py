"""The GPU accelerator's own memory figures (ground truth for the GPU-delegate planner).

LiteRT's GPU accelerator (ML Drift; over WebGPU/Vulkan on the H100) reports two metrics when a
compiled model's metrics collection is stopped: `gpu_intermediate_memory_bytes` (the shared
buffers and textures its memory manager allocated for intermediate tensors) and
`gpu_constant_memory_bytes` (the weights as uploaded, plus each operation's constant
arguments). Sources: google-ai-edge/ml-drift ml_drift/webgpu/inference_context.cc
(GetSizeOfMemoryAllocatedForIntermediateTensors / ...ForConstTensors) and the LiteRT ML Drift
delegate's StopMetricsCollection (the metric names above, litert/runtime/accelerators/gpu
ml_drift_delegate_test.cc "CollectMetricsSuccess").

ai-edge-litert's Python wrapper does not expose metrics, so this reads them through LiteRT's C
API (libLiteRt.so in the same wheel) with ctypes. Signatures are those of the 2.3.0 wheel
(LiteRtCreateModelFromFile takes the environment first; checked by disassembly), struct layouts
from litert/c/litert_any.h and litert_metrics.h, the fp32 switch the "gpu_options" opaque
options with the TOML payload "precision = 2" (kLiteRtDelegatePrecisionFp32).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import lru_cache

from latpred.errors import MeasurementError

_RUNTIME_LIBRARY_DIR = 22  # kLiteRtEnvOptionTagRuntimeLibraryDir
_ANY_STRING = 8            # kLiteRtAnyTypeString
_ANY_INT = 2               # kLiteRtAnyTypeInt
_ACCELERATORS = {"gpu": 1 << 1, "cpu": 1 << 0}  # kLiteRtHwAcceleratorGpu / Cpu
_PRECISION_PAYLOAD = {"fp16": None, "fp32": b"precision = 2\n"}


class _AnyValue(ctypes.Union):
    _fields_ = [("bool_value", ctypes.c_bool), ("int_value", ctypes.c_int64),
                ("real_value", ctypes.c_double), ("str_value", ctypes.c_char_p),
                ("ptr_value", ctypes.c_void_p)]


class _Any(ctypes.Structure):
    _anonymous_ = ("v",)
    _fields_ = [("type", ctypes.c_int), ("v", _AnyValue)]


class _EnvOption(ctypes.Structure):
    _fields_ = [("tag", ctypes.c_int), ("value", _Any)]


class _Metric(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", _Any)]


@dataclass(frozen=True)
class GpuMemoryReading:
    """What the accelerator reported for one compiled model."""

    intermediate: int
    constant: int
    fully_accelerated: bool
    metrics: dict


def _package_dir() -> str:
    import ai_edge_litert

    return os.path.dirname(os.path.abspath(ai_edge_litert.__file__))


@lru_cache(maxsize=1)
def _runtime():
    """(libLiteRt, environment): one environment per process, as the Python wrapper keeps."""
    lib = ctypes.CDLL(os.path.join(_package_dir(), "libLiteRt.so"))
    vp = ctypes.c_void_p
    for name, args in (("LiteRtCreateEnvironment", [ctypes.c_int, ctypes.POINTER(_EnvOption),
                                                    ctypes.POINTER(vp)]),
                       ("LiteRtCreateModelFromFile", [vp, ctypes.c_char_p, ctypes.POINTER(vp)]),
                       ("LiteRtCreateOptions", [ctypes.POINTER(vp)]),
                       ("LiteRtSetOptionsHardwareAccelerators", [vp, ctypes.c_int]),
                       ("LiteRtCreateOpaqueOptions", [ctypes.c_char_p, vp, vp,
                                                      ctypes.POINTER(vp)]),
                       ("LiteRtAddOpaqueOptions", [vp, vp]),
                       ("LiteRtCreateCompiledModel", [vp, vp, vp, ctypes.POINTER(vp)]),
                       ("LiteRtCompiledModelIsFullyAccelerated", [vp, ctypes.POINTER(ctypes.c_bool)]),
                       ("LiteRtCompiledModelStartMetricsCollection", [vp, ctypes.c_int]),
                       ("LiteRtCompiledModelStopMetricsCollection", [vp, vp]),
                       ("LiteRtCreateMetrics", [ctypes.POINTER(vp)]),
                       ("LiteRtGetNumMetrics", [vp, ctypes.POINTER(ctypes.c_int)]),
                       ("LiteRtGetMetric", [vp, ctypes.c_int, ctypes.POINTER(_Metric)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    for name in ("LiteRtDestroyCompiledModel", "LiteRtDestroyModel", "LiteRtDestroyMetrics"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [vp], None
    libdir = _package_dir().encode()
    opt = _EnvOption(_RUNTIME_LIBRARY_DIR, _Any(_ANY_STRING, _AnyValue(str_value=libdir)))
    env = vp()
    _check(lib.LiteRtCreateEnvironment(1, ctypes.byref(opt), ctypes.byref(env)),
           "create the LiteRT environment")
    return lib, env, libdir  # libdir kept alive with the environment that points at it


def _check(status: int, what: str) -> None:
    if status != 0:
        raise MeasurementError(f"LiteRT could not {what} (status {status}).")


def _options(lib, accelerator: str, precision: str):
    vp = ctypes.c_void_p
    opts = vp()
    _check(lib.LiteRtCreateOptions(ctypes.byref(opts)), "create options")
    _check(lib.LiteRtSetOptionsHardwareAccelerators(opts, _ACCELERATORS[accelerator]),
           "select the accelerator")
    payload = _PRECISION_PAYLOAD[precision]
    if payload is not None and accelerator == "gpu":
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = vp, [ctypes.c_size_t]
        buf = libc.malloc(len(payload) + 1)  # the options own and free() their payload
        ctypes.memmove(buf, payload + b"\0", len(payload) + 1)
        opaque = vp()
        free = ctypes.cast(libc.free, vp)
        _check(lib.LiteRtCreateOpaqueOptions(b"gpu_options", buf, free, ctypes.byref(opaque)),
               "create the GPU options")
        _check(lib.LiteRtAddOpaqueOptions(opts, opaque), "add the GPU options")
    return opts


def read_gpu_memory(path: str, precision: str = "fp16",
                    accelerator: str = "gpu") -> GpuMemoryReading:
    """Compile `path` on the accelerator and read its memory metrics.

    `accelerator="cpu"` runs the same calls on a machine without a GPU (no metrics come back).
    """
    if precision not in _PRECISION_PAYLOAD:
        raise MeasurementError(f"The GPU accelerator runs fp16 or fp32, not {precision!r}.")
    lib, env, _ = _runtime()
    vp = ctypes.c_void_p
    model, compiled, metrics = vp(), vp(), vp()
    _check(lib.LiteRtCreateModelFromFile(env, os.fsencode(path), ctypes.byref(model)),
           f"read {path}")
    try:
        opts = _options(lib, accelerator, precision)  # the compiled model takes them over
        _check(lib.LiteRtCreateCompiledModel(env, model, opts, ctypes.byref(compiled)),
               f"compile {path}")
        try:
            full = ctypes.c_bool()
            _check(lib.LiteRtCompiledModelIsFullyAccelerated(compiled, ctypes.byref(full)),
                   "tell whether the model is fully accelerated")
            _check(lib.LiteRtCreateMetrics(ctypes.byref(metrics)), "create metrics")
            _check(lib.LiteRtCompiledModelStartMetricsCollection(compiled, 0),
                   "start metrics collection")
            _check(lib.LiteRtCompiledModelStopMetricsCollection(compiled, metrics),
                   "stop metrics collection")
            values = _metric_values(lib, metrics)
            lib.LiteRtDestroyMetrics(metrics)
        finally:
            lib.LiteRtDestroyCompiledModel(compiled)
    finally:
        lib.LiteRtDestroyModel(model)
    return GpuMemoryReading(int(values.get("gpu_intermediate_memory_bytes", -1)),
                            int(values.get("gpu_constant_memory_bytes", -1)),
                            bool(full.value), values)


def _metric_values(lib, metrics) -> dict:
    n = ctypes.c_int()
    _check(lib.LiteRtGetNumMetrics(metrics, ctypes.byref(n)), "count the metrics")
    out = {}
    for i in range(n.value):
        m = _Metric()
        _check(lib.LiteRtGetMetric(metrics, i, ctypes.byref(m)), "read a metric")
        name = m.name.decode()
        v = m.value
        out[name] = (v.int_value if v.type == _ANY_INT else v.real_value if v.type == 3
                     else v.bool_value if v.type == 1 else
                     (v.str_value.decode() if v.type == _ANY_STRING and v.str_value else None))
    return out
