"""Dev script: evaluate APGPM and energy per inference on the H100 datasets (docs/energy.md).

    python scripts/power_eval.py apgpm --data datasets/h100-cuda-kernel-counters \
        --out docs/results/power-apgpm-h100-cuda
    python scripts/power_eval.py energy --kernels datasets/h100-cuda-kernel-counters \
        --train datasets/h100-cuda-energy-synthetic --train-latency datasets/h100-cuda-synthetic \
        --test datasets/h100-cuda-zoo --test-energy datasets/h100-cuda-energy-zoo \
        [--predictor DIR] --save DIR/energy --out docs/results/energy-c-h100-cuda-zoo

`apgpm`: counter event rates of each workload (ncu counts `.sum` divided by the workload's time
per call in the replayed graph; ratios and percentages as ncu gives them and weighted by
`busy` = ncu kernel time / time per call, i.e. averaged over the power window) against the
measured dynamic power; `--repeats` random 2/3-1/3 splits
(the paper's) of the workloads; APGPM (plain; inverted + combined; with `--select`, its
criterion and clipping chosen by 5-fold CV inside each training part), the
utilization-frequency baseline (NVML utilization and SM clock of the power window; and with
`busy` as utilization), All-counters and top-k, every one fitted with `--weighting` (relative
by default: least squares on the relative error; none: the paper's ordinary least squares).
MAPE on the held-out third, mean over the splits. `--counts raw` re-reads the counters from the device calls' ncu pages with every count
(`.avg` / `.max` / `.min` per-unit counts too) summed over CUDA kernels and made a rate.

`energy`: protocol (c): the kernel power regressor trained on the per-kernel dataset, the
calibration (a, b) on the synthetic models' energy, tested on the zoo's. Kernel latencies and
end-to-end latency either measured (the in-context kernel times and replay latency of the
latency datasets) or predicted by `--predictor` (a latpred LatencyModel of the same target).
Each mode's `decomposition` splits the error into its power and latency parts (`decompose`).
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
from latpred.power import (APGPM, AllCountersModel, APGPMSelect, TopKModel,  # noqa: E402
                           UtilFreqModel, mape)
from latpred.power.apgpm import SELECT_DEFAULT  # noqa: E402
from latpred.power.fitting import WEIGHTINGS  # noqa: E402
from latpred.power.energy import EnergyModel, KernelPowerModel, calibrate  # noqa: E402

TARGET = "h100/cuda/fp16"


RUNS = tuple(f"docs/results/power-campaigns/c{i}" for i in (2, 3, 4, 5, 6))
LABELS = {"dyn": "power_dyn_w", "aligned": "power_aligned_dyn_w"}


def rates(data: str, runs=()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernel rows with counters, counter rate table aligned to them).

    Without `runs`, the shipped `counters.parquet`: `.sum` counts become rates (count / time
    per call) and everything else is taken as ncu gives it (a time-weighted mean over the
    workload's CUDA kernels). With `runs` (the device calls' raw ncu pages), the counters are
    re-read from the pages with *every* count summed over the CUDA kernels (`.avg` / `.max` /
    `.min` per-unit counts too, `power_counters.is_count`) and made a rate: the paper's event
    rates."""
    ds = Dataset.open(data)
    k = ds.kernels(TARGET)
    extra = pd.read_parquet(Path(data) / "kernels.parquet") if (Path(data) /
                                                               "kernels.parquet").is_file() \
        else k
    k = k.merge(extra[["model_id", "kernel_index"] + [c for c in extra.columns
                                                      if c not in k.columns]],
                on=["model_id", "kernel_index"], how="left")
    units = json.loads((Path(data) / "counter_units.json").read_text())
    if runs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from power_counters import counters, is_count

        parts = [counters(Path(r), sum_counts=True)[0] for r in runs]
        c = pd.concat([p for p in parts if len(p)], ignore_index=True)
        c = c.drop_duplicates("workload", keep="last").drop(columns=["source"], errors="ignore")
        c = k[["workload", "model_id", "kernel_index"]].merge(c, on="workload", how="inner")
        count = lambda col: is_count(col, units)  # noqa: E731
    else:
        c = pd.read_parquet(Path(data) / "counters.parquet")
        count = lambda col: col.endswith(".sum")  # noqa: E731
    m = k.merge(c, on=["model_id", "kernel_index"], how="inner", suffixes=("", "_ncu"))
    per_ms = m["latency_ms"].to_numpy()
    skip = {"workload", "model_id", "kernel_index", "source", "source_ncu", "n_cuda_kernels",
            "workload_ncu"}
    cols = {}
    for col in c.columns:
        if col in skip:
            continue
        v = pd.to_numeric(m[col], errors="coerce").to_numpy(float)
        cols[col + "/ms" if count(col) else col] = v / per_ms if count(col) else v
    X = pd.DataFrame(cols, index=m.index)
    if "gpu__time_duration.sum/ms" in X:
        # the share of the power window the kernels ran (ncu's time at its locked clocks over
        # the time per call in the replayed graph), and every ratio / percentage weighted by
        # it: its average over the window, gaps between launches included
        # (ncu reports the duration in us; at its locked base clock, so busy can pass 1)
        unit = units.get("gpu__time_duration.sum", "us")
        busy = X["gpu__time_duration.sum/ms"] / {"ns": 1e6, "us": 1e3, "ms": 1.0}[unit]
        other = [c for c in X.columns if not c.endswith("/ms")]
        X = pd.concat([X, X[other].mul(busy, axis=0).add_suffix(" x busy")], axis=1)
        X["busy"] = busy
    return m, X


def run_apgpm(a) -> dict:
    m, X = rates(a.data, RUNS if a.counts == "raw" else ())
    # "aligned": every call on the first call's scale (its retests measure the offset: GPU
    # temperature, docs/energy.md); equal to power_dyn_w for the first call's workloads
    if not a.all_calls:
        # Only the workloads whose power the first call measured: a later call's labels carry
        # its offset (5.7-11.7 W over the retested workloads), which the median shift of
        # `power_aligned_dyn_w` removes only on average (50 splits, relative least squares:
        # 3.63% with them on 297 workloads, 3.53% without on 170; docs/energy.md).
        calls = Dataset.open(a.data).manifest["targets"][TARGET]["device_calls"]
        first = m["source"] == calls[0]
        m, X = m[first].reset_index(drop=True), X[first.to_numpy()].reset_index(drop=True)
    y = m[LABELS[a.label]].to_numpy()
    X = X.loc[:, np.isfinite(X.to_numpy()).all(axis=0)]
    n = len(y)
    res: dict = {}
    kw = {"criterion": a.criterion, "weighting": a.weighting, "nonneg": a.nonneg, "clip": a.clip}
    models = {
        "APGPM (linear)": lambda: APGPM(**kw),
        "APGPM (inverted + combined)": lambda: APGPM(**kw, inverted=True,
                                                     combine_top=a.combine_top),
        "All counters": lambda: AllCountersModel(a.weighting),
    }
    if a.select:
        models["APGPM (settings chosen by 5-fold CV on the training part)"] = \
            lambda: APGPMSelect({k: {**v, "weighting": a.weighting} for k, v in
                                 SELECT_DEFAULT.items()}, seed=a.select_seed)
    chosen = {}
    for r in range(a.repeats):
        rng = np.random.default_rng(r)
        order = rng.permutation(n)
        tr, te = order[: 2 * n // 3], order[2 * n // 3:]
        for name, make in models.items():
            mod = make().fit(X.iloc[tr], y[tr])
            res.setdefault(name, []).append(mape(y[te], mod.predict(X.iloc[te])))
            if isinstance(mod, (APGPM, APGPMSelect)):
                chosen.setdefault(name, []).append(mod.summary())
        k = len(chosen["APGPM (linear)"][-1]["counters_used"])
        top = TopKModel(k, a.weighting).fit(X.iloc[tr], y[tr])
        res.setdefault("top-k counters (k = APGPM's)", []).append(
            mape(y[te], top.predict(X.iloc[te])))
        for uname, util in (("util-freq (NVML utilization)", m["util_gpu"].to_numpy(float)),
                            ("util-freq (ncu busy fraction)",
                             X["busy"].to_numpy() if "busy" in X else None)):
            if util is None:
                continue
            uf = UtilFreqModel(weighting=a.weighting).fit(util[tr], m["sm_clock_mhz"].to_numpy()[tr], y[tr])
            res.setdefault(uname, []).append(
                mape(y[te], uf.predict(util[te], m["sm_clock_mhz"].to_numpy()[te])))
    # the standard error of the mean over splits (the splits overlap, so it is a lower bound)
    summary = {name: {"mape_mean": float(np.mean(v)), "mape_min": float(np.min(v)),
                      "mape_max": float(np.max(v)),
                      "mape_se": float(np.std(v, ddof=1) / math.sqrt(len(v))),
                      "per_split": [float(x) for x in v]} for name, v in res.items()}
    full = APGPM(**kw).fit(X, y)
    out = {"workloads": n, "counters": int(X.shape[1]), "repeats": a.repeats,
           "calls": sorted(m["source"].unique()),
           "counts": a.counts,
           "criterion": a.criterion, "weighting": a.weighting, "nonneg": a.nonneg,
           "clip": a.clip, "target": LABELS[a.label] + " (board power - idle power)",
           "power_range_w": [float(y.min()), float(y.max())], "results": summary,
           "counters_used": {name: [len(s["counters_used"]) for s in v]
                             for name, v in chosen.items()},
           "chosen_settings": {name: [s["chosen"] for s in v] for name, v in chosen.items()
                               if v and "chosen" in v[0]},
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


def decompose(pred_e: pd.Series, y: pd.Series, lat: pd.Series, measured: pd.DataFrame,
              ratio: float) -> dict:
    """Where the energy error comes from. The label is dynamic power x the latency of the power
    window (replays run slower while the host polls NVML); the prediction uses undisturbed
    latencies. With `ratio` (window / undisturbed latency, median of the *training* models),
    pred / label = (predicted power / measured power) x (ratio x latency / window latency):
    the power part and the latency part. Also the error by energy tercile."""
    lat_part = ratio * lat / measured["latency_ms"] - 1
    pow_part = (pred_e / (ratio * lat)) / measured["power_dyn_w"] - 1
    err = (pred_e / y - 1) * 100
    terc = pd.qcut(y, 3, labels=["small", "mid", "large"])
    return {"window_over_undisturbed_latency_train_median": ratio,
            "latency_part_mape": float(lat_part.abs().mean() * 100),
            "latency_part_signed": float(lat_part.mean() * 100),
            "power_part_mape": float(pow_part.abs().mean() * 100),
            "power_part_signed": float(pow_part.mean() * 100),
            "corr_error_vs_measured_power": float(np.corrcoef(err, measured["power_dyn_w"])[0, 1]),
            "by_energy_tercile": {str(t): {"models": int((terc == t).sum()),
                                           "mape": float(err[terc == t].abs().mean()),
                                           "signed": float(err[terc == t].mean())}
                                  for t in ("small", "mid", "large")}}


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
                     "decomposition": decompose(pred_e, y, lte[tid], test_e.loc[tid],
                                                float((train_e.loc[ids, "latency_ms"] /
                                                       ltr[ids]).median())),
                     "per_model": {i: [float(y[i]), float(pred_e[i])] for i in tid}}
        if mode == "predicted latency" and a.save:
            em.info = {"trained_on": [a.kernels, a.train], "calibration": mode,
                       "protocol_c_mape": out[mode]["mape"]}
            em.save(a.save)
        elif pred is None and a.save and not a.predictor:
            em.info = {"trained_on": [a.kernels, a.train], "calibration": mode}
            em.save(a.save)
    return out


def run_energy_cv(a) -> dict:
    """Choices for the energy model by cross-validation on the *training* data only (no zoo):
    the kernel power regressor by 5-fold CV over the kernels grouped by source model (MAPE per
    kernel type), and the whole energy model by 5-fold CV over the synthetic energy models
    (`--cv-seeds` shuffles; the kernel regressor refitted without the held-out models' kernels,
    (a, b) on the other models, measured latencies), for two calibration forms: `b * L` (the
    shipped one) and `b * (L - sum t_k)` (the gaps between kernels)."""
    from scipy.optimize import nnls
    from sklearn.model_selection import GroupKFold, KFold

    kd = Dataset.open(a.kernels).kernels(TARGET)
    kd = kd[(kd.status == "ok") & kd["power_aligned_dyn_w"].notna()].reset_index(drop=True)
    y = kd["power_aligned_dyn_w"].to_numpy()
    pred = np.zeros(len(kd))
    for tr, te in GroupKFold(5).split(kd, groups=kd.model_id):
        pm = KernelPowerModel().fit(kd.iloc[tr], y[tr], kd.latency_ms.iloc[tr])
        pred[te] = pm.predict(kd.iloc[te], kd.latency_ms.iloc[te])
    err = pd.Series((pred / y - 1) * 100)
    out = {"kernel_power_cv_mape": float(err.abs().mean()),
           "kernel_power_cv_by_type": {t: {"kernels": int(len(g)), "mape": float(g.abs().mean()),
                                           "signed": float(g.mean())}
                                       for t, g in err.groupby(kd.kernel_type.to_numpy())}}
    train_e = Dataset.open(a.train).models(TARGET)
    train_e = train_e[train_e.status == "ok"].set_index("model_id")
    ktr = _model_kernels(a.train_latency, TARGET)
    ktr = ktr[ktr.model_id.isin(train_e.index)]
    ltr = Dataset.open(a.train_latency).models(TARGET).set_index("model_id").latency_ms
    ids = np.array([i for i in train_e.index if i in ltr.index and i in set(ktr.model_id)])
    e = train_e.loc[ids, "energy_mj"]
    busy = ktr.groupby("model_id").latency_ms.sum()
    forms = {"b * L": lambda L, t: L, "b * (L - sum t_k)": lambda L, t: np.maximum(L - t, 0)}
    res: dict = {f: [] for f in forms}
    coefs: dict = {f: [] for f in forms}
    for seed in range(a.cv_seeds):
        preds = {f: pd.Series(index=ids, dtype=float) for f in forms}
        for tr, te in KFold(5, shuffle=True, random_state=seed).split(ids):
            keep = ~kd.model_id.isin(ids[te])
            pm = KernelPowerModel().fit(kd[keep], y[keep.to_numpy()], kd.latency_ms[keep])
            s = pd.Series(pm.predict(ktr, ktr.latency_ms.to_numpy()) * ktr.latency_ms.to_numpy(),
                          index=ktr.index).groupby(ktr.model_id).sum()
            for f, other in forms.items():
                A = np.column_stack([s[ids].to_numpy(),
                                     other(ltr[ids].to_numpy(), busy[ids].to_numpy())])
                w = 1.0 / e.to_numpy()
                coef, _ = nnls(A[tr] * w[tr, None], (e.to_numpy() * w)[tr])
                preds[f].iloc[te] = A[te] @ coef
                coefs[f].append([float(c) for c in coef])
        for f in forms:
            res[f].append(mape(e, preds[f]))
    out["synthetic_models"] = len(ids)
    out["energy_cv"] = {f: {"mape_mean": float(np.mean(v)), "per_seed": v,
                            "a_b_range": [np.min(coefs[f], axis=0).tolist(),
                                          np.max(coefs[f], axis=0).tolist()]}
                        for f, v in res.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("apgpm", "energy", "energy-cv"))
    ap.add_argument("--cv-seeds", type=int, default=3)
    ap.add_argument("--data", default="datasets/h100-cuda-kernel-counters")
    ap.add_argument("--criterion", default="adjusted")
    ap.add_argument("--combine-top", type=int, default=30)
    ap.add_argument("--weighting", choices=WEIGHTINGS, default="relative",
                    help="apgpm: least squares of every linear model (APGPM and baselines): "
                         "relative (1 / power^2 weights: relative error, as MAPE) or none "
                         "(ordinary least squares, the paper's)")
    ap.add_argument("--nonneg", action="store_true", help="apgpm: APGPM's coefficients >= 0")
    ap.add_argument("--clip", action="store_true",
                    help="apgpm: APGPM clips representatives to their training range")
    ap.add_argument("--select", action="store_true",
                    help="also APGPMSelect: criterion and clipping chosen per split by 5-fold "
                         "CV MAPE inside the training two thirds")
    ap.add_argument("--select-seed", type=int, default=0)
    ap.add_argument("--counts", choices=("raw", "shipped"), default="shipped",
                    help="raw: every count re-read from the device calls' ncu pages, summed "
                         "over CUDA kernels and made a rate; shipped: counters.parquet, only "
                         "`.sum` counts made rates (the first evaluation)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--all-calls", action="store_true",
                    help="apgpm: also the workloads whose power a later call measured")
    ap.add_argument("--label", choices=tuple(LABELS), default="aligned",
                    help="apgpm: each call's own idle-subtracted power (dyn) or every call "
                         "shifted onto the first call's scale (aligned)")
    ap.add_argument("--kernels", default="datasets/h100-cuda-kernel-counters")
    ap.add_argument("--train", default="datasets/h100-cuda-energy-synthetic")
    ap.add_argument("--train-latency", default="datasets/h100-cuda-synthetic")
    ap.add_argument("--test", default="datasets/h100-cuda-zoo")
    ap.add_argument("--test-energy", default="datasets/h100-cuda-energy-zoo")
    ap.add_argument("--predictor", default="")
    ap.add_argument("--save", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = {"apgpm": run_apgpm, "energy": run_energy, "energy-cv": run_energy_cv}[a.what](a)
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
