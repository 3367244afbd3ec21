"""Compare the end-to-end GPU latencies of the same models across device campaigns.

  python scripts/gpu_campaign_compare.py docs/results/gpu-campaigns/e2e_by_campaign.csv

Prints, per model set, the median absolute % difference between every pair of campaigns, the
share of models whose two campaigns differ by more than 20%, and how well the two lowest of the
campaigns agree (whether a "fast state" figure is reproducible).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pandas as pd


def main(path: str) -> None:
    df = pd.read_csv(path, index_col="model_id")
    for name, part in df.groupby("set"):
        part = part.drop(columns="set").dropna(axis=1, how="all")
        print(f"{name}: {len(part)} models, campaigns {list(part.columns)}")
        for a, b in itertools.combinations(part.columns, 2):
            both = part[[a, b]].dropna()
            ratio = both[a] / both[b]
            diff = np.abs(ratio - 1) * 100
            print(f"  {a} vs {b}: MdAPE {np.median(diff):.1f}%, >20% apart {np.mean(diff > 20):.0%}, "
                  f"median ratio {np.median(ratio):.2f} (n={len(both)})")
        full = np.sort(part.dropna().to_numpy(), axis=1)
        gap = (full[:, 1] / full[:, 0] - 1) * 100
        print(f"  two lowest of {full.shape[1]}: median gap {np.median(gap):.1f}%, "
              f"p75 {np.percentile(gap, 75):.1f}%, >20% apart {np.mean(gap > 20):.0%}")


if __name__ == "__main__":
    main(sys.argv[1])
