"""Kernel-level validation of the tile features on the H100 cuDNN sweep (runs locally).

    # once: turn the device sweep's JSONL (run + retest) into the shipped dataset
    python scripts/tile_validation.py build RUN1.jsonl RUN2.jsonl META.json
    # the table of docs/analytical-features.md
    python scripts/tile_validation.py evaluate [--split random|case]

Methods, each fitted on the training rows and scored on held-out configurations:
(1) the paper's model (tile latency model per cuDNN kernel + kernel selection classifier), in
Eq. 2's grid form and a wave-aware form; (2) FLOPs-linear (per dtype); (3) LightGBM on the
configuration, FLOPs and memory terms; (4) the same plus the tile/wave features of
latpred.features.tile for the h100 profile's candidate tiles.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GroupKFold, GroupShuffleSplit, KFold, train_test_split

from latpred.features.tile import conv_gemm, gemm_features
from latpred.features.tile_model import TileLatencyModel, fit_tau, gemm_terms, name_tile
from latpred.target import load_device

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "datasets" / "h100-cudnn-conv"
BASE = ["N", "C", "H", "W", "K", "R", "S", "P", "Q", "stride", "is_fp16", "flops", "m_in",
        "m_out"]


def _main_kernel(kernels: list[dict]) -> dict:
    return max(kernels, key=lambda k: k["dur_us"])


def build(run1: Path, run2: Path, meta: Path) -> None:
    """One parquet row per configuration; the retest's median and kernel sit beside."""
    first = [json.loads(line) for line in run1.read_text().splitlines()]
    again = {_key(r): r for r in map(json.loads, run2.read_text().splitlines())}
    rows = []
    for r in first:
        main = _main_kernel(r["kernels"])
        t = np.asarray(r["times_ms"])
        q1, q3 = np.percentile(t, [25, 75])
        re = again.get(_key(r))
        gx, gy, gz = main["grid"]
        rows.append({k: r[k] for k in ("case", "net", "dtype", "N", "C", "H", "W", "K", "R",
                                       "S", "stride", "pad_h", "pad_w", "P", "Q", "flops")}
                    | dict(latency_ms=r["latency_ms"], latency_iqr_ms=q3 - q1,
                           latency_min_ms=float(t.min()), n_runs=len(t),
                           kernel=main["name"], grid=gx * gy * gz, grid_x=gx, grid_y=gy,
                           grid_z=gz, block=int(np.prod(main["block"])),
                           registers=main["regs"], shared_memory=main["smem"],
                           kernel_us=main["dur_us"], n_kernels=len(r["kernels"]),
                           kernels=json.dumps([k["name"] for k in r["kernels"]]),
                           sleep_cycles=r["sleep_cycles"], glitch_retries=r["glitch_retries"],
                           timing_clean=r["timing_clean"],
                           retest_latency_ms=re["latency_ms"] if re else np.nan,
                           retest_kernel=_main_kernel(re["kernels"])["name"] if re else ""))
    df = pd.DataFrame(rows)
    DATASET.mkdir(parents=True, exist_ok=True)
    df.to_parquet(DATASET / "convs.parquet", index=False)
    m = json.loads(meta.read_text())
    rel = (df["retest_latency_ms"] - df["latency_ms"]).abs() / df["latency_ms"]
    manifest = {
        "format_version": 1, "name": "h100-cudnn-conv",
        "created": datetime.date.today().isoformat(),
        "description": "cuDNN forward convolutions on the device machine's H100 over the "
                       "distinct layer geometries of ResNet-50 and Inception-v3, channels "
                       "swept in steps of 16; one row per configuration (convs.parquet).",
        "script": f"scripts/h100_conv_sweep.py --seconds {m['seconds']:g} (retest: --seed 1)",
        "machine": m["gpu"], "sms": m["sms"], "torch": m["torch"], "cuda": m["cuda"],
        "cudnn": m["cudnn"], "cudnn_benchmark": m["cudnn_benchmark"],
        "allow_tf32": m["allow_tf32"], "repeats": m["reps"], "warmup": 1,
        "timing": "CUDA events per launch, launches queued behind torch.cuda._sleep; median; "
                  "re-timed behind a 4x longer sleep (up to 3 times) when the sleep ran out "
                  "before the launches were queued",
        "sleep_retimed": float((df["glitch_retries"] > 0).mean()),
        "timing_clean": float(df["timing_clean"].mean()),
        "n_configs": len(df),
        "noise": {"retest_mdape": float(rel.median()), "retest_within_10pct": float(
            (rel <= 0.1).mean()), "retest_same_kernel": float(
            (df["retest_kernel"] == df["kernel"]).mean()), "n_retest": int(rel.notna().sum())},
    }
    (DATASET / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(df)} rows -> {DATASET}")


def _key(r: dict) -> tuple:
    return r["case"], r["dtype"], r["N"], r["C"], r["K"]


def load() -> pd.DataFrame:
    df = pd.read_parquet(DATASET / "convs.parquet")
    df["is_fp16"] = (df["dtype"] == "fp16").astype(int)
    g = [conv_gemm(*(int(v) for v in row)) for row in
         df[["N", "C", "H", "W", "K", "R", "S", "P", "Q"]].itertuples(index=False)]
    df["m_in"] = [x.m_in for x in g]
    df["m_out"] = [x.m_out for x in g]
    return df


def tile_columns(df: pd.DataFrame) -> pd.DataFrame:
    gpu = load_device("h100").gpu
    rows = [gemm_features(conv_gemm(*(int(v) for v in r)), gpu.tile_shapes, gpu.compute_units)
            for r in df[["N", "C", "H", "W", "K", "R", "S", "P", "Q"]].itertuples(index=False)]
    return pd.DataFrame(rows, index=df.index).drop(columns=["m_in", "m_out"])


def metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    rel = np.abs(p - y) / y
    return {"acc10": float((rel <= 0.1).mean()), "rmse_ms": float(np.sqrt(np.mean((p - y) ** 2))),
            "mape": float(rel.mean()), "mdape": float(np.median(rel))}


def score(test: pd.DataFrame, p: np.ndarray) -> dict[str, float]:
    """Metrics against the measured latency, plus ±10% on the reproducible rows (run and
    retest within 10% of each other), the rows whose label a predictor can hope to match."""
    y = test["latency_ms"].to_numpy()
    out = metrics(y, p)
    ok = (np.abs(test["retest_latency_ms"].to_numpy() - y) <= 0.1 * y)
    out["acc10_repro"] = metrics(y[ok], p[ok])["acc10"]
    return out


def _trailing_zeros(x: pd.Series) -> np.ndarray:
    """Power-of-two divisibility of a channel count: cuDNN's kernels differ by alignment."""
    v = x.to_numpy(np.int64)
    return sum((v % (2 ** (b + 1)) == 0).astype(float) for b in range(11))


def config_columns(df: pd.DataFrame) -> pd.DataFrame:
    """BASE plus GEMM M / K, padding and the channel counts' power-of-two divisibility."""
    return df[BASE].assign(gemm_m=df["N"] * df["P"] * df["Q"],
                           gemm_k=df["C"] * df["R"] * df["S"], pad=df["pad_h"],
                           tz_c=_trailing_zeros(df["C"]), tz_k=_trailing_zeros(df["K"]))


# LightGBM settings; `objective` and `num_leaves` are chosen by cross-validation on the
# training part (GRID), everything else is fixed.
GBDT = dict(n_estimators=2000, learning_rate=0.04, min_child_samples=5, subsample=0.8,
            subsample_freq=1, colsample_bytree=0.8, random_state=0, n_jobs=1, verbose=-1)
GRID = [{"objective": o, "num_leaves": n} for o in ("l2", "l1") for n in (31, 63)]


def gbdt(xtr: pd.DataFrame, ytr: np.ndarray, xte: pd.DataFrame, **params) -> np.ndarray:
    """LightGBM on log-latency. objective="l1" on the log is the median log-ratio: a
    relative-error fit that a few glitched labels cannot pull (l2 chases them)."""
    reg = lgb.LGBMRegressor(**(GBDT | {"objective": "l2", "num_leaves": 63} | params))
    reg.fit(xtr, np.log(ytr))
    return np.exp(reg.predict(xte))


def tune(x: pd.DataFrame, y: np.ndarray, folds: list) -> dict:
    """The GRID point with the best cross-validated ±10% accuracy (training rows only)."""
    def cv(params: dict) -> float:
        return float(np.mean([metrics(y[b], gbdt(x.iloc[a], y[a], x.iloc[b], **params))["acc10"]
                              for a, b in folds]))
    return max(GRID, key=cv)


def implementation(df: pd.DataFrame) -> pd.Series:
    """The implementation cuDNN ran: the whole kernel sequence (layout transposes included),
    since the label is the whole convolution's time, not the main kernel's."""
    return df["kernels"]


def two_stage(train: pd.DataFrame, test: pd.DataFrame, folds: list,
              min_rows: int = 3) -> tuple[np.ndarray, float, np.ndarray]:
    """Implementation classifier (random forest; rare ones pooled) whose prediction is one more
    GBDT column. Training rows get out-of-fold predictions, so the regressor learns how far to
    trust the classifier. Returns latency, selection accuracy and the predicted sequences."""
    xtr, xte = config_columns(train), config_columns(test)
    impl = implementation(train)
    counts = impl.value_counts()
    lab = impl.where(impl.isin(counts[counts >= min_rows].index), "_rare").to_numpy()
    oof = np.empty(len(train), dtype=object)
    for a, b in folds:
        oof[b] = _forest().fit(xtr.iloc[a], lab[a]).predict(xtr.iloc[b])
    pte = _forest().fit(xtr, lab).predict(xte)
    cats = pd.Categorical(np.concatenate([lab, pte])).categories
    xtr = xtr.assign(impl=pd.Categorical(oof, categories=cats).codes)
    xte = xte.assign(impl=pd.Categorical(pte, categories=cats).codes)
    ytr = train["latency_ms"].to_numpy()
    params = tune(xtr, ytr, folds)
    acc = float((pte == implementation(test).to_numpy()).mean())
    return gbdt(xtr, ytr, xte, **params), acc, pte


def _forest() -> RandomForestClassifier:
    return RandomForestClassifier(n_estimators=300, random_state=0, n_jobs=1)


def _folds(train: pd.DataFrame, split: str, seed: int) -> list:
    """3 folds of the training part, split the way the test part is (by geometry for case)."""
    idx = np.arange(len(train))
    if split == "random":
        return list(KFold(3, shuffle=True, random_state=seed).split(idx))
    return list(GroupKFold(3).split(idx, groups=train["case"]))


# Helper kernels around the GEMM: layout transposes, xmma's work init, split-K reduction.
HELPERS = ("nchwToNhwc", "nhwcToNchw", "init_device_work", "splitKreduce")


def gemm_kernel(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `kernel` = the convolution's GEMM kernel (its one kernel that is no helper)
    and `grid` = that kernel's grid, NaN where the sweep recorded another (it kept the longest
    kernel, a layout transpose in 14% of the rows)."""
    names = [next((k for k in json.loads(ks) if not any(t in k for t in HELPERS)),
                  json.loads(ks)[-1]) for ks in df["kernels"]]
    grid = np.where(np.asarray(names, dtype=object) == df["kernel"].to_numpy(),
                    df["grid"].to_numpy(float), np.nan)
    return df.assign(kernel=names, grid=grid)


def paper_rows(train: pd.DataFrame, test: pd.DataFrame, impl: np.ndarray) -> dict:
    """The paper's model: grid and wave-aware forms keyed by the longest kernel (as fitted
    before), then keyed by the GEMM kernel with the tile read from its name; each with its own
    selection classifier, the true kernel, and the kernel of the implementation that
    two_stage's forest picked."""
    out = {}
    variants = (("grid", False, train, test), ("waves", False, train, test),
                ("waves, GEMM kernel, named tile", True, gemm_kernel(train), gemm_kernel(test)))
    for name, named, tr, te in variants:
        m = TileLatencyModel(work=name[:5], tile_from_name=named).fit(tr)
        out[f"(1) paper ({name})"] = score(te, m.predict(te)) | {"selection_acc": float(
            (m.predict_kernel(te) == np.where(te["kernel"].isin(m.models_),
                                              te["kernel"], "_rare")).mean())}
        out[f"(1) paper ({name}), true kernel"] = score(te, m.predict(te, te["kernel"].tolist()))
        if name != "grid":
            main = tr.groupby(implementation(tr))["kernel"].agg(lambda k: k.mode().iloc[0])
            picked = [main.get(k, "_rare") for k in impl]
            out[f"(1) paper ({name}), forest selection"] = score(te, m.predict(te, picked))
    return out


def evaluate(split: str, seed: int) -> dict[str, dict[str, float]]:
    df = load()
    if split == "random":
        tr, te = train_test_split(np.arange(len(df)), test_size=0.2, random_state=seed)
    else:  # hold out whole layer geometries (and their dtypes / batches)
        gss = GroupShuffleSplit(n_splits=1, test_size=0.2, random_state=seed)
        tr, te = next(gss.split(df, groups=df["case"]))
    train, test = df.iloc[tr], df.iloc[te]
    folds = _folds(train, split, seed)
    staged, sel_acc, impl = two_stage(train, test, folds)
    out = paper_rows(train, test, impl)
    flops = np.empty(len(test))
    for dt in ("fp16", "fp32"):
        a, b = train["dtype"] == dt, (test["dtype"] == dt).to_numpy()
        lin = LinearRegression().fit(train.loc[a, ["flops"]], train.loc[a, "latency_ms"])
        flops[b] = lin.predict(test.loc[b, ["flops"]])
    out["(2) FLOPs-linear"] = score(test, flops)
    ytr = train["latency_ms"].to_numpy()
    tiles = tile_columns(df)
    out["(3) GBDT (l2, old features)"] = score(test, gbdt(train[BASE], ytr, test[BASE]))
    xtr, xte = pd.concat([train[BASE], tiles.iloc[tr]], axis=1), pd.concat(
        [test[BASE], tiles.iloc[te]], axis=1)
    out["(4) GBDT + tile features (l2, old features)"] = score(test, gbdt(xtr, ytr, xte))
    xtr, xte = config_columns(train), config_columns(test)
    params = tune(xtr, ytr, folds)
    out[f"(3') GBDT, CV-tuned {params}"] = score(test, gbdt(xtr, ytr, xte, **params))
    extra = tiles.drop(columns=[c for c in tiles.columns if c in xtr.columns])
    xtr, xte = pd.concat([xtr, extra.iloc[tr]], axis=1), pd.concat([xte, extra.iloc[te]], axis=1)
    out["(4') GBDT + tile features, same settings"] = score(test, gbdt(xtr, ytr, xte, **params))
    out["(5) implementation classifier + GBDT"] = score(test, staged) | {"selection_acc": sel_acc}
    return out


def diagnose() -> None:
    """What the label is and where it is unreliable (the facts docs/analytical-features.md
    cites): main kernel's share of the conv's time, kernels per conv, glitched rows."""
    df = load()
    df["main_share"] = df["kernel_us"] / 1e3 / df["latency_ms"]
    ratio = df["latency_ms"] / df["retest_latency_ms"]
    df["glitch"] = (ratio > 2) | (ratio < 0.5)
    rel = (df["retest_latency_ms"] - df["latency_ms"]).abs() / df["latency_ms"]
    df["retest_ok"] = rel <= 0.1
    print(df.groupby(["dtype", "N"]).agg(
        configs=("case", "size"), median_ms=("latency_ms", "median"),
        kernels=("n_kernels", "mean"), main_share=("main_share", "median"),
        retest_ok=("retest_ok", "mean"), glitch=("glitch", "mean")).round(3).to_string())
    bins = pd.cut(df["latency_ms"], [0, 0.01, 0.02, 0.05, 0.1, 1, 10])
    print(df.groupby(bins, observed=True).agg(configs=("case", "size"), retest_ok=(
        "retest_ok", "mean"), glitch=("glitch", "mean")).round(3).to_string())
    print(f"run/retest differ > 2x: {int(df['glitch'].sum())} rows ({df['glitch'].mean():.1%}); "
          f"run slower: {int((ratio > 2).sum())}, retest slower: {int((ratio < 0.5).sum())}")
    helper = df["kernel"].str.contains("|".join(HELPERS))
    print(f"recorded (longest) kernel is a helper, not the GEMM: {helper.mean():.1%} of rows")
    terms = gemm_terms(df)
    counts = df["kernel"].value_counts()
    named = [k for k in counts[counts >= 8].index if name_tile(k)]
    same = sum(fit_tau(terms["gm"][df["kernel"] == k].to_numpy(float),
                       terms["gn"][df["kernel"] == k].to_numpy(float),
                       df.loc[df["kernel"] == k, "grid"].to_numpy(float)) == name_tile(k)
               for k in named)
    print(f"kernels seen >= 8 times with a tile in their name: {len(named)}; "
          f"Eq. 3's tile from the launch grid equals the named one for {same}")


def plot(path: Path, case: int = 6, dtype: str = "fp16", batch: int = 32) -> None:
    """Latency and main-kernel grid against K for one layer geometry (the step figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = load()
    sel = df[(df["case"] == case) & (df["dtype"] == dtype) & (df["N"] == batch)]
    c0 = sel["C"].mode().iloc[0]
    sel = sel[sel["C"] == c0].sort_values("K")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, part in sel.groupby("kernel"):
        tile = re.search(r"(sm\d+).*(tilesize\d+x\d+x\d+)", name)
        ax.scatter(part["K"], part["latency_ms"] * 1e3, s=12,
                   label=" ".join(tile.groups()) if tile else name[:40])
    ax.set_xlabel("output channels K")
    ax.set_ylabel("latency (us)")
    ax2 = ax.twinx()
    ax2.step(sel["K"], sel["grid"], where="mid", color="k", lw=0.8)
    ax2.set_ylabel("grid size (thread blocks)")
    r = sel.iloc[0]
    ax.set_title(f"H100 cuDNN, {dtype}, N={batch}, C={c0}, {r.H}x{r.W}, {r.R}x{r.S} "
                 f"stride {r.stride}", fontsize=9)
    ax.legend(fontsize=5, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("run1", type=Path)
    b.add_argument("run2", type=Path)
    b.add_argument("meta", type=Path)
    e = sub.add_parser("evaluate")
    e.add_argument("--split", choices=("random", "case"), default="random")
    e.add_argument("--seed", type=int, default=0)
    pl = sub.add_parser("plot")
    pl.add_argument("path", type=Path)
    pl.add_argument("--case", type=int, default=6)
    sub.add_parser("diagnose")
    args = ap.parse_args(argv)
    if args.cmd == "diagnose":
        diagnose()
        return
    if args.cmd == "plot":
        plot(args.path, args.case)
        return
    if args.cmd == "build":
        build(args.run1, args.run2, args.meta)
        return
    res = evaluate(args.split, args.seed)
    print(f"| method ({args.split} split, seed {args.seed}) | within ±10% | ±10%, reproducible "
          "rows | RMSE (ms) | MAPE | MdAPE | selection acc |\n|---|---|---|---|---|---|---|")
    for name, m in res.items():
        sel = f"{m['selection_acc']:.1%}" if "selection_acc" in m else ""
        print(f"| {name} | {m['acc10']:.1%} | {m['acc10_repro']:.1%} | {m['rmse_ms']:.4f} "
              f"| {m['mape']:.1%} | {m['mdape']:.1%} | {sel} |")


if __name__ == "__main__":
    sys.exit(main())
