"""Device profiles: one machine and the runtime that executes models on it.

A *device profile* (`configs/devices/<name>.yaml`) describes one machine: its SoC, CPU clusters,
GPU hardware figures, and the runtime (TFLite/LiteRT and its version) that executes models there,
including which GPU-delegate rule set applies. A profile may also have a `cuda:` section: a
second runtime on the same GPU (PyTorch with cuDNN, `pytorch-cuda`). Targets on a device
(`latpred.target`) name one of its processors, a precision and the cores.

Profiles are validated when loaded and cached by name, so a NAS loop never reads a file twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from latpred.errors import ConfigError, TargetError

DEVICES_DIR = Path(__file__).resolve().parent.parent / "configs" / "devices"

PROCESSORS = ("cpu", "gpu", "cuda")
PRECISIONS = ("fp32", "fp16", "int8")
GPU_VENDORS = ("adreno", "mali", "powervr", "apple", "nvidia", "amd", "intel")
GPU_APIS = ("opencl", "metal", "opengl", "vulkan", "webgpu")
CORE_MODES = ("clusters", "threads")


@dataclass(frozen=True)
class CpuCluster:
    """A group of identical CPU cores. `name` is the letter used in core sets ("L", "M", "S")."""

    name: str
    count: int
    freq_ghz: float | None = None
    core: str = ""


@dataclass(frozen=True)
class GpuSpec:
    """The GPU figures that kernel selection and the analytical features need.

    Counts are per device; `registers_per_cu` counts 32-bit registers of one compute unit (SM,
    shader core, SP); `wave_size` is the threads of one warp / wave / SIMD group. Unknown figures
    are None rather than guessed.
    """

    vendor: str
    model: str
    family: str
    api: str
    compute_units: int | None = None
    wave_size: int | None = None
    registers_per_cu: int | None = None
    max_waves_per_cu: int | None = None
    cache_line_bytes: int | None = None
    l2_bytes: int | None = None
    precisions: tuple[str, ...] = ("fp16", "fp32")
    # Analytical features (latpred/features/tile.py, tmmodel.py): the (blkM, blkN) output tiles
    # the GPU's GEMM/conv kernels use, and the L1 / texture cache size; empty / None if unknown.
    tile_shapes: tuple[tuple[int, int], ...] = ()
    l1_bytes: int | None = None
    # WebGPU's per-shader-stage binding limits (maxStorageBuffersPerShaderStage,
    # maxStorageTexturesPerShaderStage) as the runtime's device reports them; ML Drift splits
    # wider concatenations and splits into chains (latpred/memory/gpu_delegate.py).
    storage_buffers_per_stage: int | None = None
    storage_textures_per_stage: int | None = None

    @property
    def generation(self) -> int | None:
        """The leading digit of an Adreno model number (6 for Adreno 640), else None."""
        if self.vendor != "adreno":
            return None
        m = re.search(r"(\d)\d\d", self.model)
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CudaSpec:
    """A CUDA runtime on the device's GPU (PyTorch eager with cuDNN, timed by CUDA-graph replay).

    `rules` names the kernel-deduction rule set (`latpred.deduce.rulesets.CUDA_RULES`);
    `batches` lists the batch sizes its targets may name.
    """

    runtime: str
    runtime_version: str
    rules: str
    precisions: tuple[str, ...] = ("fp16", "fp32")
    batches: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class DeviceProfile:
    """One machine and the runtime that executes models on it."""

    name: str
    display_name: str
    soc: str
    runtime: str
    runtime_version: str
    cpu_arch: str
    core_mode: str
    clusters: tuple[CpuCluster, ...]
    cpu_precisions: tuple[str, ...]
    cpu_rules: str
    default_cores: str
    gpu: GpuSpec | None = None
    gpu_rules: str | None = None
    cuda: CudaSpec | None = None

    @property
    def total_cores(self) -> int:
        return sum(c.count for c in self.clusters)

    def cluster(self, letter: str) -> CpuCluster | None:
        for c in self.clusters:
            if c.name == letter:
                return c
        return None


# -- loading device profiles ---------------------------------------------------------------------
def available_devices(directory: str | Path | None = None) -> tuple[str, ...]:
    """Names of the device profiles in `directory` (default: the shipped `configs/devices`)."""
    d = Path(directory) if directory is not None else DEVICES_DIR
    return tuple(sorted(p.stem for p in d.glob("*.yaml")))


def load_device(name: str, directory: str | Path | None = None) -> DeviceProfile:
    """The validated profile `name`; cached, so repeated calls do no file I/O."""
    return _load_device(name, str(directory) if directory is not None else str(DEVICES_DIR))


@lru_cache(maxsize=None)
def _load_device(name: str, directory: str) -> DeviceProfile:
    path = Path(directory) / f"{name}.yaml"
    if not re.fullmatch(r"[a-z0-9_\-]+", name) or not path.is_file():
        known = ", ".join(available_devices(directory)) or "none"
        raise TargetError(f"Unknown device {name!r}; known devices: {known}.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"Device profile {path} is not valid YAML: {err}.") from None
    return parse_profile(raw, source=str(path), name=name)


def parse_profile(raw: Any, source: str = "<profile>", name: str | None = None) -> DeviceProfile:
    """Validate a profile's YAML content; every problem is a one-sentence ConfigError."""
    r = _Reader(raw, source)
    prof_name = r.text("name")
    if name is not None and prof_name != name:
        raise ConfigError(f"{source}: name {prof_name!r} does not match the file name {name!r}.")
    cpu = _Reader(r.get("cpu", dict), f"{source}: cpu")
    clusters = tuple(_cluster(c, f"{source}: cpu.clusters[{i}]")
                     for i, c in enumerate(cpu.get("clusters", list)))
    if not clusters:
        raise ConfigError(f"{source}: cpu.clusters must list at least one cluster.")
    if len({c.name for c in clusters}) != len(clusters):
        raise ConfigError(f"{source}: cpu.clusters has duplicate cluster letters.")
    gpu_raw = r.get("gpu", (dict, type(None)), required=False)
    gpu = _gpu(gpu_raw, f"{source}: gpu") if gpu_raw is not None else None
    gpu_rules = r.get("gpu_rules", (str, type(None)), required=False)
    if (gpu is None) != (gpu_rules is None):
        raise ConfigError(f"{source}: gpu and gpu_rules must be given together.")
    cuda_raw = r.get("cuda", (dict, type(None)), required=False)
    cuda = _cuda(cuda_raw, f"{source}: cuda") if cuda_raw is not None else None
    if cuda is not None and gpu is None:
        raise ConfigError(f"{source}: a cuda runtime needs the gpu section.")
    profile = DeviceProfile(
        name=prof_name, display_name=r.text("display_name"), soc=r.text("soc"),
        runtime=r.text("runtime"), runtime_version=str(r.get("runtime_version", (str, int, float))),
        cpu_arch=cpu.text("arch"), core_mode=cpu.choice("core_mode", CORE_MODES),
        clusters=clusters, cpu_precisions=cpu.choices("precisions", PRECISIONS),
        cpu_rules=cpu.text("rules"), default_cores=cpu.text("default_cores"),
        gpu=gpu, gpu_rules=gpu_rules, cuda=cuda)
    r.no_extra({"name", "display_name", "soc", "runtime", "runtime_version", "cpu", "gpu",
                "gpu_rules", "cuda"})
    cpu.no_extra({"arch", "core_mode", "clusters", "precisions", "rules", "default_cores"})
    if profile.core_mode == "threads" and len(clusters) != 1:
        raise ConfigError(f"{source}: core_mode 'threads' needs exactly one cluster.")
    _check_rules(profile, source)
    parse_cores(profile, profile.default_cores)  # the default must itself be valid
    return profile


def _check_rules(profile: DeviceProfile, source: str) -> None:
    # Imported here: deduce imports target, and rule sets live with the deduction code.
    from latpred.deduce.rulesets import CPU_RULES, CUDA_RULES, GPU_RULES

    if profile.cpu_rules not in CPU_RULES:
        raise ConfigError(f"{source}: unknown cpu.rules {profile.cpu_rules!r}; "
                          f"known: {', '.join(sorted(CPU_RULES))}.")
    if profile.gpu_rules is not None and profile.gpu_rules not in GPU_RULES:
        raise ConfigError(f"{source}: unknown gpu_rules {profile.gpu_rules!r}; "
                          f"known: {', '.join(sorted(GPU_RULES))}.")
    if profile.cuda is not None and profile.cuda.rules not in CUDA_RULES:
        raise ConfigError(f"{source}: unknown cuda.rules {profile.cuda.rules!r}; "
                          f"known: {', '.join(sorted(CUDA_RULES))}.")


def _cuda(raw: Any, source: str) -> CudaSpec:
    r = _Reader(raw, source)
    batches = r.get("batches", list, required=False) or [1]
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in batches):
        raise ConfigError(f"{source}: batches must be a list of positive integers.")
    spec = CudaSpec(runtime=r.text("runtime"),
                    runtime_version=str(r.get("runtime_version", (str, int, float))),
                    rules=r.text("rules"), precisions=r.choices("precisions", ("fp16", "fp32")),
                    batches=tuple(batches))
    r.no_extra({"runtime", "runtime_version", "rules", "precisions", "batches"})
    return spec


def _cluster(raw: Any, source: str) -> CpuCluster:
    r = _Reader(raw, source)
    c = CpuCluster(name=r.text("name"), count=r.integer("count"),
                   freq_ghz=r.get("freq_ghz", (int, float, type(None)), required=False),
                   core=r.get("core", str, required=False) or "")
    r.no_extra({"name", "count", "freq_ghz", "core"})
    if not re.fullmatch(r"[A-Z]", c.name):
        raise ConfigError(f"{source}: name must be one capital letter, got {c.name!r}.")
    return c


def _gpu(raw: Any, source: str) -> GpuSpec:
    r = _Reader(raw, source)
    opt = {k: r.integer(k, required=False) for k in ("compute_units", "wave_size",
                                                  "registers_per_cu", "max_waves_per_cu",
                                                  "cache_line_bytes", "l2_bytes", "l1_bytes",
                                                  "storage_buffers_per_stage",
                                                  "storage_textures_per_stage")}
    g = GpuSpec(vendor=r.choice("vendor", GPU_VENDORS), model=r.text("model"),
                family=r.text("family"), api=r.choice("api", GPU_APIS),
                precisions=r.choices("precisions", ("fp16", "fp32")),
                tile_shapes=_tile_shapes(r.get("tile_shapes", list, required=False), source),
                **opt)
    r.no_extra({"vendor", "model", "family", "api", "precisions", "tile_shapes", *opt})
    return g


def _tile_shapes(raw: list | None, source: str) -> tuple[tuple[int, int], ...]:
    """`tile_shapes: [[blkM, blkN], ...]`, positive integers."""
    if raw is None:
        return ()
    ok = all(isinstance(t, list) and len(t) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in t) for t in raw)
    if not ok:
        raise ConfigError(f"{source}: gpu.tile_shapes must be a list of [blkM, blkN] pairs "
                          "of positive integers.")
    return tuple((t[0], t[1]) for t in raw)


class _Reader:
    """Typed access to one mapping of a profile, with errors that name the file and key."""

    def __init__(self, raw: Any, source: str):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source} must be a mapping, got {type(raw).__name__}.")
        self.raw, self.source = raw, source

    def get(self, key: str, types, required: bool = True) -> Any:
        if key not in self.raw:
            if required:
                raise ConfigError(f"{self.source}: missing key {key!r}.")
            return None
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ConfigError(f"{self.source}: {key} has the wrong type "
                              f"({type(value).__name__}).")
        return value

    def text(self, key: str) -> str:
        return self.get(key, str)

    def integer(self, key: str, required: bool = True) -> int | None:
        value = self.get(key, (int, type(None)), required=required)
        if value is not None and value < 1:
            raise ConfigError(f"{self.source}: {key} must be a positive integer, got {value}.")
        return value

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in allowed:
            raise ConfigError(f"{self.source}: {key} {value!r} is not one of {', '.join(allowed)}.")
        return value

    def choices(self, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
        values = self.get(key, list)
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ConfigError(f"{self.source}: {key} must list some of {', '.join(allowed)}.")
        return tuple(values)

    def no_extra(self, known: set[str]) -> None:
        extra = sorted(set(self.raw) - known)
        if extra:
            raise ConfigError(f"{self.source}: unknown key(s) {', '.join(extra)}.")


# -- core sets -----------------------------------------------------------------------------------
def parse_cores(device: DeviceProfile, text: str) -> tuple[str, int]:
    """Canonical core-set string and thread count: '3M+1L' -> ('1L+3M', 4); 't2' -> ('t2', 2)."""
    if device.core_mode == "threads":
        m = re.fullmatch(r"t(\d+)", text)
        if not m or not 1 <= int(m.group(1)) <= device.total_cores:
            raise TargetError(f"Core set {text!r} is not valid on {device.name}; use t1 to "
                              f"t{device.total_cores} (threads).")
        return f"t{int(m.group(1))}", int(m.group(1))
    counts: dict[str, int] = {}
    for term in text.split("+"):
        m = re.fullmatch(r"(\d+)([A-Z])", term)
        cluster = device.cluster(m.group(2)) if m else None
        if cluster is None or m.group(2) in counts or not 1 <= int(m.group(1)) <= cluster.count:
            raise TargetError(f"Core set {text!r} is not valid on {device.name}; its clusters are "
                              f"{_cluster_text(device)} (e.g. {device.default_cores}).")
        counts[m.group(2)] = int(m.group(1))
    order = [c.name for c in device.clusters]
    canonical = "+".join(f"{counts[n]}{n}" for n in order if n in counts)
    return canonical, sum(counts.values())


def _cluster_text(device: DeviceProfile) -> str:
    return ", ".join(f"{c.count}{c.name}" for c in device.clusters)
