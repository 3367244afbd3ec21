"""Which microkernel configurations XNNPACK picks on an x86 CPU: the nr, mr and kr that size
its operators' packed weights and indirection buffers (`xnnpack_operators`).

Source: google/XNNPACK at 75db3c093 (as `xnnpack_operators`). src/configs/hardware-config.c
reads the CPU's instruction sets from cpuinfo; here they are read from /proc/cpuinfo's flags
(`profile.machine.cpu_flags`). f32, in the order src/configs/gemm-config.c tries them:

- AVX-512F: fully connected 7x32 (`init_f32_gemm_config_impl`), convolutions IGEMM 1x32 /
  7x32 (`init_f32_igemm_config`), the narrow config 1x16 / 7x16
  (`init_f32_gemm_nr2_config_impl`);
- FMA3 on a Zen 1 or Hygon Dhyana (cpuinfo's `xnn_uarch_zen` / `dhyana`): 4x16s4 and IGEMM
  1x16s4 / 4x16s4 (input channels rounded up to sr = 4), narrow 1x8 / 4x8. Not measured;
- FMA3 otherwise: 6x16, IGEMM 1x16 / 5x16, narrow 1x8 / 5x8 / 10x8.

CPUs without FMA3 are given FMA3's rules (not modelled). The depthwise path is the same on
AVX-512F and FMA3 (src/configs/dwconv-config.c: 3/4/9/25-tap unipass, 16 channels). The
FMA3 rules were traced on the first VM (AMD EPYC), the AVX-512F ones on the Intel VM
(scripts/memdiag, docs/memory.md).

8-bit weights take `init_qs8_qc8w_gemm_config`'s levels (`Qs8Config`); the AMX one is
checked against a measurement on the Intel VM (datasets/host-cpu-memory-int8), AVX-512 VNNI on
the fourth VM (an AMD Zen 5, datasets/host-cpu-memory-int8-vm4); the others are not measured.

`for_cpu(level)` plans as another x86 CPU would, e.g. to score a dataset measured elsewhere.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator, NamedTuple


class GemmConfig(NamedTuple):
    """One f32 GEMM configuration: its nr, the mrs it has IGEMM kernels for, and kr * sr
    (input channels are rounded up to it when packed: `round_up_po2(group_input_channels,
    kr * sr)` in convolution-nhwc.c `create_igemm` and fully-connected-nc.c)."""

    nr: int
    mrs: tuple[int, ...]
    k_round: int = 1


class F32Config(NamedTuple):
    """The three f32 configurations of a level: fully connected, convolutions (IGEMM) and the
    narrow one both fall back to (nr2)."""

    fc: GemmConfig
    igemm: GemmConfig
    nr2: GemmConfig


F32_AVX512F = F32Config(GemmConfig(32, (1, 7)), GemmConfig(32, (1, 7)), GemmConfig(16, (1, 7)))
F32_FMA3 = F32Config(GemmConfig(16, (1, 2, 6)), GemmConfig(16, (1, 5)),
                     GemmConfig(8, (1, 5, 10)))
F32_ZEN = F32Config(GemmConfig(16, (1, 4), 4), GemmConfig(16, (1, 4), 4), GemmConfig(8, (1, 4)))


class Qs8Config(NamedTuple):
    """src/configs/gemm-config.c `init_qs8_qc8w_gemm_config` (nr, kr, the IGEMM mrs) and
    dwconv-config.c `init_qs8_qc8w_dwconv_config` (channel tile) for one x86 level."""

    nr: int
    kr: int
    mrs: tuple[int, ...]
    dw_channel_tile: int


# In the order gemm-config.c tries them; the flags hardware-config.c requires (cpuinfo's names
# as /proc/cpuinfo spells them). AVX512SKX = avx512f + bw + dq + vl.
_SKX = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
QS8_AMX = Qs8Config(64, 4, (1, 16), 32)
_QS8_LEVELS = (
    (_SKX + ("avx512_vnni", "gfni", "amx_int8"), QS8_AMX),                         # AVX512AMX
    (_SKX + ("avx512_vnni",), Qs8Config(16, 8, (1, 7), 32)),                       # AVX512VNNI
    (("avx_vnni_int8", "avx_vnni"), Qs8Config(8, 8, (1, 5), 16)),                  # AVXVNNIINT8
    (("avx_vnni",), Qs8Config(8, 8, (1, 5), 16)),                                   # AVXVNNI
    (_SKX, Qs8Config(16, 8, (1, 7), 32)),                                          # AVX512SKX
    (("avx2",), Qs8Config(8, 8, (1, 3), 16)),                                       # AVX2
)

# Named x86 levels for `for_cpu`: the flags of a CPU that picks each, and whether cpuinfo
# calls it a Zen 1. "avx2" is the first VM's (AMD EPYC, FMA3), "amx" the Intel VM's.
_FMA3 = ("avx2", "fma")
LEVELS = {
    "avx2": (frozenset(_FMA3), False),
    "zen1": (frozenset(_FMA3), True),
    "avxvnni": (frozenset(_FMA3 + ("avx_vnni",)), False),
    "avx512": (frozenset(_FMA3 + _SKX), False),
    "avx512vnni": (frozenset(_FMA3 + _SKX + ("avx512_vnni",)), False),
    "amx": (frozenset(_FMA3 + _SKX + ("avx512_vnni", "gfni", "amx_int8")), False),
}


class Levels(NamedTuple):
    name: str               # a LEVELS key, or "host"
    f32: F32Config
    qs8: Qs8Config


def levels_for(name: str, flags: frozenset[str], zen1: bool) -> Levels:
    """The f32 and qs8 configurations of a CPU with these flags."""
    f32 = F32_AVX512F if "avx512f" in flags else (F32_ZEN if zen1 else F32_FMA3)
    qs8 = next((cfg for need, cfg in _QS8_LEVELS if flags.issuperset(need)),
               _QS8_LEVELS[-1][1])
    return Levels(name, f32, qs8)


@lru_cache(maxsize=1)
def _host() -> Levels:
    from latpred.profile.machine import cpu_fields, cpu_flags

    fields = cpu_fields()
    vendor = fields.get("vendor_id", "")
    family, model = (int(fields.get(k) or 0) for k in ("cpu family", "model"))
    # cpuinfo src/x86/uarch.c: AMD family 0x17 models 0x00-0x1f are Zen (0x30 up Zen 2);
    # Hygon family 0x18 is Dhyana. gemm-config.c gives both the s4 kernels.
    zen1 = (vendor == "AuthenticAMD" and family == 0x17 and model < 0x20) or \
        (vendor == "HygonGenuine" and family == 0x18)
    return levels_for("host", cpu_flags(), zen1)


_pinned: list[Levels] = []


def active() -> Levels:
    """The levels in force: `for_cpu`'s, else this CPU's (FMA3 / AVX2 where /proc/cpuinfo is
    unreadable)."""
    return _pinned[-1] if _pinned else _host()


def active_level() -> str:
    """The name of the levels in force (a cache key for what depends on them)."""
    return _pinned[-1].name if _pinned else "host"


def f32_config() -> F32Config:
    return active().f32


def qs8_config() -> Qs8Config:
    return active().qs8


@contextmanager
def for_cpu(level: str) -> Iterator[None]:
    """Within the block, size XNNPACK's buffers as a CPU of `level` (a LEVELS key) would."""
    if level not in LEVELS:
        raise ValueError(f"unknown x86 level {level!r}: one of {', '.join(LEVELS)}")
    _pinned.append(levels_for(level, *LEVELS[level]))
    try:
        yield
    finally:
        _pinned.pop()
