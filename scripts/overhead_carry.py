"""Dev script: does a source's overhead carry to other models and devices? (docs/fewshot.md,
"The typed overhead did not carry")

    python scripts/overhead_carry.py [--data D --target T] [--test datasets/host-cpu-zoo] \
        [--predictor SRC --pool datasets/host-cpu-int8-synthetic \
         --pool-test datasets/host-cpu-int8-zoo --pool-target host/cpu/int8/t1]

1. Per overhead kind (constant, linear, typed), the 5-fold cross-validated end-to-end MAPE on
   the source's training models and the typed-minus-linear paired difference with its
   standard error (what `auto` in predictors/overhead.py decided on until session 23; it now
   never picks typed).
2. Per kind fitted on all of them, on each `--test` dataset of the source's target: the
   measured kernel sums plus the predicted overhead (so only the overhead errs), its MAPE and
   mean bias (% of the end-to-end latency), and typed minus linear per term (ms per model).
3. With `--pool`: on the few-shot protocol's draws (seed 0, 3 draws of 10 and 30 models), the
   overheads adaptation could carry from a typed source to `--pool-test` (measured kernel sums
   again): typed times the common factor (`--overhead scaled`), each type's cost times its
   own kernel factor, the typed fit collapsed to linear (its pooled per-kernel cost), and the
   linear fit times the common factor; and how far typed and linear (times the common factor)
   are off on the draw's own models, all the folds of `adapt` could judge them on.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from sklearn.model_selection import KFold

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.predictors import LatencyModel  # noqa: E402
from latpred.predictors.overhead import OverheadModel, fit_overhead  # noqa: E402
from latpred.predictors.training import load_tables, type_counts  # noqa: E402

KINDS = ("constant", "linear", "typed")


def columns(kernels, models):
    counts = type_counts(kernels, models["model_id"])
    return (models["n_kernels"].to_numpy(np.float64), models["kernel_sum_ms"].to_numpy(),
            models["latency_ms"].to_numpy(), counts)


def cross_validated(n, s, e, counts) -> None:
    err = {k: np.empty(len(e)) for k in KINDS}
    for train, test in KFold(5, shuffle=True, random_state=0).split(e):
        held = {t: counts[t].to_numpy()[test] for t in counts.columns}
        for kind in KINDS:
            m = fit_overhead(n[train], s[train], e[train], kind, 0, counts.iloc[train])
            pred = s[test] + m.predict(n[test], s[test], held)
            err[kind][test] = np.abs(pred - e[test]) / e[test]
    d = err["typed"] - err["linear"]
    se = d.std(ddof=1) / np.sqrt(len(d))
    print("  CV MAPE " + ", ".join(f"{k} {100 * v.mean():.3f}%" for k, v in err.items()) +
          f"; typed - linear {100 * d.mean():+.3f} points, SE {100 * se:.3f}")


def on_test(fits: dict, root: str, target: str) -> None:
    n, s, e, counts = columns(*load_tables(root, target))
    held = {t: counts[t].to_numpy() for t in counts.columns}
    print(f"{root}: {len(e)} models, {n.mean():.1f} kernels, measured overhead "
          f"{(e - s).mean():.3f} ms ({100 * np.mean((e - s) / e):.2f}%)")
    for kind, m in fits.items():
        p = m.predict(n, s, held)
        print(f"  {kind:8s} MAPE {100 * np.mean(np.abs(s + p - e) / e):.2f}%, bias "
              f"{100 * np.mean((p - (e - s)) / e):+.2f}%, mean {p.mean():.3f} ms")
    typed, lin = fits["typed"], fits["linear"]
    cost = dict(typed.per_type)
    terms = {"intercept": typed.intercept - lin.intercept,
             "x kernel sum": (typed.per_kernel_ms - lin.per_kernel_ms) * s.mean(),
             **{t: (cost.get(t, typed.per_kernel) - lin.per_kernel) * counts[t].mean()
                for t in counts.columns}}
    top = sorted(terms.items(), key=lambda x: -abs(x[1]))[:8]
    print("  typed - linear, ms per model: " + ", ".join(f"{t} {v:+.3f}" for t, v in top))


def adapted(source, linear: OverheadModel, pool: str, test: str, target: str) -> None:
    from latpred.evaluate.data import load_eval_set
    from latpred.predictors.adapt.auto import scaled_overhead
    from latpred.predictors.adapt.types import adapt_types

    kernels, models = load_tables(pool, target)
    n, s, e, counts = columns(*load_tables(test, target))
    held = {t: counts[t].to_numpy() for t in counts.columns}
    ids = list(load_eval_set(pool, target).model_ids)   # the protocol's pool and draws
    rng, typed = np.random.default_rng(0), source.overhead
    collapsed = OverheadModel("linear", typed.intercept, typed.per_kernel, typed.per_kernel_ms)
    for size in (10, 30):
        got: dict[str, list] = {}
        for _ in range(3):
            few = rng.choice(ids, size=size, replace=False)
            fits, common = adapt_types(source, kernels[kernels["model_id"].isin(few)], target,
                                       "scale", 0)
            own = {t: f.metrics.get("scale", common) for t, f in fits.items()}
            per_type = dataclasses.replace(
                scaled_overhead(typed, common),
                per_type=tuple((t, c * own.get(t, common)) for t, c in typed.per_type))
            for name, m in (("typed x common factor", scaled_overhead(typed, common)),
                            ("typed x own type factor", per_type),
                            ("collapsed x common", scaled_overhead(collapsed, common)),
                            ("linear x common", scaled_overhead(linear, common))):
                p = m.predict(n, s, held)
                got.setdefault(name, []).append(
                    (np.mean(np.abs(s + p - e) / e), np.mean((p - (e - s)) / e)))
            own_models = models[models["model_id"].isin(few)]
            fn, fs, fe, fc = columns(kernels[kernels["model_id"].isin(few)], own_models)
            for name, m in (("typed", typed), ("linear", linear)):
                p = scaled_overhead(m, common).predict(fn, fs, {t: fc[t].to_numpy() for t in fc})
                got.setdefault(f"{name} on the few models", []).append(
                    (np.mean(np.abs(fs + p - fe) / fe), np.mean((p - (fe - fs)) / fe)))
        for name, v in got.items():
            v = 100 * np.array(v)
            print(f"  {size} models, {name:24s} MAPE {v[:, 0].mean():.2f}%, bias "
                  f"{v[:, 1].mean():+.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/host-cpu-synthetic", help="training models")
    ap.add_argument("--target", default="host/cpu/fp32/t1")
    ap.add_argument("--predictor", help="with --pool: the source (typed overhead)")
    ap.add_argument("--test", action="append", default=[])
    ap.add_argument("--pool")
    ap.add_argument("--pool-test")
    ap.add_argument("--pool-target")
    a = ap.parse_args()
    n, s, e, counts = columns(*load_tables(a.data, a.target))
    print(f"{a.data}: {len(e)} models")
    cross_validated(n, s, e, counts)
    fits = {k: fit_overhead(n, s, e, k, 0, counts) for k in KINDS}
    for root in a.test:
        on_test(fits, root, a.target)
    if a.pool:
        print(f"adapted to {a.pool_target}: few models of {a.pool}, tested on {a.pool_test}")
        source = LatencyModel.load(a.predictor)
        adapted(source, fits["linear"], a.pool, a.pool_test, a.pool_target)


if __name__ == "__main__":
    main()
