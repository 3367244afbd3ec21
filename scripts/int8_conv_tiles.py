"""Dev script: how one CPU's int8 convolutions compare with another's, by output-channel tile
padding (docs/fewshot.md, the third VM's fp32 -> int8 pair).

    python scripts/int8_conv_tiles.py A_INT8 B_INT8 [--fp32 A_FP32 --fp32-b B_FP32] [--nr 64]

Joins the two datasets' `conv2d` kernels (same model, same kernel index) and prints the median
A/B time ratio per class of `ceil(cout / nr) * nr / cout` (the share of a GEMM tile nr output
channels wide that a convolution fills; XNNPACK's AVX512AMX configuration has nr 64), per
kernel size, and for stems (<= 4 input channels). With --fp32, each CPU's int8/fp32 ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.dataset import Dataset  # noqa: E402

KEY = ["model_id", "kernel_index"]
PAD_CLASSES = ((1.0, 1.0001), (1.0001, 1.34), (1.34, 2.1), (2.1, np.inf))


def _kernels(root: str) -> pd.DataFrame:
    """The ok conv2d kernel rows of a dataset's one target."""
    ds = Dataset.open(root)
    (target,) = ds.targets()
    return ds.kernels(target).query("status == 'ok' and kernel_type == 'conv2d'")


def convs(a: str, b: str) -> pd.DataFrame:
    """conv2d kernels measured ok in both datasets, with both latencies (B's as `_b`)."""
    kb = _kernels(b)[KEY + ["latency_ms"]]
    return _kernels(a).merge(kb, on=KEY, suffixes=("", "_b"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a"), ap.add_argument("b")
    ap.add_argument("--fp32"), ap.add_argument("--fp32-b")
    ap.add_argument("--nr", type=int, default=64)
    args = ap.parse_args()
    m = convs(args.a, args.b)
    ratio = m.latency_ms / m.latency_ms_b
    print(f"{len(m)} conv2d kernels; A/B median {ratio.median():.3f}, time-weighted "
          f"{m.latency_ms.sum() / m.latency_ms_b.sum():.3f}")
    pad = np.ceil(m.f_output_c / args.nr) * args.nr / m.f_output_c
    for lo, hi in PAD_CLASSES:
        s = (pad >= lo) & (pad < hi)
        print(f"  cout padded to {args.nr} x[{lo:g}, {hi:g}): {int(s.sum())} kernels, "
              f"A/B median {ratio[s].median():.3f}")
    for k in sorted(m.f_kernel_h.dropna().unique()):
        s = m.f_kernel_h == k
        print(f"  {int(k)}x{int(k)}: {int(s.sum())} kernels, A/B median {ratio[s].median():.3f}")
    s = m.f_input_c <= 4
    print(f"  stems (<= 4 input channels): {int(s.sum())} kernels, A/B median "
          f"{ratio[s].median():.3f}")
    for fp32, int8, name in ((args.fp32, args.a, "A"), (args.fp32_b, args.b, "B")):
        if fp32:
            f = convs(int8, fp32)
            print(f"{name} int8/fp32: median {(f.latency_ms / f.latency_ms_b).median():.3f}, "
                  f"time-weighted {f.latency_ms.sum() / f.latency_ms_b.sum():.3f}")


if __name__ == "__main__":
    main()
