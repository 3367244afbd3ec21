"""Dev script: APGPM variants on the same random 2/3-1/3 splits as `power_eval.py apgpm`, and
where the error is (docs/energy.md, "The fit").

    python scripts/apgpm_variants.py --repeats 50 [--variants "relative;ols;..."] \
        [--diagnose relative] [--out DIR]

Each variant is APGPM keyword arguments and, optionally, a rule that drops candidate columns
before the fit (the same for every split, decided from the column names and units only). The
workloads and labels are `power_eval.py apgpm`'s: w0-169, measured in the first call (c1).
`--diagnose V` prints, for variant V, every workload's mean absolute and signed percentage error
over the splits that held it out, the worst workloads and the error by kernel type.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latpred.dataset import Dataset  # noqa: E402
import latpred.power.apgpm as apgpm_module  # noqa: E402
from latpred.power import APGPM, mape  # noqa: E402
from latpred.power.fitting import LinearFit, weights  # noqa: E402
from power_counters import is_count  # noqa: E402
from power_eval import TARGET, rates  # noqa: E402


def _base(c: str) -> str:
    return c[:-len(" x busy")] if c.endswith(" x busy") else c


def extensive(X: pd.DataFrame, units: dict) -> list[str]:
    """Counts ncu gives per kernel (`.avg` / `.min` / `.max` of cycles, sectors, ...) that the
    shipped table does not make rates: they grow with the kernel's duration."""
    return [c for c in X.columns if not c.endswith("/ms") and c != "busy"
            and is_count(_base(c), units)]


def ncu_rates(X: pd.DataFrame, units: dict) -> list[str]:
    """ncu's own per-second rates and clocks: measured at its locked base clock (~1.57 GHz),
    not at the 1.98 GHz of the power window."""
    return [c for c in X.columns if not c.endswith("/ms") and (
        units.get(_base(c), "").endswith(("/s", "/ns", "/us", "/ms"))
        or units.get(_base(c), "") in ("Ghz", "Mhz") or "per_second" in c)]


class HuberFit(LinearFit):
    """Tried, not kept: relative least squares made robust, iteratively reweighted with Huber
    weights on the relative residuals (k = 1.345 x their MAD scale, 10 iterations)."""

    def fit(self, A, y) -> "HuberFit":
        A, y = np.asarray(A, float), np.asarray(y, float)
        A = A.reshape(-1, 1) if A.ndim == 1 else A
        mu, sd = A.mean(axis=0), A.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        Z = np.column_stack([np.ones(len(y)), (A - mu) / sd])
        w = weights(y, self.weighting)
        c = np.linalg.lstsq(Z * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
        for _ in range(10):
            r = (Z @ c - y) / y
            k = 1.345 * 1.4826 * np.median(np.abs(r - np.median(r))) + 1e-12
            ww = w * np.where(np.abs(r) <= k, 1.0, k / np.maximum(np.abs(r), 1e-300))
            c = np.linalg.lstsq(Z * np.sqrt(ww)[:, None], y * np.sqrt(ww), rcond=None)[0]
        self.coef_ = c[1:] / sd
        self.intercept_ = float(c[0] - (self.coef_ * mu).sum())
        return self


VARIANTS = {
    "ols": ({"weighting": "none"}, None),
    "ols, clipped": ({"weighting": "none", "clip": True}, None),
    "ols, held-out R^2": ({"weighting": "none", "criterion": "heldout"}, None),
    "ols, paper's stop (plain R^2, any gain)": ({"weighting": "none", "criterion": "r2",
                                                "add_gain": 0.0}, None),
    "relative": ({}, None),
    "relative, clipped": ({"clip": True}, None),
    "relative, non-negative": ({"nonneg": True}, None),
    "relative, held-out R^2": ({"criterion": "heldout"}, None),
    "relative, paper's stop (plain R^2, any gain)": ({"criterion": "r2", "add_gain": 0.0},
                                                     None),
    "relative, min_gain 0.001": ({"min_gain": 0.001}, None),
    "relative, without extensive counts": ({}, extensive),
    "relative, without ncu per-second rates": ({}, ncu_rates),
    "relative, Huber": ({"fit": HuberFit}, None),
}


def data(path: str):
    m, X = rates(path)
    first = m["source"] == Dataset.open(path).manifest["targets"][TARGET]["device_calls"][0]
    m, X = m[first].reset_index(drop=True), X[first.to_numpy()].reset_index(drop=True)
    X = X.loc[:, np.isfinite(X.to_numpy()).all(axis=0)]
    return m, X, m["power_aligned_dyn_w"].to_numpy()


def evaluate(X, y, kw, repeats):
    n = len(y)
    per, signed, k = [], [[] for _ in range(n)], []
    for r in range(repeats):
        order = np.random.default_rng(r).permutation(n)   # power_eval.py's splits
        tr, te = order[: 2 * n // 3], order[2 * n // 3:]
        kw = dict(kw)
        fit_class = kw.pop("fit", LinearFit)
        apgpm_module.LinearFit = fit_class        # the fit APGPM uses, in selection and model
        try:
            mod = APGPM(**kw).fit(X.iloc[tr], y[tr])
        finally:
            apgpm_module.LinearFit = LinearFit
        p = mod.predict(X.iloc[te])
        per.append(mape(y[te], p))
        k.append(len(mod.counters_used_))
        for i, pi in zip(te, p):
            signed[i].append(100 * (pi - y[i]) / y[i])
    return per, signed, k


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="datasets/h100-cuda-kernel-counters")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--variants", default=";".join(VARIANTS), help="names separated by ;")
    ap.add_argument("--diagnose", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    m, X, y = data(a.data)
    units = json.loads((Path(a.data) / "counter_units.json").read_text())
    res = {}
    names = [v for v in a.variants.split(";") if v]
    if a.diagnose and a.diagnose not in names:
        names.append(a.diagnose)
    for name in names:
        kw, drop = VARIANTS[name]
        Xv = X.drop(columns=drop(X, units)) if drop else X
        per, signed, k = evaluate(Xv, y, kw, a.repeats)
        res[name] = {"mape_mean": float(np.mean(per)),
                     "mape_se": float(np.std(per, ddof=1) / math.sqrt(len(per))),
                     "mape_min": float(np.min(per)), "mape_max": float(np.max(per)),
                     "first10": float(np.mean(per[:10])), "counters_mean": float(np.mean(k)),
                     "columns": int(Xv.shape[1]), "per_split": per}
        r = res[name]
        print(f"{name}: {r['mape_mean']:.2f} +- {r['mape_se']:.2f} ({r['mape_min']:.1f}-"
              f"{r['mape_max']:.1f}), first 10 splits {r['first10']:.2f}, "
              f"{r['counters_mean']:.1f} counters, {r['columns']} columns", flush=True)
        if name == a.diagnose:
            d = m[["workload", "kernel_type", "latency_ms", "copies", "power_dyn_w"]].copy()
            d["busy"] = X["busy"]
            d["ape"] = [np.mean(np.abs(s)) for s in signed]
            d["signed"] = [np.mean(s) for s in signed]
            d["held_out"] = [len(s) for s in signed]
            print(d.sort_values("ape", ascending=False).head(15).round(2).to_string())
            print(d.groupby("kernel_type")[["ape", "power_dyn_w"]].mean().round(1).to_string())
            print(f"workloads > 10%: {(d.ape > 10).sum()}, > 20%: {(d.ape > 20).sum()}; "
                  f"r(error, power) {np.corrcoef(d.ape, d.power_dyn_w)[0, 1]:.2f}")
            r["per_workload"] = d.to_dict(orient="records")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "results.json").write_text(json.dumps(res, indent=1, default=float))


if __name__ == "__main__":
    main()
