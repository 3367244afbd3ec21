"""Dev script: evaluate APGPM and energy per inference on the H100 datasets (docs/energy.md).

    python scripts/power_eval.py apgpm --data datasets/h100-cuda-kernel-counters \
        --out docs/results/power-apgpm-h100-cuda
    python scripts/power_eval.py energy --kernels datasets/h100-cuda-kernel-counters \
        --train datasets/h100-cuda-energy-synthetic --train-latency datasets/h100-cuda-synthetic \
        --test datasets/h100-cuda-zoo --test-energy datasets/h100-cuda-energy-zoo \
        [--predictor DIR] --save DIR/energy --out docs/results/energy-c-h100-cuda-zoo

`apgpm`: counter event rates of each workload (ncu counts `.sum` divided by the workload's time
per call in the replayed graph; ratios and percentages as ncu gives them and weighted by
`busy` = ncu kernel time / time per call, i.e. averaged over the power window) against the measured dynamic power; `--repeats` random 2/3-1/3 splits
(the paper's) of the workloads; APGPM (plain; inverted + combined), the utilization-frequency
baseline (NVML utilization and SM clock of the power window; and with `busy` as utilization),
All-counters and top-k. MAPE on the held-out third, mean over the splits.

`energy`: protocol (c): the kernel power regressor trained on the per-kernel dataset, the
calibration (a, b) on the synthetic models' energy, tested on the zoo's. Kernel latencies and
end-to-end latency either measured (the in-context kernel times and replay latency of the
latency datasets) or predicted by `--predictor` (a latpred LatencyModel of the same target).
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

from latpred.dataset import Dataset  # noqa: E402
from latpred.power import (APGPM, AllCountersModel, TopKModel, UtilFreqModel,  # noqa: E402
                           mape)
from latpred.power.energy import EnergyModel, KernelPowerModel, calibrate  # noqa: E402

TARGET = "h100/cuda/fp16"


def rates(data: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernel rows with counters, counter rate table aligned to them)."""
    ds = Dataset.open(data)
    k = ds.kernels(TARGET)
    extra = pd.read_parquet(Path(data) / "kernels.parquet") if (Path(data) /
                                                               "kernels.parquet").is_file() \
        else k
    k = k.merge(extra[["model_id", "kernel_index"] + [c for c in extra.columns
                                                      if c not in k.columns]],
                on=["model_id", "kernel_index"], how="left")
    c = pd.read_parquet(Path(data) / "counters.parquet")
    m = k.merge(c, on=["model_id", "kernel_index"], how="inner", suffixes=("", "_ncu"))
    per_ms = m["latency_ms"].to_numpy()
    skip = {"workload", "model_id", "kernel_index", "source", "source_ncu", "n_cuda_kernels",
            "workload_ncu"}
    cols = {}
    for col in c.columns:
        if col in skip:
            continue
        v = pd.to_numeric(m[col], errors="coerce").to_numpy(float)
        cols[col + "/ms" if col.endswith(".sum") else col] = v / per_ms \
            if col.endswith(".sum") else v
    X = pd.DataFrame(cols, index=m.index)
    if "gpu__time_duration.sum/ms" in X:
        # the share of the power window the kernels ran (ncu's time at its locked clocks over
        # the time per call in the replayed graph), and every ratio / percentage weighted by
        # it: its average over the window, gaps between launches included
        # (ncu reports the duration in us; at its locked base clock, so busy can pass 1)
        unit = json.loads((Path(data) / "counter_units.json").read_text()).get(
            "gpu__time_duration.sum", "us")
        busy = X["gpu__time_duration.sum/ms"] / {"ns": 1e6, "us": 1e3, "ms": 1.0}[unit]
        other = [c for c in X.columns if not c.endswith("/ms")]
        X = pd.concat([X, X[other].mul(busy, axis=0).add_suffix(" x busy")], axis=1)
        X["busy"] = busy
    return m, X


def run_apgpm(a) -> dict:
    m, X = rates(a.data)
    y = m["power_dyn_w"].to_numpy()
    X = X.loc[:, np.isfinite(X.to_numpy()).all(axis=0)]
    n = len(y)
    res: dict = {}
    models = {
        "APGPM (linear)": lambda: APGPM(criterion=a.criterion),
        "APGPM (inverted + combined)": lambda: APGPM(criterion=a.criterion, inverted=True,
                                                     combine_top=a.combine_top),
        "All counters": AllCountersModel,
    }
    chosen = {}
    for r in range(a.repeats):
        rng = np.random.default_rng(r)
        order = rng.permutation(n)
        tr, te = order[: 2 * n // 3], order[2 * n // 3:]
        for name, make in models.items():
            mod = make().fit(X.iloc[tr], y[tr])
            res.setdefault(name, []).append(mape(y[te], mod.predict(X.iloc[te])))
            if isinstance(mod, APGPM):
                chosen.setdefault(name, []).append(mod.summary())
        k = len(chosen["APGPM (linear)"][-1]["counters_used"])
        top = TopKModel(k).fit(X.iloc[tr], y[tr])
        res.setdefault("top-k counters (k = APGPM's)", []).append(
            mape(y[te], top.predict(X.iloc[te])))
        for uname, util in (("util-freq (NVML utilization)", m["util_gpu"].to_numpy(float)),
                            ("util-freq (ncu busy fraction)",
                             X["busy"].to_numpy() if "busy" in X else None)):
            if util is None:
                continue
            uf = UtilFreqModel().fit(util[tr], m["sm_clock_mhz"].to_numpy()[tr], y[tr])
            res.setdefault(uname, []).append(
                mape(y[te], uf.predict(util[te], m["sm_clock_mhz"].to_numpy()[te])))
    summary = {name: {"mape_mean": float(np.mean(v)), "mape_min": float(np.min(v)),
                      "mape_max": float(np.max(v))} for name, v in res.items()}
    full = APGPM(criterion=a.criterion).fit(X, y)
    out = {"workloads": n, "counters": int(X.shape[1]), "repeats": a.repeats,
           "criterion": a.criterion, "target": "power_dyn_w (board power - idle power)",
           "power_dyn_w_range": [float(y.min()), float(y.max())], "results": summary,
           "counters_used": {name: [len(s["counters_used"]) for s in v]
                             for name, v in chosen.items()},
           "model_on_all_workloads": full.summary(),
           "clusters_on_all_workloads": [{k: t[k] for k in ("cluster", "size", "importance",
                                                            "representative")}
                                         for t in full.clusters_[:40]],
           "selection_path": full.path_}
    return out


def _model_kernels(kernels_ds: str, target: str) -> pd.DataFrame:
    k = Dataset.open(kernels_ds).kernels(target)
    return k[k.status == "ok"]


def _sums(em: EnergyModel, k: pd.DataFrame, kernel_ms: np.ndarray) -> pd.Series:
    p = em.kernel_power(k, kernel_ms)
    return pd.Series(p * kernel_ms, index=k.index).groupby(k["model_id"]).sum()


def _predicted(predictor: str, ids, kind: str):
    """Per-kernel and total predicted latency of models by id (graphs rebuilt)."""
    from latpred import sampler, zoo
    from latpred.features import kernel_features
    from latpred.predictors import LatencyModel
    from latpred.target import parse_target

    lm = LatencyModel.load(predictor, target=TARGET)
    space = sampler.load_space(Path(__file__).resolve().parent.parent / "search_space" /
                               "synthetic_cnn.yaml")
    t = parse_target(TARGET)
    rows, totals = [], {}
    for mid in ids:
        if kind == "zoo":
            g = zoo.build(mid)
        else:
            i = int(mid.rsplit("-", 1)[1])
            g = sampler.build_graph(sampler.sample_one(space, 13, i))
        p = lm.predict(g, allow_fallback=True)
        totals[mid] = p.total_ms
        for k, ms in zip(p.kernels, p.kernel_ms):
            rows.append({"model_id": mid, "kernel_type": k.type, "latency_ms": float(ms),
                         **{f"f_{n}": (np.nan if v is None else float(v))
                            for n, v in kernel_features(g, k, t).items()}})
    return pd.DataFrame(rows), pd.Series(totals)


def run_energy(a) -> dict:
    kd = Dataset.open(a.kernels).kernels(TARGET)
    kd = kd[kd.status == "ok"]
    train_e = Dataset.open(a.train).models(TARGET)
    test_e = Dataset.open(a.test_energy).models(TARGET)
    train_e, test_e = (d[d.status == "ok"].set_index("model_id") for d in (train_e, test_e))
    # every call on the first call's scale (the one the model energies were measured on)
    label = "power_aligned_dyn_w" if "power_aligned_dyn_w" in kd else "power_dyn_w"
    kd = kd[kd[label].notna()]
    power = KernelPowerModel().fit(kd, kd[label], kd["latency_ms"], seed=0)
    out = {"kernels_trained": len(kd), "train_models": len(train_e), "test_models": len(test_e)}
    modes = {"measured latency": None}
    if a.predictor:
        modes["predicted latency"] = a.predictor
    for mode, pred in modes.items():
        if pred is None:
            ktr = _model_kernels(a.train_latency, TARGET)
            ktr = ktr[ktr.model_id.isin(train_e.index)]
            kte = _model_kernels(a.test, TARGET)
            kte = kte[kte.model_id.isin(test_e.index)]
            ltr = Dataset.open(a.train_latency).models(TARGET).set_index("model_id").latency_ms
            lte = Dataset.open(a.test).models(TARGET).set_index("model_id").latency_ms
        else:
            ktr, ltr = _predicted(pred, list(train_e.index), "synthetic")
            kte, lte = _predicted(pred, list(test_e.index), "zoo")
        em = EnergyModel(TARGET, power)
        s_tr = _sums(em, ktr, ktr["latency_ms"].to_numpy(float))
        ids = [i for i in train_e.index if i in s_tr.index and i in ltr.index]
        em.a, em.b = calibrate(s_tr[ids], ltr[ids], train_e.loc[ids, "energy_mj"])
        s_te = _sums(em, kte, kte["latency_ms"].to_numpy(float))
        tid = [i for i in test_e.index if i in s_te.index and i in lte.index]
        pred_e = em.a * s_te[tid] + em.b * lte[tid]
        y = test_e.loc[tid, "energy_mj"]
        # baseline: energy = mean dynamic power of the training models x latency
        p_mean = float((train_e.loc[ids, "energy_mj"] / ltr[ids]).median())
        base = p_mean * lte[tid]
        err = (pred_e / y - 1) * 100
        out[mode] = {"a": em.a, "b_w": em.b, "models": len(tid),
                     "mape": mape(y, pred_e), "signed_mean": float(err.mean()),
                     "within_10pct": float((err.abs() <= 10).mean()),
                     "kendall_tau": float(pd.Series(pred_e).corr(y, method="kendall")),
                     "baseline_const_power_x_latency_mape": mape(y, base),
                     "per_model": {i: [float(y[i]), float(pred_e[i])] for i in tid}}
        if mode == "predicted latency" and a.save:
            em.info = {"trained_on": [a.kernels, a.train], "calibration": mode,
                       "protocol_c_mape": out[mode]["mape"]}
            em.save(a.save)
        elif pred is None and a.save and not a.predictor:
            em.info = {"trained_on": [a.kernels, a.train], "calibration": mode}
            em.save(a.save)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("apgpm", "energy"))
    ap.add_argument("--data", default="datasets/h100-cuda-kernel-counters")
    ap.add_argument("--criterion", default="adjusted")
    ap.add_argument("--combine-top", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernels", default="datasets/h100-cuda-kernel-counters")
    ap.add_argument("--train", default="datasets/h100-cuda-energy-synthetic")
    ap.add_argument("--train-latency", default="datasets/h100-cuda-synthetic")
    ap.add_argument("--test", default="datasets/h100-cuda-zoo")
    ap.add_argument("--test-energy", default="datasets/h100-cuda-energy-zoo")
    ap.add_argument("--predictor", default="")
    ap.add_argument("--save", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = run_apgpm(a) if a.what == "apgpm" else run_energy(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    show = {k: v for k, v in res.items() if k not in ("selection_path", "clusters_on_all_workloads")}
    for mode in ("measured latency", "predicted latency"):
        if mode in show:
            show[mode] = {k: v for k, v in show[mode].items() if k != "per_model"}
    print(json.dumps(show, indent=1, default=float))


if __name__ == "__main__":
    main()
