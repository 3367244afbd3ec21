"""A ctypes binding of libLiteRt.so's C API for profiled runs on the CPU accelerator.

ai-edge-litert's Python API has no profiler, but its libLiteRt.so exports the C API's: a
CompiledModel made with the runtime option `enable_profiling = true` owns a profiler, and the
XNNPACK delegate then records one event per XNNPACK operator and run (ops left to TFLite's own
kernels: one per op). Checked against ai-edge-litert 2.3.0: options are opaque options with a
TOML payload ("runtime_options_string": `enable_profiling`; "xnnpack": `num_threads`);
`ProfiledEventData` is 104 bytes.

`Session` loads, compiles and fills one model, and runs it plain (`run`) or profiled
(`profiled_run`); `op_events` picks the per-op events. `litert_profiler` and `interleaved` time
with it.
"""

from __future__ import annotations

import ctypes as C
import os
import resource
import time
from functools import cache

import numpy as np

from latpred.errors import MeasurementError

# tflite::Profiler::EventType of per-op events: an op run by TFLite's own kernel (metadata1 =
# its node index), an op inside a delegate, an XNNPACK operator (metadata1 = its index).
OP_EVENTS = {2: "tflite", 4: "delegate", 8: "xnnpack"}
INVOKE_EVENT = 16  # GENERAL_RUNTIME_INSTRUMENTATION_EVENT "invoke": the interpreter's Invoke
_HW_CPU = 1  # kLiteRtHwAcceleratorCpu
_LOCK_WRITE = 1  # kLiteRtTensorBufferLockModeWrite
# LiteRtElementType (= TfLiteType) values of inputs we know how to fill.
_ELEMENT_DTYPES = {1: np.float32, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
                   7: np.int16, 9: np.int8, 10: np.float16}


class _Event(C.Structure):
    """litert/c/litert_profiler_event.h `ProfiledEventData` (memory usage: 2 x 3 x 8 bytes)."""

    _fields_ = [("tag", C.c_char_p), ("event_type", C.c_int), ("start_us", C.c_uint64),
                ("elapsed_us", C.c_uint64), ("memory", C.c_int64 * 6), ("metadata1", C.c_int64),
                ("metadata2", C.c_int64), ("source", C.c_int)]


@cache
def library() -> C.CDLL:
    """libLiteRt.so of the installed ai-edge-litert, its functions declared (once)."""
    try:
        import ai_edge_litert
    except ImportError:
        raise MeasurementError("ai-edge-litert is not installed; cannot profile ops.") from None
    path = os.path.join(os.path.dirname(ai_edge_litert.__file__), "libLiteRt.so")
    if not os.path.exists(path):
        raise MeasurementError(f"ai-edge-litert has no libLiteRt.so at {path}.")
    lib = C.CDLL(path)
    if not hasattr(lib, "LiteRtCompiledModelGetProfiler"):
        raise MeasurementError("This libLiteRt.so has no profiler API.")
    _declare(lib)
    return lib


def _declare(lib: C.CDLL) -> None:
    """Argument types: without them ctypes would pass 64-bit handles as 32-bit ints."""
    P, PP, S, I = C.c_void_p, C.POINTER(C.c_void_p), C.c_size_t, C.c_int
    sigs = {
        "CreateEnvironment": [I, P, PP], "CreateModelFromBuffer": [P, P, S, PP],
        "CreateOptions": [PP], "SetOptionsHardwareAccelerators": [P, I],
        "CreateOpaqueOptions": [C.c_char_p, P, P, PP], "AddOpaqueOptions": [P, P],
        "CreateCompiledModel": [P, P, P, PP], "GetModelSignature": [P, S, PP],
        "GetNumSignatureInputs": [P, C.POINTER(S)], "GetNumSignatureOutputs": [P, C.POINTER(S)],
        "GetSignatureInputTensorByIndex": [P, S, PP],
        "GetSignatureOutputTensorByIndex": [P, S, PP], "GetRankedTensorType": [P, P],
        "GetCompiledModelInputBufferRequirements": [P, S, S, PP],
        "GetCompiledModelOutputBufferRequirements": [P, S, S, PP],
        "CreateManagedTensorBufferFromRequirements": [P, P, P, PP],
        "GetTensorBufferSize": [P, C.POINTER(S)], "LockTensorBuffer": [P, PP, I],
        "UnlockTensorBuffer": [P], "RunCompiledModel": [P, S, S, P, S, P],
        "CompiledModelGetProfiler": [P, PP], "StartProfiler": [P], "StopProfiler": [P],
        "ResetProfiler": [P], "GetNumProfilerEvents": [P, C.POINTER(I)],
        "GetProfilerEvents": [P, I, P],
    }
    for name, args in sigs.items():
        fn = getattr(lib, "LiteRt" + name)
        fn.argtypes, fn.restype = args, I
    for name in ("Environment", "Model", "Options", "OpaqueOptions", "CompiledModel",
                 "TensorBuffer"):
        fn = getattr(lib, "LiteRtDestroy" + name)
        fn.argtypes, fn.restype = [P], None


@cache
def _libc() -> C.CDLL:
    libc = C.CDLL(None)
    libc.strdup.argtypes, libc.strdup.restype = [C.c_char_p], C.c_void_p
    libc.free.argtypes, libc.free.restype = [C.c_void_p], None
    return libc


def check(status: int, what: str) -> None:
    """A C API call's status as a `MeasurementError` naming what failed."""
    if status != 0:
        raise MeasurementError(f"LiteRT failed to {what} (status {status}).")


class Session:
    """A profiling-enabled CompiledModel with its buffers; `close()` frees everything."""

    def __init__(self, model: bytes, threads: int, seed: int) -> None:
        self.lib = library()
        self._model_buf = C.create_string_buffer(model, len(model))  # LiteRT keeps a pointer
        self.env, self.model, self.compiled = C.c_void_p(), C.c_void_p(), C.c_void_p()
        self.profiler = C.c_void_p()  # owned by the compiled model
        self.inputs, self.outputs = (C.c_void_p * 0)(), (C.c_void_p * 0)()
        try:
            self._open(threads, seed)
        except BaseException:
            self.close()
            raise

    def _open(self, threads: int, seed: int) -> None:
        lib = self.lib
        check(lib.LiteRtCreateEnvironment(0, None, C.byref(self.env)), "create an environment")
        check(lib.LiteRtCreateModelFromBuffer(self.env, C.cast(self._model_buf, C.c_void_p),
                                               len(self._model_buf), C.byref(self.model)),
               "load the model")
        options = self._options(threads)
        try:
            check(lib.LiteRtCreateCompiledModel(self.env, self.model, options,
                                                 C.byref(self.compiled)), "compile the model")
        finally:
            lib.LiteRtDestroyOptions(options)
        signature = C.c_void_p()
        check(lib.LiteRtGetModelSignature(self.model, 0, C.byref(signature)), "get a signature")
        elements = self._buffers(signature, "Input")
        self._buffers(signature, "Output")
        self._fill_inputs(elements, seed)
        check(lib.LiteRtCompiledModelGetProfiler(self.compiled, C.byref(self.profiler)),
               "get the profiler")
        if not self.profiler:
            raise MeasurementError("LiteRT compiled the model without a profiler.")

    def _options(self, threads: int) -> C.c_void_p:
        """CPU accelerator, profiling on, `threads` XNNPACK threads."""
        lib, libc = self.lib, _libc()
        options = C.c_void_p()
        check(lib.LiteRtCreateOptions(C.byref(options)), "create options")
        try:
            check(lib.LiteRtSetOptionsHardwareAccelerators(options, _HW_CPU), "select the CPU")
            for ident, toml in ((b"runtime_options_string", b"enable_profiling = true\n"),
                                (b"xnnpack", b"num_threads = %d\n" % threads)):
                opaque, payload = C.c_void_p(), libc.strdup(toml)
                free = C.cast(libc.free, C.c_void_p)  # what the opaque options free it with
                if lib.LiteRtCreateOpaqueOptions(ident, payload, free, C.byref(opaque)) != 0:
                    libc.free(payload)
                    raise MeasurementError(f"LiteRT refused the {ident.decode()} options.")
                if lib.LiteRtAddOpaqueOptions(options, opaque) != 0:
                    lib.LiteRtDestroyOpaqueOptions(opaque)
                    raise MeasurementError(f"LiteRT refused the {ident.decode()} options.")
        except BaseException:
            lib.LiteRtDestroyOptions(options)
            raise
        return options

    def _buffers(self, signature: C.c_void_p, side: str) -> list[int]:
        """Managed buffers for the signature's "Input"s or "Output"s (kept on self so that
        `close` frees them even when one fails); returns their element types."""
        lib, count = self.lib, C.c_size_t()
        check(getattr(lib, f"LiteRtGetNumSignature{side}s")(signature, C.byref(count)),
               "count the model's tensors")
        buffers = (C.c_void_p * count.value)()
        setattr(self, side.lower() + "s", buffers)
        tensor_of = getattr(lib, f"LiteRtGetSignature{side}TensorByIndex")
        needs = getattr(lib, f"LiteRtGetCompiledModel{side}BufferRequirements")
        elements = []
        for i in range(count.value):
            tensor, requirements = C.c_void_p(), C.c_void_p()
            tensor_type = C.create_string_buffer(512)  # LiteRtRankedTensorType, opaque here
            check(tensor_of(signature, i, C.byref(tensor)), "get a tensor")
            check(lib.LiteRtGetRankedTensorType(tensor, tensor_type), "get a tensor type")
            elements.append(int.from_bytes(tensor_type.raw[:4], "little"))  # element_type
            check(needs(self.compiled, 0, i, C.byref(requirements)), "get buffer needs")
            check(lib.LiteRtCreateManagedTensorBufferFromRequirements(
                self.env, tensor_type, requirements, C.byref(tensor)), "create a buffer")
            buffers[i] = tensor
        return elements

    def _fill_inputs(self, elements: list[int], seed: int) -> None:
        """Seeded random inputs: latency does not depend on values, but NaNs/denormals could."""
        rng, lib = np.random.default_rng(seed), self.lib
        for buffer, element in zip(self.inputs, elements):
            dtype = _ELEMENT_DTYPES.get(element)
            if dtype is None:
                raise MeasurementError(f"Cannot fill a model input of LiteRT type {element}.")
            size, addr = C.c_size_t(), C.c_void_p()
            check(lib.LiteRtGetTensorBufferSize(buffer, C.byref(size)), "size a buffer")
            count = size.value // np.dtype(dtype).itemsize
            data = (rng.uniform(-1.0, 1.0, count) if np.issubdtype(dtype, np.floating)
                    else rng.integers(0, 2 if dtype == np.bool_ else 100, count)).astype(dtype)
            check(lib.LiteRtLockTensorBuffer(buffer, C.byref(addr), _LOCK_WRITE), "lock a buffer")
            C.memmove(addr, data.ctypes.data, data.nbytes)
            check(lib.LiteRtUnlockTensorBuffer(buffer), "unlock a buffer")

    def run(self) -> tuple[int, int, bool]:
        """One run: its wall-clock and this thread's CPU nanoseconds, and whether the thread was
        preempted meanwhile (an involuntary context switch)."""
        switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        status = self.lib.LiteRtRunCompiledModel(self.compiled, 0, len(self.inputs),
                                                 self.inputs, len(self.outputs), self.outputs)
        wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
        check(status, "run the model")
        return wall, cpu, resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw != switches

    def events(self) -> list[tuple[int, str, int, int]]:
        """(event type, tag, elapsed us, metadata1) of what the profiler holds now."""
        count = C.c_int()
        check(self.lib.LiteRtGetNumProfilerEvents(self.profiler, C.byref(count)),
               "count profiler events")
        raw = (_Event * count.value)()
        if count.value:
            check(self.lib.LiteRtGetProfilerEvents(self.profiler, count.value, raw),
                   "read profiler events")
        return [(e.event_type, (e.tag or b"").decode(errors="replace"), int(e.elapsed_us),
                 int(e.metadata1)) for e in raw]

    def profiled_run(self) -> tuple[int, int, bool, list[tuple[int, str, int, int]]]:
        """One run with the profiler on (reset first): `run`'s figures and the events."""
        lib = self.lib
        check(lib.LiteRtResetProfiler(self.profiler), "reset the profiler")
        check(lib.LiteRtStartProfiler(self.profiler), "start the profiler")
        wall_ns, cpu_ns, switched = self.run()
        check(lib.LiteRtStopProfiler(self.profiler), "stop the profiler")
        return wall_ns, cpu_ns, switched, self.events()

    def close(self) -> None:
        lib = self.lib
        for buffer in [*self.inputs, *self.outputs]:
            if buffer:
                lib.LiteRtDestroyTensorBuffer(buffer)
        self.inputs, self.outputs = (C.c_void_p * 0)(), (C.c_void_p * 0)()
        # The compiled model owns the profiler; the model and environment outlive it.
        for handle, destroy in ((self.compiled, lib.LiteRtDestroyCompiledModel),
                                (self.model, lib.LiteRtDestroyModel),
                                (self.env, lib.LiteRtDestroyEnvironment)):
            if handle:
                destroy(handle)
        self.compiled, self.model, self.env = C.c_void_p(), C.c_void_p(), C.c_void_p()


def op_events(events: list[tuple[int, str, int, int]]) -> list[tuple[tuple[int, str, str], int]]:
    """The per-op events of a run, as ((index, tag, source), elapsed us)."""
    return [((index, tag, OP_EVENTS[kind]), us) for kind, tag, us, index in events
            if kind in OP_EVENTS]
