"""A phone over adb: run TFLite's `benchmark_model` with op profiling on it.

`AdbDevice` wraps the `adb` executable of Android's platform-tools (found on PATH, or named by
the caller): it checks that the serial is attached and that `benchmark_model` is on the device,
pushes a model, runs the tool with the target's delegate, threads and core affinity, and pulls
the op-profile CSV back. The campaign around it (resumable, crash-safe) is `adb_campaign.py`;
the output is parsed and stored by the `import-benchmark` path (`benchmark_import.py`).

Core affinity: a CPU target names clusters (`1L`, `1L+3M`); the device's CPUs are grouped by
their `cpuinfo_max_freq` (read from sysfs), the fastest group being the profile's fastest
cluster, and the tool runs under `taskset` with a mask of the chosen CPUs (the first ones of
each group), as nn-Meter's adb backend and the operation-wise paper's setup do.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from latpred.errors import LatpredError, MeasurementError

DEFAULT_BINARY = "/data/local/tmp/benchmark_model"
REMOTE_DIR = "/data/local/tmp/latpred"
BINARY_HELP = ("download TFLite's prebuilt android_aarch64_benchmark_model (linked from "
               "https://ai.google.dev/edge/litert/models/measurement), then `adb push` it to "
               "{path} and `adb shell chmod +x {path}` (or pass --benchmark-binary)")
_CPUFREQ = "/sys/devices/system/cpu/cpu*/cpufreq/cpuinfo_max_freq"


class AdbError(MeasurementError):
    """adb is missing, the serial is not attached, or the device is not usable."""


class DeviceDisconnected(AdbError):
    """The device went away during a campaign (the dataset keeps what was measured)."""


@dataclass(frozen=True)
class AdbResult:
    """One adb call: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error_line(self) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1] if text else f"exit status {self.returncode}"


@dataclass(frozen=True)
class AdbDevice:
    """One attached device, addressed by its serial, through the `adb` executable."""

    serial: str
    adb: str = "adb"

    def call(self, *args: str, timeout_s: float = 120.0) -> AdbResult:
        """`adb -s SERIAL ARGS...`; raises AdbError only when adb itself cannot run."""
        exe = shutil.which(self.adb)
        if exe is None:
            raise AdbError(f"{self.adb} is not on PATH: install Android's platform-tools "
                           "(https://developer.android.com/tools/releases/platform-tools).")
        try:
            p = subprocess.run([exe, "-s", self.serial, *args], capture_output=True, text=True,
                               timeout=timeout_s, errors="replace")
        except subprocess.TimeoutExpired:
            return AdbResult(124, "", f"no answer within {timeout_s:g} s")
        return AdbResult(p.returncode, p.stdout, p.stderr)

    def shell(self, command: str, timeout_s: float = 120.0) -> AdbResult:
        return self.call("shell", command, timeout_s=timeout_s)

    def attached(self) -> bool:
        r = self.call("get-state", timeout_s=30)
        return r.ok and r.stdout.strip() == "device"

    def check_attached(self) -> None:
        """Raise one sentence naming the attached serials when this one is not usable."""
        r = self.call("get-state", timeout_s=30)
        if r.ok and r.stdout.strip() == "device":
            return
        listing = subprocess.run([shutil.which(self.adb) or self.adb, "devices"],
                                 capture_output=True, text=True, timeout=30, errors="replace")
        serials = [line.split()[0] for line in listing.stdout.splitlines()[1:]
                   if line.strip() and not line.startswith("*")]
        have = ", ".join(serials) if serials else "none"
        state = r.stdout.strip() if r.ok else "not attached"
        raise AdbError(f"No usable device with serial {self.serial!r} ({state}); "
                       f"`adb devices` lists: {have}.")

    def check_binary(self, path: str = DEFAULT_BINARY) -> None:
        r = self.shell(f"ls {shlex.quote(path)}", timeout_s=30)
        if not r.ok or "No such file" in r.stdout:
            if not self.attached():
                raise DeviceDisconnected(f"Device {self.serial} disconnected.")
            raise AdbError(f"benchmark_model is not at {path} on {self.serial}: "
                           + BINARY_HELP.format(path=path) + ".")

    def cpu_groups(self) -> list[list[int]]:
        """The device's CPU ids grouped by maximum clock, fastest group first."""
        r = self.shell(f"grep . {_CPUFREQ}", timeout_s=30)
        freqs: dict[int, int] = {}
        for line in r.stdout.splitlines():
            path, _, value = line.strip().rpartition(":")
            cpu = Path(path).parent.parent.name.removeprefix("cpu")
            if cpu.isdigit() and value.strip().isdigit():
                freqs[int(cpu)] = int(value)
        if not freqs:
            raise AdbError(f"Cannot read the CPU clocks of {self.serial} ({_CPUFREQ}) to pin "
                           "benchmark_model to the target's cores.")
        groups: dict[int, list[int]] = {}
        for cpu, f in sorted(freqs.items()):
            groups.setdefault(f, []).append(cpu)
        return [groups[f] for f in sorted(groups, reverse=True)]


def core_mask(target, groups: list[list[int]], serial: str = "the device") -> tuple[int, ...]:
    """The CPU ids a CPU target's core set runs on (see the module docstring)."""
    device = target.device
    clusters = sorted(device.clusters, key=lambda c: -(c.freq_ghz or 0.0))
    if [len(g) for g in groups] != [c.count for c in clusters]:
        have = " + ".join(str(len(g)) for g in groups)
        want = " + ".join(f"{c.count}{c.name}" for c in clusters)
        raise AdbError(f"{serial}'s CPUs ({have}, fastest first) do not match the clusters of "
                       f"{device.name} ({want}): is it the device the target names?")
    by_letter = {c.name: g for c, g in zip(clusters, groups)}
    cpus: list[int] = []
    for term in target.cores.split("+"):
        count, letter = int(term[:-1]), term[-1]
        cpus += by_letter[letter][:count]
    return tuple(sorted(cpus))


def benchmark_args(target, remote_model: str, remote_csv: str, kernels: str = "xnnpack",
                   runs: int = 50, warmup: int = 5) -> list[str]:
    """benchmark_model's flags for a target: the delegate, precision, threads and profiling."""
    args = [f"--graph={remote_model}", "--enable_op_profiling=true",
            f"--profiling_output_csv_file={remote_csv}", f"--num_runs={runs}",
            f"--warmup_runs={warmup}"]
    if target.processor == "gpu":
        fp16 = "true" if target.precision == "fp16" else "false"
        return args + ["--use_gpu=true", f"--gpu_precision_loss_allowed={fp16}"]
    if target.processor != "cpu":
        raise LatpredError(f"{target} is not a phone target: adb runs TFLite's CPU or GPU "
                           "delegate.")
    use = "true" if kernels == "xnnpack" else "false"
    return args + [f"--num_threads={target.threads}", f"--use_xnnpack={use}"]


def benchmark_command(binary: str, args: list[str], cpus: tuple[int, ...] | None) -> str:
    """The device shell line: `taskset MASK BINARY FLAGS` (no taskset without a core set)."""
    line = " ".join(shlex.quote(a) for a in [binary, *args])
    if cpus:
        line = f"taskset {sum(1 << c for c in cpus):x} {line}"
    return line
