"""What the manifest says about the measuring machine."""

from __future__ import annotations

import os
import platform


def cpu_fields() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo, keys lower-cased ({} where unreadable)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags from /proc/cpuinfo (empty where unreadable)."""
    return frozenset(cpu_fields().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


def cpu_id() -> str:
    """Which CPU this is, beyond its name: a VM's model name can be just "AMD EPYC" on hosts of
    different generations (two such VMs ran the same models 30% apart, docs/measurement.md).
    Family, model and stepping from /proc/cpuinfo and the per-core L2 and shared L3 sizes from
    sysfs; "" where Linux does not say."""
    fields = cpu_fields()
    if not fields:
        return ""
    parts = [f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model "
             f"{fields.get('model', '?')} stepping {fields.get('stepping', '?')}"]
    for level in ("2", "3"):
        size = _cache_size(level)
        if size:
            parts.append(f"L{level} {size}")
    return ", ".join(parts)


def _cache_size(level: str) -> str:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as fh:
                if fh.read().strip() != level:
                    continue
            with open(f"{base}/{index}/size") as fh:
                return fh.read().strip()
    except OSError:
        pass
    return ""


def machine_fields() -> dict[str, str]:
    """`machine` (architecture, usable cores, OS), `cpu_model` and `cpu_id` for a manifest
    target entry."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    system = f"{platform.system()} {platform.release()}"
    machine = f"{platform.machine()}, {usable} usable CPUs, {system}"
    return {"machine": machine, "cpu_model": cpu_model(), "cpu_id": cpu_id()}
