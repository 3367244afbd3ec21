"""Dev helper of scripts/power_assemble.py: the per-kernel power + Nsight Compute dataset.

ncu's raw CSV page (one row per profiled CUDA kernel, a units row under the header) is tied to
the workloads by the NVTX push/pop range ncu recorded around each kernel (`w<workload>`), or
by the NVTX-renamed copy (`--print-nvtx-rename kernel`: the kernel name
is the enclosing range `w<workload>`) or, failing that, in order: each chunk starts at its
first workload, and each workload launched the CUDA kernels torch.profiler recorded for it
(`kernel_names.jsonl`), whose names must agree with ncu's.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from power_assemble import idle_of, jsonl  # noqa: E402

from latpred import sampler  # noqa: E402
from latpred.dataset import Dataset  # noqa: E402
from latpred.deduce import deduce  # noqa: E402
from latpred.features import kernel_features  # noqa: E402
from latpred.profile.protocol import retest_mdape  # noqa: E402
from latpred.target import parse_target  # noqa: E402

TARGET = "h100/cuda/fp16"
SPACE = Path(__file__).resolve().parent.parent / "search_space" / "synthetic_cnn.yaml"
DURATION = "gpu__time_duration.sum"


def _chunks(path: Path) -> list[tuple[int, pd.DataFrame, dict]]:
    """[(first workload, table, units)] of a gzipped file of '# chunk' sections."""
    if not path.exists():
        return []
    text = gzip.open(path, "rt").read()
    out = []
    for part in re.split(r"^# chunk ", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        start = int(head.split()[0])
        lines = [x for x in body.splitlines() if x.startswith('"')]   # drop ncu's ==PROF== lines
        df = pd.read_csv(io.StringIO("\n".join(lines)), dtype=str, keep_default_na=False)
        units = df.iloc[0].to_dict() if len(df) and df.iloc[0].get("ID", "") == "" else {}
        df = df.iloc[1:] if units else df
        out.append((start, df.reset_index(drop=True), units))
    return out


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s.str.replace(",", "", regex=False), errors="coerce")


def _assign(raw, nvtx, names: dict[int, list[str]]) -> list[int | None]:
    """Workload of each raw row (see the module docstring)."""
    out: list[int | None] = []
    for k, (start, df, _) in enumerate(raw):
        got = None
        ranges = [c for c in df.columns if c.startswith("thread Domain:Push/Pop_Range")]
        if ranges:                            # ncu --nvtx: the enclosing push/pop range
            m = [re.search(r":w(\d+):", n) for n in df[ranges[0]]]
            if all(m):
                got = [int(x.group(1)) for x in m]
        if got is None and k < len(nvtx) and len(nvtx[k][1]) == len(df):
            m = [re.search(r"\bw(\d+)\b", n) for n in nvtx[k][1]["Kernel Name"]]
            if all(m):
                got = [int(x.group(1)) for x in m]
        if got is None:                       # in order, checked against the profiler names
            got, w, j = [], start, 0
            for name in df["Kernel Name"]:
                while w in names and j >= len(names[w]):
                    w, j = w + 1, 0
                expect = names.get(w, [""])[j] if j < len(names.get(w, [])) else ""
                short = lambda s: re.sub(r"^void ", "", s)[:25]  # noqa: E731
                got.append(w if short(expect) == short(name) else None)
                j += 1
        out += got
    return out


# Metrics that count events over the workload, so that their rate is count / time: every
# `.sum`, and the per-unit `.avg` / `.max` / `.min` (or bare-named) metrics in a count unit or
# none;
# launch configuration, device attributes, ratios (`.ratio`, `.per_cycle_active`, ...) and
# sampler settings are not counts.
COUNT_UNITS = frozenset({"inst", "cycle", "sector", "sectors", "warp", "thread", "block",
                         "request", "branches", "byte", "Kbyte", "Mbyte", "Gbyte", "Tbyte",
                         "sample"})
_NOT_COUNTS = ("launch__", "device__", "profiler__", "derived__", "smsp__pcsamp_interval",
               "smsp__pcsamp_buffer", "smsp__pcsamp_dropped", "sm__maximum_", "smsp__maximum_")


def is_count(name: str, units: dict) -> bool:
    """A metric that counts events over the workload (its rate is count / time)."""
    if name.endswith(".sum"):
        return True
    if name == "smsp__pcsamp_sample_count":      # PC samples: one per interval of run time
        return True
    unit = units.get(name, "")
    if name.startswith(_NOT_COUNTS) or (unit and unit not in COUNT_UNITS):
        return False
    last = name.rsplit(".", 1)[-1] if "." in name else ""
    # a unitless metric is a count only as a per-unit .avg / .max / .min (e.g. wavefronts)
    return last in ("avg", "max", "min") or (last == "" and unit != "")


def counters(run: Path, sum_counts: bool = False) -> tuple[pd.DataFrame, dict]:
    """Per-workload counters of one device call (module docstring) and their units.

    `.sum` metrics are summed over the workload's CUDA kernels and everything else is weighted
    by kernel time (the shipped dataset); with `sum_counts`, every count (`is_count`) is summed
    too: a time-weighted mean of counts is not a count (three equal kernels give a third)."""
    raw, nvtx = _chunks(run / "ncu_raw.csv.gz"), _chunks(run / "ncu_nvtx.csv.gz")
    if not raw:
        return pd.DataFrame(), {}
    names = {r["workload"]: [n for cat, n, _ in r["kernels"] if cat == "kernel"]
             for r in jsonl(run / "kernel_names.jsonl")}
    for r in jsonl(run / "kernel_names_ncu.jsonl"):
        names.setdefault(r["workload"], [n for cat, n, _ in r["kernels"] if cat == "kernel"])
    table = pd.concat([df for _, df, _ in raw], ignore_index=True)
    units = {k: v for _, _, u in raw for k, v in u.items()}
    table["workload"] = _assign(raw, nvtx, names)
    meta = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC", "workload"}
    metrics = [c for c in table.columns if c not in meta and "Range:" not in c]
    num = pd.DataFrame({c: _num(table[c]) for c in metrics})
    num = num.loc[:, num.notna().any()]
    num["workload"] = table["workload"]
    num["n_cuda_kernels"] = 1
    num = num[num.workload.notna()]
    rows = []
    for w, g in num.groupby("workload"):
        dur = g[DURATION].fillna(0).to_numpy() if DURATION in g else np.ones(len(g))
        wt = dur / dur.sum() if dur.sum() > 0 else np.full(len(g), 1 / len(g))
        row = {"workload": int(w), "n_cuda_kernels": len(g)}
        for c in g.columns:
            if c in ("workload", "n_cuda_kernels"):
                continue
            v = g[c].to_numpy(float)
            if np.isnan(v).all():
                continue
            summed = is_count(c, units) if sum_counts else c.endswith(".sum")
            row[c] = float(np.nansum(v)) if summed else \
                float(np.nansum(np.nan_to_num(v) * wt))
        rows.append(row)
    return pd.DataFrame(rows), units


def kernels(a) -> None:
    target = parse_target(TARGET)
    space = sampler.load_space(SPACE)
    power, retest, cnt, units, srcs = {}, {}, [], {}, []
    repeat = []       # the same workload measured as "kernel" by two calls (the later wins)
    for run in map(Path, a.runs):
        rs = jsonl(run / "kernel_power.jsonl")
        idle = idle_of(rs)
        for r in rs:
            if r.get("kind") == "idle" or r.get("status") != "ok":
                continue
            r["idle_power_w"], r["source"] = idle, run.name
            if r["kind"] == "retest":
                retest[r["workload"]] = r
            else:
                if r["workload"] in power:
                    repeat.append((power[r["workload"]], r))
                power[r["workload"]] = r
        c, u = counters(run)
        if len(c):
            c["source"] = run.name
            cnt.append(c)
            units.update(u)
        srcs.append(run.name)
    # Calls differ by a constant in active power (GPU temperature: see docs/energy.md); the
    # retests of the first call's workloads in a later call measure it. `power_aligned_dyn_w`
    # puts every call on the first call's scale: power - offset(call) - idle(first call).
    ref = Path(a.runs[0]).name
    ref_idle = next(r["idle_power_w"] for r in power.values() if r["source"] == ref)
    offsets = {ref: 0.0}
    for src in {r["source"] for r in retest.values()}:
        d = [r["power_w"] - power[w]["power_w"] for w, r in retest.items()
             if r["source"] == src and w in power and power[w]["source"] == ref]
        if d:
            offsets[src] = float(np.median(d))
    graphs, rows = {}, []
    for w, r in sorted(power.items()):
        key = (r["seed"], r["index"])
        g = graphs.get(key) or graphs.setdefault(
            key, sampler.build_graph(sampler.sample_one(space, r["seed"], r["index"])))
        kernel = deduce(g, target)[r["kernel_index"]]
        feats = kernel_features(g, kernel, target)
        rows.append({"model_id": r["model_id"], "target": TARGET,
                     "kernel_index": r["kernel_index"], "kernel_type": kernel.type,
                     "ops": "+".join(g.ops[i].type for i in kernel.ops),
                     "config_hash": r["config_hash"], "status": "ok", "error": "",
                     "latency_ms": r["kernel_ms"], "latency_iqr_ms": math.nan,
                     "latency_min_ms": math.nan, "n_runs": int(r["replays"] * r["copies"]),
                     "workload": w, "copies": r["copies"], "power_w": r["power_w"],
                     "idle_power_w": r["idle_power_w"],
                     "power_dyn_w": r["power_w"] - r["idle_power_w"],
                     "power_aligned_dyn_w": (r["power_w"] - offsets.get(r["source"], math.nan)
                                             - ref_idle),
                     "energy_mj": (r["power_w"] - r["idle_power_w"]) * r["kernel_ms"],
                     **{k: float(r.get(k, math.nan)) for k in
                        ("sm_clock_mhz", "mem_clock_mhz", "util_gpu", "temp_c", "window_s")},
                     "source": r["source"],
                     **{f"f_{n}": (float(v) if v is not None else math.nan)
                        for n, v in feats.items()}})
    df = pd.DataFrame(rows)
    out = Path(a.out)
    ds = Dataset.create(out, name=out.name)
    ds.append_kernels(df)
    c = pd.concat(cnt, ignore_index=True) if cnt else pd.DataFrame({"workload": []})
    c = c.drop_duplicates("workload", keep="last")
    keyed = df[["workload", "model_id", "kernel_index"]].merge(c, on="workload", how="inner")
    keyed.to_parquet(out / "counters.parquet", index=False)
    (out / "counter_units.json").write_text(json.dumps(units, indent=0, sort_keys=True))
    pairs = [(power[w]["power_w"] - power[w]["idle_power_w"],
              r["power_w"] - r["idle_power_w"]) for w, r in retest.items() if w in power]
    pct = [abs(b / x - 1) * 100 for x, b in pairs]
    same = [(x["power_w"] - x["idle_power_w"], y["power_w"] - y["idle_power_w"])
            for x, y in repeat]
    aligned = [(power[w]["power_w"] - ref_idle,
                r["power_w"] - offsets.get(r["source"], math.nan) - ref_idle)
               for w, r in retest.items() if w in power]
    n_metrics = len([x for x in keyed.columns if x not in ("workload", "model_id",
                                                          "kernel_index", "source",
                                                          "n_cuda_kernels")])
    env = json.loads((Path(a.runs[0]) / "env_kernels.json").read_text())
    noise = {"e2e_retest_mdape": None, "e2e_retest_p90": None, "n_retest": len(pairs),
             "kernel_retest_mdape": round(retest_mdape(pairs), 3) if pairs else None,
             "kernel_retest_p90": (round(statistics.quantiles(pct, n=10)[-1], 3)
                                   if len(pct) > 1 else None),
             "label": "power_dyn_w of the kernel run alone (retest on another call)",
             "retest_source": sorted({r["source"] for r in retest.values()}),
             "aligned_retest_mdape": (round(retest_mdape(aligned), 3) if aligned else None),
             "call_offsets_w": {k: round(v, 2) for k, v in offsets.items()},
             "same_state_retest_mdape": round(retest_mdape(same), 3) if same else None,
             "n_same_state": len(same)}
    ds.update_manifest(
        TARGET, runtime=target.runtime, runtime_version=env["torch"],
        machine=f"device machine, {env.get('gpu')}, driver {env.get('driver')}",
        cpu_model="(host CPU not used for timing)", threads=1, precision=target.precision,
        batch=1, date=env["date"], warmup=0, repeats=int(df.n_runs.median()),
        kernel_timing="isolated_replay",
        kernel_timing_note=("each workload is one latpred kernel's ops cut out of its model, "
                            "captured `copies` times in one CUDA graph and replayed back to "
                            "back; latency_ms = replay time / copies"),
        counters={"tool": "Nsight Compute --set full", "metrics": n_metrics,
                  "workloads_with_counters": int(len(keyed))},
        device_calls=srcs, counts={"kernels": len(df)}, noise=noise)
    ds.compact()
    print(json.dumps({"kernels": len(df), "with_counters": len(keyed), "metrics": n_metrics,
                      "noise": noise}, indent=1))
