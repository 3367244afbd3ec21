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
import gzip
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
from latpred.device_profile import load_device

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "datasets" / "h100-cudnn-conv"
# Random layer geometries (scripts/h100_conv_sweep.py --random-geometries), one dataset per
# --geometry-seed (seed 0 has no suffix): the held-out geometry evaluations train on all.
GEOMETRIES = ROOT / "datasets" / "h100-cudnn-conv-geometries"


def geometry_sweeps() -> list[Path]:
    """Every random-geometry sweep shipped: GEOMETRIES and GEOMETRIES-g<seed>."""
    return sorted(ROOT.glob("datasets/h100-cudnn-conv-geometries*"))
GEOMETRY = ["H", "W", "R", "S", "stride", "pad_h", "pad_w"]
BASE = ["N", "C", "H", "W", "K", "R", "S", "P", "Q", "stride", "is_fp16", "flops", "m_in",
        "m_out"]


def _main_kernel(kernels: list[dict]) -> dict:
    return max(kernels, key=lambda k: k["dur_us"])


def build(run1: Path, run2: Path, meta: Path, dataset: Path | None = None,
          device_seconds: float | None = None) -> None:
    """One parquet row per configuration; the retest's median and kernel sit beside (NaN / ""
    where the retest, cut off by its time budget, did not reach the configuration). `dataset`
    defaults to DATASET; a sweep of random geometries (meta `random_geometries`) is described
    as such; `device_seconds` (the device time the calls used) goes into the manifest."""
    dataset = DATASET if dataset is None else dataset
    first = _jsonl(run1)
    again = {_key(r): r for r in _jsonl(run2)}
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
    dataset.mkdir(parents=True, exist_ok=True)
    df.to_parquet(dataset / "convs.parquet", index=False)
    m = json.loads(meta.read_text())
    rel = (df["retest_latency_ms"] - df["latency_ms"]).abs() / df["latency_ms"]
    retested = rel.notna()
    if m.get("random_geometries"):
        n_geo = df["case"].nunique()
        desc = (f"cuDNN forward convolutions on the device machine's H100 over {n_geo} random "
                "layer geometries (H = W, kernel shape, stride, padding drawn as in real "
                "CNNs; one case id per geometry) with random channel counts (multiples of "
                "16, 16-1024), fp16/fp32, batch 1/32; one row per configuration "
                "(convs.parquet); the retest covers the configurations its time reached.")
        script = (f"scripts/h100_conv_sweep.py --seconds {m['seconds']:g} --random-geometries "
                  f"{m['random_geometries']} --geometry-seed {m.get('geometry_seed', 0)} "
                  f"--pairs {m.get('pairs')} (retest: --seed 1 --only <first run's jsonl>)")
    else:
        desc = ("cuDNN forward convolutions on the device machine's H100 over the "
                "distinct layer geometries of ResNet-50 and Inception-v3, channels "
                "swept in steps of 16; one row per configuration (convs.parquet).")
        script = f"scripts/h100_conv_sweep.py --seconds {m['seconds']:g} (retest: --seed 1)"
    manifest = {
        "format_version": 1, "name": dataset.name,
        "created": datetime.date.today().isoformat(),
        "description": desc,
        "script": script,
        "machine": m["gpu"], "sms": m["sms"], "torch": m["torch"], "cuda": m["cuda"],
        "cudnn": m["cudnn"], "cudnn_benchmark": m["cudnn_benchmark"],
        "allow_tf32": m["allow_tf32"], "repeats": m["reps"], "warmup": 1,
        "timing": "CUDA events per launch, launches queued behind torch.cuda._sleep; median; "
                  "re-timed behind a 4x longer sleep (up to 3 times) when the sleep ran out "
                  "before the launches were queued",
        "sleep_retimed": float((df["glitch_retries"] > 0).mean()),
        "timing_clean": float(df["timing_clean"].mean()),
        "n_configs": len(df),
        "n_geometries": int(df["case"].nunique()),
        "noise": {"retest_mdape": float(rel.median()), "retest_within_10pct": float(
            (rel[retested] <= 0.1).mean()), "retest_same_kernel": float(
            (df["retest_kernel"] == df["kernel"])[retested].mean()),
            "n_retest": int(retested.sum())},
    }
    if device_seconds is not None:
        manifest["device_seconds"] = device_seconds
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(df)} rows -> {dataset}")


def _jsonl(path: Path) -> list[dict]:
    """The rows of a sweep.jsonl, gzipped or not (the device sends them back gzipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _key(r: dict) -> tuple:
    return r["case"], r["dtype"], r["N"], r["C"], r["K"]


def load(path: Path | None = None) -> pd.DataFrame:
    df = pd.read_parquet((DATASET if path is None else path) / "convs.parquet")
    df["is_fp16"] = (df["dtype"] == "fp16").astype(int)
    g = [conv_gemm(*(int(v) for v in row)) for row in
         df[["N", "C", "H", "W", "K", "R", "S", "P", "Q"]].itertuples(index=False)]
    df["m_in"] = [x.m_in for x in g]
    df["m_out"] = [x.m_out for x in g]
    return df


def load_both() -> pd.DataFrame:
    """The CASES sweep and every random-geometry sweep in one frame, `source` "cases" /
    "random", `sweep` the dataset's name, `case` = one id per geometry (H, W, R, S, stride,
    padding) across all of them: a geometry met again (in a CASES row or an earlier sweep)
    takes the id it got first, so grouping by `case` never lets a geometry sit on both sides
    of a split."""
    frames = [load().assign(source="cases", sweep=DATASET.name)]
    frames += [load(p).assign(source="random", sweep=p.name) for p in geometry_sweeps()]
    ids: dict[tuple, int] = {}
    for f in frames:
        f["case"] = [ids.setdefault(tuple(g), len(ids))
                     for g in f[GEOMETRY].itertuples(index=False)]
    return pd.concat(frames, ignore_index=True)


def split_rows(df: pd.DataFrame, split: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train / test row positions of `df` (`load_both()` for all but "random" / "case").

    random, case: the CASES sweep alone, as before (20% of its rows / of its 32 geometries).
    geometries: 20% of all geometries of both sweeps held out (their rows of both sweeps),
        trained on every other geometry's rows.
    cases+random: the case split's held-out CASES geometries (same draw as "case" for a seed)
        tested on their CASES rows; trained on the other CASES rows plus every random
        geometry that is not one of the held-out ones.
    cases+random-lenient: the same, but random rows whose geometry equals a held-out one stay
        in training (same layer shape, other channel counts)."""
    if split == "random":
        return train_test_split(np.arange(len(df)), test_size=0.2, random_state=seed)
    gss = GroupShuffleSplit(n_splits=1, test_size=0.2, random_state=seed)
    if split in ("case", "geometries"):
        return next(gss.split(df, groups=df["case"]))
    cases = (df["source"] == "cases").to_numpy()
    tr_old, te_old = next(gss.split(df[cases], groups=df.loc[cases, "case"]))
    pos = np.flatnonzero(cases)
    held = set(df["case"].iloc[pos[te_old]])
    rand = np.flatnonzero(~cases)
    if split == "cases+random":
        rand = rand[~df["case"].iloc[rand].isin(held).to_numpy()]
    return np.sort(np.concatenate([pos[tr_old], rand])), pos[te_old]


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


# The implementation forest's size. A fully grown tree stores a value per node and class: with
# the three random sweeps (74,496 rows, 537 implementations of 3+ rows) 300 trees need ~26 GB,
# so `evaluate --forest-trees / --min-impl-rows` shrink it (the comparison at one setting then
# re-runs the smaller training set at the same one).
FOREST_TREES, MIN_IMPL_ROWS = 300, 3
RARE = "_rare"   # the class of the pooled rare implementations (and kernels)


def two_stage(train: pd.DataFrame, test: pd.DataFrame, folds: list, trees: int = FOREST_TREES,
              min_rows: int = MIN_IMPL_ROWS) -> tuple[np.ndarray, float, np.ndarray]:
    """Implementation classifier (random forest; rare ones pooled) whose prediction is one more
    GBDT column. Training rows get out-of-fold predictions, so the regressor learns how far to
    trust the classifier. Returns latency, selection accuracy and the predicted sequences."""
    xtr, xte = config_columns(train), config_columns(test)
    lab = implementation_labels(train, min_rows)
    oof = np.empty(len(train), dtype=object)
    for a, b in folds:
        oof[b] = _forest(trees).fit(xtr.iloc[a], lab[a]).predict(xtr.iloc[b])
    pte = _forest(trees).fit(xtr, lab).predict(xte)
    cats = pd.Categorical(np.concatenate([lab, pte])).categories
    xtr = xtr.assign(impl=pd.Categorical(oof, categories=cats).codes)
    xte = xte.assign(impl=pd.Categorical(pte, categories=cats).codes)
    ytr = train["latency_ms"].to_numpy()
    params = tune(xtr, ytr, folds)
    acc = float((pte == implementation(test).to_numpy()).mean())
    return gbdt(xtr, ytr, xte, **params), acc, pte


def implementation_labels(train: pd.DataFrame, min_rows: int = MIN_IMPL_ROWS) -> np.ndarray:
    """Each training row's implementation, those of fewer than `min_rows` rows pooled as RARE."""
    impl = implementation(train)
    counts = impl.value_counts()
    return impl.where(impl.isin(counts[counts >= min_rows].index), RARE).to_numpy()


def _forest(trees: int = FOREST_TREES) -> RandomForestClassifier:
    return RandomForestClassifier(n_estimators=trees, random_state=0, n_jobs=1)


def _folds(train: pd.DataFrame, split: str, seed: int) -> list:
    """3 folds of the training part, split the way the test part is (by geometry for case)."""
    idx = np.arange(len(train))
    if split == "random":
        return list(KFold(3, shuffle=True, random_state=seed).split(idx))
    return list(GroupKFold(3).split(idx, groups=train["case"]))


# Helper kernels around the GEMM: layout transposes, xmma's work init, split-K reduction.
HELPERS = ("nchwToNhwc", "nhwcToNchw", "init_device_work", "splitKreduce")


def gemm_name(kernels: list[str]) -> str:
    """A kernel sequence's GEMM kernel: its first kernel that is no helper (else its last)."""
    return next((k for k in kernels if not any(t in k for t in HELPERS)), kernels[-1])


def gemm_kernel(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `kernel` = the convolution's GEMM kernel (its one kernel that is no helper)
    and `grid` = that kernel's grid, NaN where the sweep recorded another (it kept the longest
    kernel, a layout transpose in 14% of the rows)."""
    names = [gemm_name(json.loads(ks)) for ks in df["kernels"]]
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


SPLITS = ("random", "case", "geometries", "cases+random", "cases+random-lenient")


def first_sweeps(df: pd.DataFrame, rows: np.ndarray, k: int | None) -> np.ndarray:
    """Of the row positions `rows` of `load_both()`'s `df`, the CASES rows and those of the
    first `k` random-geometry sweeps (`geometry_sweeps()` order); all of them for k None."""
    if k is None:
        return rows
    kept = {p.name for p in geometry_sweeps()[:k]}
    part = df.iloc[rows]
    return rows[((part["source"] == "cases") | part["sweep"].isin(kept)).to_numpy()]


def evaluate(split: str, seed: int, tuned: bool = True, train_sweeps: int | None = None,
             trees: int = FOREST_TREES, min_rows: int = MIN_IMPL_ROWS
             ) -> dict[str, dict[str, float]]:
    """Every method on one split (`split_rows`); `tuned=False` leaves out (3') and (4').
    `train_sweeps` = k trains on the random geometries of the first k sweeps only
    (`geometry_sweeps()` order), the test rows staying those of the split over all of them:
    what more geometries buy, on the same held-out geometries."""
    df = load() if split in ("random", "case") else load_both()
    tr, te = split_rows(df, split, seed)
    tr = first_sweeps(df, tr, train_sweeps)
    train, test = df.iloc[tr], df.iloc[te]
    folds = _folds(train, "random" if split == "random" else "case", seed)
    staged, sel_acc, impl = two_stage(train, test, folds, trees, min_rows)
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
    if tuned:
        xtr, xte = config_columns(train), config_columns(test)
        params = tune(xtr, ytr, folds)
        out[f"(3') GBDT, CV-tuned {params}"] = score(test, gbdt(xtr, ytr, xte, **params))
        extra = tiles.drop(columns=[c for c in tiles.columns if c in xtr.columns])
        xtr, xte = (pd.concat([xtr, extra.iloc[tr]], axis=1),
                    pd.concat([xte, extra.iloc[te]], axis=1))
        out["(4') GBDT + tile features, same settings"] = score(test,
                                                               gbdt(xtr, ytr, xte, **params))
    out["(5) implementation classifier + GBDT"] = score(test, staged) | {"selection_acc": sel_acc}
    return out


def spatial_columns(df: pd.DataFrame) -> pd.DataFrame:
    """config_columns plus the power-of-two divisibility of H*W, P*Q and N*P*Q: cuDNN routes
    a 1x1 conv whose spatial size is a multiple of 8 to cuBLASLt's nvjet kernels (8x8 in
    Inception-v3), and a 7x7 or 10x10 one to CUTLASS's wmma kernels."""
    return config_columns(df).assign(tz_hw=_trailing_zeros(df["H"] * df["W"]),
                                     tz_pq=_trailing_zeros(df["P"] * df["Q"]),
                                     tz_npq=_trailing_zeros(df["N"] * df["P"] * df["Q"]))


FRACTIONS = (0.0, 0.125, 0.25, 0.5, 1.0)


def study(split: str, seed: int) -> dict[str, float]:
    """Where the held-out-geometry error comes from, with the cheap l2 GBDT (3) only:
    (a) the training set's random geometries cut to FRACTIONS (the CASES rows always kept),
    (b) (3) given the true implementation (kernel sequence) or the true GEMM kernel as one
    more column (a selection oracle), (c) (3) on spatial_columns, l2 and l1."""
    df = load_both()
    tr, te = split_rows(df, split, seed)
    train, test = df.iloc[tr], df.iloc[te]
    y = test["latency_ms"].to_numpy()

    def acc(part: pd.DataFrame, cols, xtr=None, xte=None, **params) -> float:
        xtr = part[cols] if xtr is None else xtr
        xte = test[cols] if xte is None else xte
        p = gbdt(xtr, part["latency_ms"].to_numpy(), xte, **params)
        return metrics(y, p)["acc10"]

    out: dict[str, float] = {}
    geos = np.array(sorted(set(train.loc[train["source"] == "random", "case"])))
    np.random.default_rng(seed).shuffle(geos)
    for frac in FRACTIONS:
        keep = set(geos[:int(round(frac * len(geos)))])
        part = train[(train["source"] == "cases") | train["case"].isin(keep)]
        out[f"(3), {frac:g} of the random geometries ({len(keep)})"] = acc(part, BASE)
    for name, labels in (("implementation", implementation(df)),
                         ("GEMM kernel", gemm_kernel(df)["kernel"])):
        codes = pd.Categorical(labels).codes
        out[f"(3) + true {name}"] = acc(train, BASE, train[BASE].assign(impl=codes[tr]),
                                        test[BASE].assign(impl=codes[te]))
    out["test implementations seen in training"] = float(
        test["kernels"].isin(set(train["kernels"])).mean())
    for obj in ("l2", "l1"):
        out[f"(6) GBDT ({obj}) on config + spatial alignment columns"] = acc(
            train, None, spatial_columns(train), spatial_columns(test), objective=obj)
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
    b.add_argument("--dataset", type=Path, default=None, help=f"default {DATASET}")
    b.add_argument("--device-seconds", type=float, default=None)
    e = sub.add_parser("evaluate")
    e.add_argument("--split", choices=SPLITS, default="random")
    e.add_argument("--seed", type=int, nargs="+", default=[0],
                   help="one table per seed, then mean / spread of ±10%% over them")
    e.add_argument("--no-tuned", action="store_true", help="leave out (3') and (4')")
    e.add_argument("--json", type=Path, default=None, help="also write the figures here")
    e.add_argument("--train-sweeps", type=int, default=None, metavar="K",
                   help="train on the first K random-geometry sweeps only (same test rows)")
    e.add_argument("--forest-trees", type=int, default=FOREST_TREES)
    e.add_argument("--min-impl-rows", type=int, default=MIN_IMPL_ROWS,
                   help="implementations with fewer training rows pooled as one class")
    pl = sub.add_parser("plot")
    pl.add_argument("path", type=Path)
    pl.add_argument("--case", type=int, default=6)
    sub.add_parser("diagnose")
    st = sub.add_parser("study", help="held-out geometries: learning curve, selection "
                                      "oracle, alignment columns (GBDT only)")
    st.add_argument("--split", choices=SPLITS[2:], default="geometries")
    st.add_argument("--seed", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    st.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "study":
        runs = {}
        for seed in args.seed:
            runs[seed] = {k: {"acc10": v} for k, v in study(args.split, seed).items()}
            print(seed, {k: round(v["acc10"], 3) for k, v in runs[seed].items()}, flush=True)
            if args.json:
                args.json.write_text(json.dumps({"split": args.split, "runs": runs}, indent=1))
        print(summary(runs, args.split))
        return
    if args.cmd == "diagnose":
        diagnose()
        return
    if args.cmd == "plot":
        plot(args.path, args.case)
        return
    if args.cmd == "build":
        build(args.run1, args.run2, args.meta, args.dataset, args.device_seconds)
        return
    runs = {}
    for seed in args.seed:
        res = runs[seed] = evaluate(args.split, seed, tuned=not args.no_tuned,
                                        train_sweeps=args.train_sweeps,
                                        trees=args.forest_trees, min_rows=args.min_impl_rows)
        print(f"| method ({args.split} split, seed {seed}) | within ±10% | ±10%, reproducible "
              "rows | RMSE (ms) | MAPE | MdAPE | selection acc |\n|---|---|---|---|---|---|---|")
        for name, m in res.items():
            sel = f"{m['selection_acc']:.1%}" if "selection_acc" in m else ""
            print(f"| {name} | {m['acc10']:.1%} | {m['acc10_repro']:.1%} | {m['rmse_ms']:.4f} "
                  f"| {m['mape']:.1%} | {m['mdape']:.1%} | {sel} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"split": args.split, "runs": runs}, indent=1))
    if len(runs) > 1:
        print(summary(runs, args.split))


def _method(name: str) -> str:
    """A method's name without the settings CV picked or a count in parentheses at its end
    (they differ from seed to seed)."""
    return re.sub(r" \{.*\}| \(\d+\)$", "", name)


def summary(runs: dict[int, dict[str, dict[str, float]]], split: str) -> str:
    """Markdown table: ±10% mean, standard deviation and range over the seeds, per method."""
    acc: dict[str, list[float]] = {}
    sel: dict[str, list[float]] = {}
    for res in runs.values():
        for name, m in res.items():
            acc.setdefault(_method(name), []).append(m["acc10"])
            if "selection_acc" in m:
                sel.setdefault(_method(name), []).append(m["selection_acc"])
    lines = [f"| method ({split} split, seeds {', '.join(map(str, runs))}) | within ±10%, mean "
             "± sd | min-max | selection acc, mean |", "|---|---|---|---|"]
    for name, v in acc.items():
        a = np.asarray(v)
        s = f"{np.mean(sel[name]):.1%}" if name in sel else ""
        lines.append(f"| {name} | {a.mean():.1%} ± {a.std(ddof=1) if len(a) > 1 else 0:.1%} "
                     f"| {a.min():.1%}-{a.max():.1%} | {s} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
