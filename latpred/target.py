"""Targets: where latency is predicted or measured.

A target is a device (a profile of `latpred.device_profile`), a processor, a precision and, on
CPU, the cores used. Targets are written as short strings: `pixel4/gpu/fp16`,
`pixel4/cpu/fp32/1L+3M`, `host/cpu/int8/t2`. A device with a `cuda:` runtime is targeted as
`h100/cuda/fp16` (batch 1) or `h100/cuda/fp16/b32`: the optional fourth part of a CUDA target
is its batch size, written `b<N>` (omitted for batch 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from latpred.device_profile import (DEVICES_DIR, PROCESSORS, DeviceProfile, load_device,
                                    parse_cores)
from latpred.errors import TargetError

@dataclass(frozen=True)
class Target:
    """Where latency is predicted or measured; `str(target)` is the canonical target string."""

    device: DeviceProfile
    processor: str
    precision: str
    threads: int
    cores: str = ""
    batch: int = 1

    @property
    def runtime(self) -> str:
        if self.processor == "cuda":
            return self.device.cuda.runtime
        return self.device.runtime

    @property
    def runtime_version(self) -> str:
        if self.processor == "cuda":
            return self.device.cuda.runtime_version
        return self.device.runtime_version

    @property
    def is_gpu(self) -> bool:
        """Whether the target runs on the GPU (the TFLite/LiteRT delegate or a CUDA runtime)."""
        return self.processor in ("gpu", "cuda")

    @property
    def is_cuda(self) -> bool:
        return self.processor == "cuda"

    def __str__(self) -> str:
        parts = [self.device.name, self.processor, self.precision]
        if self.processor == "cpu":
            parts.append(self.cores)
        elif self.processor == "cuda" and self.batch != 1:
            parts.append(f"b{self.batch}")
        return "/".join(parts)


# -- target strings ------------------------------------------------------------------------------
def parse_target(text: str, directory: str | Path | None = None) -> Target:
    """Parse `device/processor/precision[/cores]`; errors list what exists."""
    if isinstance(text, Target):
        return text
    return _parse_target(str(text).strip(), str(directory) if directory else str(DEVICES_DIR))


@lru_cache(maxsize=1024)
def _parse_target(text: str, directory: str) -> Target:
    parts = text.split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise TargetError(f"Target {text!r} must look like device/processor/precision[/cores], "
                          "e.g. pixel4/gpu/fp16 or pixel4/cpu/fp32/1L+3M.")
    device = load_device(parts[0], directory)
    processor, precision = parts[1], parts[2]
    if processor == "cuda":
        return _cuda_target(device, precision, parts[3] if len(parts) == 4 else "b1")
    if processor not in PROCESSORS or (processor == "gpu" and device.gpu is None):
        have = "cpu, gpu" if device.gpu is not None else "cpu"
        raise TargetError(f"Device {device.name} has no processor {processor!r}; it has {have}.")
    allowed = device.gpu.precisions if processor == "gpu" else device.cpu_precisions
    if precision not in allowed:
        raise TargetError(f"Precision {precision!r} is not available on {device.name}/{processor};"
                          f" available: {', '.join(allowed)}.")
    if processor == "gpu":
        if len(parts) == 4:
            raise TargetError(f"A GPU target takes no core set; write {'/'.join(parts[:3])}.")
        return Target(device, processor, precision, threads=1, cores="")
    cores, threads = parse_cores(device, parts[3] if len(parts) == 4 else device.default_cores)
    return Target(device, processor, precision, threads=threads, cores=cores)


def _cuda_target(device: DeviceProfile, precision: str, batch_text: str) -> Target:
    cuda = device.cuda
    if cuda is None:
        have = "cpu, gpu" if device.gpu is not None else "cpu"
        raise TargetError(f"Device {device.name} has no processor 'cuda'; it has {have}.")
    if precision not in cuda.precisions:
        raise TargetError(f"Precision {precision!r} is not available on {device.name}/cuda;"
                          f" available: {', '.join(cuda.precisions)}.")
    m = re.fullmatch(r"b(\d+)", batch_text)
    if not m or int(m.group(1)) not in cuda.batches:
        sizes = ", ".join(f"b{b}" for b in cuda.batches)
        raise TargetError(f"Batch {batch_text!r} is not valid on {device.name}/cuda; use one of "
                          f"{sizes}.")
    return Target(device, "cuda", precision, threads=1, cores="", batch=int(m.group(1)))


def target_strings(device: DeviceProfile) -> list[str]:
    """A few valid target strings for a device (its GPU targets and its default CPU ones)."""
    out = []
    if device.gpu is not None:
        out += [f"{device.name}/gpu/{p}" for p in device.gpu.precisions]
    if device.cuda is not None:
        out += [f"{device.name}/cuda/{p}" for p in device.cuda.precisions]
    out += [f"{device.name}/cpu/{p}/{device.default_cores}" for p in device.cpu_precisions]
    return out
