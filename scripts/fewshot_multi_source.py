"""Dev experiment (session 39, not adopted): adapt to a new device from several source devices
at once and average their predictions.

On the few-shot protocol's own draws (seed 0, the same few models for every source), `adapt
auto` from each source; the test set's end-to-end predictions of each adapted predictor and of
their mean, geometric mean and median; MAPE (and each source's signed error) per draw, then the
means per size.

    .venv/bin/python scripts/fewshot_multi_source.py --data POOL_DATA [--test-data TEST_DATA]
        --target T --sources SRC SRC2 SRC3 [--draws 3] [--sizes 10,30] [--out CSV]

Result (docs/fewshot.md, "Several sources at once"): the mean of three CPUs' adapted
predictions reads like the best single source, not better; not adopted.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from latpred.evaluate.fewshot import draw_ids, pool_and_test_sets
from latpred.evaluate.methods import score_latpred
from latpred.predictors import LatencyModel
from latpred.predictors.adapt import adapt
from latpred.predictors.training import load_tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the new device's pool (and test) dataset")
    ap.add_argument("--test-data", help="a test dataset (else held out of --data)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--sources", nargs="+", required=True, help="source predictor directories")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--sizes", default="10,30")
    ap.add_argument("--out", help="per-draw figures as CSV")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    everything, pool, test = pool_and_test_sets(a.data, a.target, sizes, 0, a.test_data)
    kernels, models = load_tables(a.data, a.target, pool)
    srcs = [LatencyModel.load(s, target=a.target) for s in a.sources]
    y = np.asarray(test.measured_ms)
    rows = []
    for n, draw, ids in draw_ids(pool, sizes, a.draws, 0):
        k = kernels[kernels["model_id"].isin(ids)]
        m = models[models["model_id"].isin(ids)]
        preds = []
        for s in srcs:
            model = adapt(s, k, m, a.target, "auto", 0)
            preds.append(np.asarray(score_latpred(model, test, "x").predicted_ms))
        P = np.array(preds)
        row = {"n": n, "draw": draw}
        for i, s in enumerate(a.sources):
            row[s] = float(np.mean(np.abs(P[i] - y) / y))
            row[s + " mpe"] = float(np.mean((P[i] - y) / y))
        row["mean"] = float(np.mean(np.abs(P.mean(0) - y) / y))
        row["geo"] = float(np.mean(np.abs(np.exp(np.log(P).mean(0)) - y) / y))
        row["median"] = float(np.mean(np.abs(np.median(P, 0) - y) / y))
        rows.append(row)
        print(json.dumps(row), flush=True)
    df = pd.DataFrame(rows)
    print(df.groupby("n").mean(numeric_only=True).drop(columns="draw").round(4).to_string())
    if a.out:
        df.to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
