"""Dev script: which adapted overhead carries from the few models to the test models?
(docs/fewshot.md, "The source's cost per kernel, pinned")

    python scripts/fewshot_overhead_carry.py --predictor SRC --pool D --target T [--test Z]

On the few-shot protocol's draws (seed 0: 3 draws of 10 models, then 3 of 30, from `--pool`;
without `--test` the pool and test models are `evaluate.fewshot.pool_and_test`'s split of
`--pool`), each of `adapt`'s overhead kinds (`scaled`, `pinned`, `refit`) is fitted as `adapt`
fits it (the common factor of `adapt_types(..., "scale")`) and scored on the test models with their
*measured* kernel sums, so only the overhead errs: MAPE and mean signed error (% of the end-to-
end latency), per size and per draw, and each draw's coefficients (intercept and cost per
kernel in us, share of the kernel sum in %).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.evaluate.fewshot import draw_ids, pool_and_test_sets  # noqa: E402
from latpred.predictors import LatencyModel  # noqa: E402
from latpred.predictors.adapt.auto import OVERHEAD_KINDS, fit_adapted_overhead  # noqa: E402
from latpred.predictors.adapt.types import adapt_types  # noqa: E402
from latpred.predictors.training import load_tables  # noqa: E402

SIZES = (10, 30)
DRAWS = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", required=True)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--test", default=None)
    args = ap.parse_args()
    source = LatencyModel.load(args.predictor)
    _, pool, test = pool_and_test_sets(args.pool, args.target, SIZES, test_dataset=args.test)
    kernels, models = load_tables(args.pool, args.target, pool)
    aligned = np.array(test.aligned, bool)
    n = np.array([len(k) for k in test.kernels])[aligned]
    s = np.array([sum(ms) for ms in test.kernel_ms])[aligned]
    y = np.array(test.measured_ms)[aligned]
    errors: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for size, draw, ids in draw_ids(pool, SIZES, DRAWS):
        k, m = kernels[kernels.model_id.isin(ids)], models[models.model_id.isin(ids)]
        _, factor = adapt_types(source, k, args.target, "scale", 0)
        coefs = []
        for kind in OVERHEAD_KINDS:
            oh = fit_adapted_overhead(kind, source.overhead, factor, m, 0)
            e = (s + oh.predict(n, s)) / y - 1
            errors.setdefault((size, kind), []).append((np.abs(e).mean() * 100,
                                                        e.mean() * 100))
            coefs.append(f"{kind} {oh.intercept * 1e3:.1f} / {oh.per_kernel * 1e3:.2f} / "
                         f"{oh.per_kernel_ms * 100:.2f}")
        print(f"{size} models, draw {draw + 1}: " + "; ".join(coefs))
    print(f"{len(y)} test models; overhead alone (measured kernel sums):")
    for (size, kind), v in errors.items():
        v = np.array(v)
        print(f"  {size:3d} models  {kind:7s} MAPE {v[:, 0].mean():5.2f}%  signed "
              f"{v[:, 1].mean():+6.2f}%  draws {np.round(v[:, 0], 2).tolist()}")


if __name__ == "__main__":
    main()
