"""Merge measured datasets into one (different models, e.g. several NAS spaces), or combine
campaigns of the same models into steadier labels (`combine_campaigns`).

Rows are copied as they are (model ids must not collide: two spaces' ids never do, the same
models measured twice would); each target's manifest entry is the first source's, with the
sources' names and their own noise figures kept under `merged_from`, so no label noise is lost.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np
import pandas as pd

from latpred.dataset import Dataset
from latpred.errors import DatasetError


def merge_datasets(sources: Sequence[str | os.PathLike], out: str | os.PathLike,
                   name: str | None = None) -> Dataset:
    """A new dataset at `out` holding every row of `sources`."""
    if len(sources) < 2:
        raise DatasetError("Merging needs at least two datasets.")
    opened = [Dataset.open(s) for s in sources]
    models = [ds.models() for ds in opened]
    seen: dict[tuple[str, str], str] = {}
    for ds, m in zip(opened, models):
        for key in zip(m["model_id"], m["target"]):
            if key in seen:
                raise DatasetError(f"Model {key[0]!r} ({key[1]}) is in both {seen[key]} and "
                                   f"{ds.root}; merge datasets of different models.")
            seen[key] = str(ds.root)
    merged = Dataset.create(out, name or "+".join(ds.manifest["name"] for ds in opened))
    merged.append_models(pd.concat(models, ignore_index=True))
    kernels = [ds.kernels() for ds in opened]
    if any(len(k) for k in kernels):
        merged.append_kernels(pd.concat(kernels, ignore_index=True))
    for ds in reversed(opened):   # the first source's entry wins
        for target, entry in ds.manifest["targets"].items():
            merged.update_manifest(target, **{k: v for k, v in entry.items() if k != "noise"})
    for target in merged.targets():
        parts = [{"name": ds.manifest["name"], "noise": ds.manifest["targets"][target].get("noise")}
                 for ds in opened if target in ds.manifest["targets"]]
        first = next((p["noise"] for p in parts if p["noise"]), None)
        merged.update_manifest(target, merged_from=parts, **({"noise": first} if first else {}))
    merged.compact()
    return merged


# -- combining campaigns of the same models ----------------------------------------------------
def combine_campaigns(sources: Sequence[str | os.PathLike], out: str | os.PathLike,
                      name: str | None = None) -> dict[str, dict]:
    """A new dataset at `out` whose labels are the median, per model and per kernel, over
    `sources`: campaigns that measured the same models (at different times) on one target.

    On a shared VM one campaign's labels move by 3-6% against another's even after drift
    correction (docs/measurement.md), more than within a campaign; the median of several is
    steadier. Bring the campaigns to one scale first (`latpred dataset drift-correct
    --reference-ms`, the same value for each). Rows come from the first source, with the
    per-source labels kept in `campaign_labels_ms` (a JSON list) and the count in
    `n_campaigns`; a model (or kernel) at least two campaigns measured is kept. A kernel is
    combined only where the sources agree on its kernel type. A source that is itself a
    combination counts as the campaigns it kept, so a new campaign can join an old median.

    Each target's noise is a split-half retest: the median over the even-numbered sources
    against the median over the odd-numbered ones (end to end and per kernel), a conservative
    figure for the whole median, which combines twice as many campaigns as each half.
    Returns that noise per target.
    """
    if len(sources) < 2:
        raise DatasetError("Combining needs at least two campaigns of the same models.")
    opened = [Dataset.open(s) for s in sources]
    _same_cpu(opened)
    key = ["model_id", "target"]
    models = [ds.models().query("status == 'ok'") for ds in opened]
    labels = _shared(_side_by_side(models, key))
    kernels = [ds.kernels().query("status == 'ok'") for ds in opened]
    klabels = _shared(_side_by_side(kernels, key + ["kernel_index", "kernel_type"]))
    if labels.empty:
        raise DatasetError("The campaigns share no measured model; combine campaigns of the "
                           "same models and target.")
    combined = Dataset.create(out, name or f"{opened[0].manifest['name']}-combined")
    combined.append_models(_with_median(opened[0].models(), labels, key))
    if len(klabels):
        combined.append_kernels(_with_median(opened[0].kernels(), klabels,
                                             key + ["kernel_index", "kernel_type"]))
    n = len(_campaign_cols(labels))
    noise = {}
    for target in sorted(labels["target"].unique()):
        entry = dict(opened[0].manifest["targets"].get(target, {}))
        # The first campaign's drift series does not describe a median of several campaigns:
        # each campaign's own range (and correction) is kept in `combined_from` instead.
        entry.pop("drift", None)
        entry.pop("drift_corrected", None)
        noise[target] = _split_half_noise(labels[labels["target"] == target],
                                          klabels[klabels["target"] == target], n)
        entry.update(noise=noise[target],
                     combined_from=[c for ds in opened for c in _campaigns_of(ds, target)])
        combined.update_manifest(target, **entry)
    combined.compact()
    return noise


def _same_cpu(opened: list[Dataset]) -> None:
    """Refuse campaigns whose manifests name different CPUs (`cpu_id`, recorded since session
    10): two VMs both called "AMD EPYC" ran the same models 30% apart, which is another device,
    not a retest. Campaigns that do not record it are taken as they are."""
    seen: dict[str, str] = {}
    for ds in opened:
        for entry in ds.manifest["targets"].values():
            if entry.get("cpu_id"):
                seen.setdefault(entry["cpu_id"], str(ds.root))
    if len(seen) > 1:
        (a, pa), (b, pb) = list(seen.items())[:2]
        raise DatasetError(f"{pa} was measured on {a} and {pb} on {b}: campaigns of different "
                           "CPUs are different devices; keep them as separate datasets.")


def _campaigns_of(ds: Dataset, target: str) -> list[dict]:
    """The manifest's record of the campaigns `ds` holds: itself, or those it combined."""
    entry = ds.manifest["targets"].get(target, {})
    return entry.get("combined_from") or [
        {"name": ds.manifest["name"], "path": str(ds.root), "noise": entry.get("noise"),
         "drift_range_pct": entry.get("drift", {}).get("range_pct"),
         "drift_corrected": entry.get("drift_corrected")}]


def _campaign_labels(table: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """`key` and one latency column per campaign `table` holds: its label, or, where it is a
    combination, each campaign's label it kept (`campaign_labels_ms`; its median is not one)."""
    t = table.drop_duplicates(key)
    if "campaign_labels_ms" not in t.columns:
        return t[key + ["latency_ms"]]
    lists = [json.loads(s) for s in t["campaign_labels_ms"]]
    width = max(map(len, lists), default=0)
    values = [[np.nan if v is None else v for v in r] + [np.nan] * (width - len(r)) for r in lists]
    return pd.concat([t[key].reset_index(drop=True),
                      pd.DataFrame(np.array(values, float).reshape(len(t), width))], axis=1)


def _side_by_side(tables: list[pd.DataFrame], key: list[str]) -> pd.DataFrame:
    """One row per key, the latency of each campaign as column c0, c1, ... (NaN where absent)."""
    out, n = None, 0
    for t in tables:
        part = _campaign_labels(t, key)
        cols = [c for c in part.columns if c not in key]
        part = part.rename(columns={c: f"c{n + j}" for j, c in enumerate(cols)})
        n += len(cols)
        out = part if out is None else out.merge(part, on=key, how="outer")
    return out


def _campaign_cols(labels: pd.DataFrame) -> list[str]:
    return [c for c in labels.columns if c.startswith("c") and c[1:].isdigit()]


def _shared(labels: pd.DataFrame) -> pd.DataFrame:
    """The rows at least two campaigns measured (one campaign alone is no combination)."""
    return labels[labels[_campaign_cols(labels)].notna().sum(axis=1) >= 2]


def _with_median(rows: pd.DataFrame, labels: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    values = labels[_campaign_cols(labels)].to_numpy(float)
    labels = labels[key].assign(
        median_ms=np.nanmedian(values, axis=1), n_campaigns=np.isfinite(values).sum(axis=1),
        campaign_labels_ms=[json.dumps([None if np.isnan(v) else round(float(v), 6) for v in r])
                            for r in values])
    rows = rows.drop(columns=["campaign_labels_ms", "n_campaigns"], errors="ignore")
    rows = rows.merge(labels, on=key, how="inner")
    return rows.assign(latency_ms=rows.pop("median_ms"))


def _split_half_noise(labels: pd.DataFrame, klabels: pd.DataFrame, n: int) -> dict:
    def halves(table: pd.DataFrame) -> np.ndarray:
        even = table[[f"c{i}" for i in range(0, n, 2)]].median(axis=1, skipna=False)
        odd = table[[f"c{i}" for i in range(1, n, 2)]].median(axis=1, skipna=False)
        ok = np.isfinite(even) & np.isfinite(odd) & (even + odd > 0)  # 0 ms: below the clock
        a, b = even[ok].to_numpy(), odd[ok].to_numpy()
        return 100 * np.abs(a - b) / ((a + b) / 2)

    e2e, kern = halves(labels), halves(klabels) if len(klabels) else np.array([])

    def stat(x: np.ndarray, q: float) -> float | None:
        return round(float(np.quantile(x, q)), 3) if len(x) else None
    return {"e2e_retest_mdape": stat(e2e, 0.5), "e2e_retest_p90": stat(e2e, 0.9),
            "kernel_retest_mdape": stat(kern, 0.5), "kernel_retest_p90": stat(kern, 0.9),
            "n_retest": int(len(e2e)), "n_kernel_retest": int(len(kern)),
            "retest": "split_half_campaigns", "campaigns": n}
