"""Time .tflite models with LiteRT's GPU accelerator (ML Drift over WebGPU/Vulkan on the H100).

The protocol, as proven on the device machine (docs/measurement.md has the figures):

- compile with `HardwareAccelerator.GPU` alone, fp16 unless fp32 is asked for (`enforce_f32`),
  and record `is_fully_accelerated()`. With the GPU alone LiteRT 2.3.0 refuses a model that
  would leave ops to the CPU ("Some ops are not accelerated", litert/runtime/compiled_model.cc;
  the zoo's ShuffleNetV2 failed so), and TFLite refuses the delegate for a graph with run-time
  shapes (`latpred.deduce.gpu`, `_check_static_shapes`): such models fail to compile rather
  than fall back. A model that did compile and still reported a CPU part would be timed but
  recorded as failed (`cpu_fallback`), never silently mixed with the rest;
- `run_by_index` does not wait for the GPU: it returns after about 0.05-0.1 ms of host work
  while the GPU may still be busy for longer. So single calls are not timed; a pass times many
  back-to-back calls and ends with a read-back of one output, which waits for the GPU; the
  read-back's own cost (measured again right after, on an idle GPU) is taken out. A pass's
  mean is the steady-state time per call: the larger of the host's and the GPU's work;
- after a warm-up, one calibration pass sizes the passes so that each lasts about `pass_ms`
  (the read-back's jitter is then small against it); the latency is the median of the pass
  means;
- one process times while no other process uses the GPU (`GpuLock`): many may compile at once,
  but they hold the lock shared and the timer holds it exclusively. The host matters as much:
  a lone kernel's time is mostly the host's submission, which CPU-heavy neighbours slow down.

The summary keeps every estimator the probe compared (`Estimates`) and the protocol names the
one reported as the latency.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from latpred.errors import MeasurementError
from latpred.profile.gpu_lock import GpuLock
# The timing protocol lives in gpu_timing; callers (scripts, tests) use these names from here.
from latpred.profile.gpu_timing import (ESTIMATORS, Estimates, GpuProtocol,  # noqa: F401
                                        PassTimes, estimate, time_models, time_pass,
                                        trimmed_mean)

PRECISIONS = ("fp16", "fp32")
ACCELERATORS = ("gpu", "cpu")


# -- compiling and running ------------------------------------------------------------------------
def runtime_version() -> str:
    """The installed LiteRT (ai-edge-litert) version."""
    from importlib.metadata import version

    return version("ai-edge-litert")


def _options(accelerator: str, precision: str):
    from ai_edge_litert.compiled_model import (CpuOptions, GpuOptions, HardwareAccelerator,
                                               Options)

    if accelerator not in ACCELERATORS:
        raise MeasurementError(f"Unknown accelerator {accelerator!r}; use one of {ACCELERATORS}.")
    if precision not in PRECISIONS:
        raise MeasurementError(f"The GPU accelerator runs {' or '.join(PRECISIONS)}, "
                               f"not {precision!r}.")
    if accelerator == "cpu":  # the same code path on a machine without a GPU (tests, dry runs)
        return Options(hardware_accelerators=HardwareAccelerator.CPU,
                       cpu_options=CpuOptions(num_threads=1))
    return Options(hardware_accelerators=HardwareAccelerator.GPU,
                   gpu_options=GpuOptions(enforce_f32=precision == "fp32"))


@dataclass
class LoadedModel:
    """A compiled model with its input and output buffers, ready to run (holds runtime state)."""

    key: str
    model: object = field(repr=False)
    inputs: list = field(repr=False)
    outputs: list = field(repr=False)
    fully_accelerated: bool
    compile_s: float
    sync_elements: int
    sync_dtype: np.dtype

    def run(self) -> None:
        self.model.run_by_index(0, self.inputs, self.outputs)

    def sync(self) -> None:
        """Read one output back; a read waits until the GPU has written it."""
        self.outputs[0].read(self.sync_elements, self.sync_dtype)


def new_environment():
    """A LiteRT environment to share between the models of a process.

    Each environment opens its own GPU device; sharing one keeps compilation cheap and keeps all
    of a process's models on one device queue.
    """
    from ai_edge_litert.compiled_model import Environment, EnvironmentOptions
    import ai_edge_litert.compiled_model as cm

    return Environment.create(options=EnvironmentOptions(
        runtime_path=os.path.dirname(os.path.abspath(cm.__file__))))


def load(key: str, model_bytes: bytes, precision: str = "fp16", accelerator: str = "gpu",
         seed: int = 0, environment=None) -> LoadedModel:
    """Compile `model_bytes` for the accelerator, fill its inputs with seeded random data."""
    from ai_edge_litert.compiled_model import CompiledModel

    start = time.perf_counter()
    try:
        model = CompiledModel.from_buffer(model_bytes, environment=environment,
                                          options=_options(accelerator, precision))
        inputs = model.create_input_buffers(0)
        outputs = model.create_output_buffers(0)
    except (RuntimeError, ValueError) as err:
        raise MeasurementError(f"LiteRT cannot compile the model for the {accelerator}: "
                               f"{_first_line(err)}") from None
    compile_s = time.perf_counter() - start
    if not outputs:
        raise MeasurementError("The model has no outputs to wait for.")
    _fill_inputs(model, inputs, seed)
    details = outputs[0].get_tensor_details()
    shape = details.get("shape") or (1,)
    return LoadedModel(key=key, model=model, inputs=inputs, outputs=outputs,
                       fully_accelerated=model.is_fully_accelerated(), compile_s=compile_s,
                       sync_elements=int(np.prod(shape)),
                       sync_dtype=np.dtype(details.get("dtype", "float32")))


def _fill_inputs(model, inputs: list, seed: int) -> None:
    rng = np.random.default_rng(seed)
    details = model.get_input_tensor_details(_signature_key(model))
    for buffer, detail in zip(inputs, details.values()):
        shape = tuple(int(d) for d in detail["shape"])
        dtype = np.dtype(detail.get("dtype", np.float32))
        if np.issubdtype(dtype, np.floating):
            data = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        else:
            data = rng.integers(0, 8, size=shape).astype(dtype)
        buffer.write(data)


def _signature_key(model) -> str:
    return next(iter(model.get_signature_list()))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# -- one batch, as a worker process runs it -------------------------------------------------------
@dataclass(frozen=True)
class GpuResult:
    """What became of one model of a batch.

    `status` "ok", or "failed" with `error` (compilation failed, the run failed). A model that
    is not fully accelerated is timed all the same and keeps `fully_accelerated=False`; the
    dataset records it as failed with a `cpu_fallback` error so it is never mistaken for a
    GPU-only figure.
    """

    key: str
    status: str
    error: str = ""
    fully_accelerated: bool | None = None
    compile_s: float | None = None
    estimates: Estimates | None = None

    def as_dict(self) -> dict:
        out = {"key": self.key, "status": self.status, "error": self.error,
               "fully_accelerated": self.fully_accelerated, "compile_s": self.compile_s}
        if self.estimates is not None:
            out.update(self.estimates.as_dict())
            out["pass_means_ms"] = list(self.estimates.pass_means_ms)
        return out


def measure_batch(models: Sequence[tuple[str, bytes]], protocol: GpuProtocol,
                  lock_path: str | os.PathLike | None = None, precision: str = "fp16",
                  accelerator: str = "gpu", seed: int = 0, environment=None,
                  together: bool = True) -> list[GpuResult]:
    """Compile and check every model (lock shared), time the compiled ones (lock exclusive),
    release them (shared again); see `GpuLock`.

    A model that fails to compile or to run becomes a failed result; the others go on. With
    `together=False` each model is compiled, timed and released before the next one.
    """
    if not together:
        return [r for item in models
                for r in measure_batch([item], protocol, lock_path, precision, accelerator,
                                       seed, environment, together=True)]
    lock = GpuLock(lock_path)
    results: dict[str, GpuResult] = {}
    runnable: list[LoadedModel] = []
    for key, data in models:
        with lock.shared():  # one model at a time, so a waiting timer waits one compile at most
            outcome = _prepare(key, data, precision, accelerator, seed, environment)
        if isinstance(outcome, GpuResult):
            results[key] = outcome
        else:
            runnable.append(outcome)
    if runnable:
        with lock.exclusive():
            passes = time_models(runnable, protocol)
        for model, model_passes in zip(runnable, passes):
            results[model.key] = GpuResult(model.key, "ok",
                                           fully_accelerated=model.fully_accelerated,
                                           compile_s=model.compile_s,
                                           estimates=estimate(model_passes, protocol))
        with lock.shared():  # freeing GPU memory is GPU work too
            runnable.clear()
    return [results[key] for key, _ in models]


def _prepare(key: str, data: bytes, precision: str, accelerator: str, seed: int,
             environment) -> LoadedModel | GpuResult:
    """A compiled model that ran once, or the failed result saying why it did not."""
    try:
        model = load(key, data, precision, accelerator, seed, environment)
    except MeasurementError as err:
        return GpuResult(key, "failed", error=str(err))
    try:  # one untimed run: a model that cannot run fails alone, before any timing
        model.run()
        model.sync()
    except (RuntimeError, ValueError) as err:
        return GpuResult(key, "failed", fully_accelerated=model.fully_accelerated,
                         compile_s=model.compile_s,
                         error=f"LiteRT failed to run the model: {_first_line(err)}")
    return model


def stats_row(result: GpuResult) -> dict:
    """The dataset's latency columns for one result (docs/interfaces.md), plus GPU extras.

    A model that is not fully accelerated keeps its figures but is stored as `failed` with a
    `cpu_fallback` error: it is a real latency of this runtime, but not a GPU-only one.
    """
    status, error = result.status, result.error
    if status == "ok" and result.fully_accelerated is False:
        status, error = "failed", "cpu_fallback: part of the model runs on the CPU"
    e = result.estimates
    nan = float("nan")
    return {"status": status, "error": error,
            "latency_ms": e.latency_ms if e else nan,
            "latency_iqr_ms": e.iqr_ms if e else nan,
            "latency_min_ms": e.min_ms if e else nan,
            "n_runs": e.n_runs if e else 0,
            "latency_call_median_ms": e.call_median_ms if e else nan,
            "fully_accelerated": result.fully_accelerated,
            "compile_s": result.compile_s if result.compile_s is not None else nan}
