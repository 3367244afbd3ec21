"""Dev script: turn power campaign output (scripts/power_campaign.py) into datasets.

    python scripts/power_assemble.py energy --out datasets/h100-cuda-energy-zoo --kind zoo RUN...
    python scripts/power_assemble.py energy --out datasets/h100-cuda-energy-synthetic \
        --kind synthetic RUN...
    python scripts/power_assemble.py kernels --out datasets/h100-cuda-kernel-counters RUN...

Each RUN is a device call's folder (energy.jsonl, kernel_power.jsonl, kernel_names.jsonl,
ncu_raw.csv.gz, ncu_nvtx.csv.gz, env_*.json).

Energy datasets: one model row per measured model and target. `latency_ms` is the replay
latency over the power window, `power_w` the average board power (NVML energy counter between
two of its edges), `idle_power_w` the idle power of the same call (the lower of the idle readings
at its start and end, at idle clocks), `energy_mj` the *dynamic* energy per inference (power - idle) x latency,
`energy_total_mj` power x latency, plus clocks, utilization and temperature at the window's
end. Noise: the retested models' energy_mj, first vs second measurement (manifest).

Kernel counters dataset: one kernel row per workload (a latpred kernel of a synthetic model run
alone, `copies` times per CUDA-graph replay): `latency_ms` its time per call in the replayed
graph, `power_w` / `power_dyn_w` / `energy_mj` as above, the kernel's features (`f_*`), and
beside the tables `counters.parquet`: the workload's Nsight Compute metrics (`--set full`),
summed over the CUDA kernels it launched for counts (`.sum`) and time-weighted over them for
everything else, keyed by (model_id, kernel_index); `counter_units.json` their units.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.dataset import Dataset  # noqa: E402
from latpred.profile.protocol import retest_mdape  # noqa: E402
from latpred.target import parse_target  # noqa: E402

STATE = ("sm_clock_mhz", "mem_clock_mhz", "util_gpu", "util_mem", "temp_c", "power_avg_w",
         "window_s", "replays")


def jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def idle_of(rows: list[dict]) -> float:
    """The call's idle power: its lowest idle reading (the GPU at idle clocks; a reading taken
    just after load finds the clocks still up and about 48 W more)."""
    vals = [r["idle_power_w"] for r in rows if r.get("kind") == "idle"]
    return min(vals) if vals else math.nan


def _p90(v):
    return round(statistics.quantiles(v, n=10)[-1], 3) if len(v) > 1 else None


def energy(a) -> None:
    rows, retests, envs, idles = [], [], {}, {}
    for run in map(Path, a.runs):
        rs = jsonl(run / "energy.jsonl")
        idles[run.name] = idle_of(rs)
        envs[run.name] = json.loads((run / "env_models.json").read_text())
        for r in rs:
            if r.get("kind") == "idle":
                continue
            r["source"], r["idle_power_w"] = run.name, idles[run.name]
            if ("zoo" if "zoo" in r["kind"] else "synthetic") != a.kind:
                continue
            (retests if r["kind"].startswith("retest") else rows).append(r)
    out = []
    for r in rows:
        ok = r.get("status") == "ok"
        p, idle, lat = r.get("power_w", math.nan), r["idle_power_w"], r.get("latency_ms")
        arch = r["arch"]
        out.append({"model_id": r["model_id"], "space": "zoo" if a.kind == "zoo" else
                    "synthetic_cnn", "seed": int(arch.get("seed", 0)),
                    "arch": json.dumps(arch, sort_keys=True, separators=(",", ":")),
                    "file_hash": "", "target": r["target"], "status": r.get("status"),
                    "error": r.get("error", ""), "latency_ms": lat if ok else math.nan,
                    "latency_iqr_ms": math.nan, "latency_min_ms": math.nan,
                    "n_runs": int(r.get("replays", 0)) if ok else 0,
                    "power_w": p if ok else math.nan, "idle_power_w": idle,
                    "power_dyn_w": p - idle if ok else math.nan,
                    "energy_mj": (p - idle) * lat if ok else math.nan,
                    "energy_total_mj": p * lat if ok else math.nan,
                    "replay_latency_ms": r.get("replay_latency_ms", math.nan),
                    **{k: float(r.get(k, math.nan)) for k in STATE}, "source": r["source"]})
    df = pd.DataFrame(out)
    ds = Dataset.create(Path(a.out), name=Path(a.out).name)
    ds.append_models(df)
    main = {(r["model_id"], r["target"]): r for r in out}
    summary = {}
    for target in sorted(df.target.unique()):
        pairs, ppairs = [], []
        for r in retests:
            m = main.get((r["model_id"], r["target"]))
            if r["target"] != target or m is None or r.get("status") != "ok" or \
                    m["status"] != "ok":
                continue
            e2 = (r["power_w"] - r["idle_power_w"]) * r["latency_ms"]
            pairs.append((m["energy_mj"], e2))
            ppairs.append((m["power_w"], r["power_w"]))
        pct = [abs(b / x - 1) * 100 for x, b in pairs]
        sub = df[df.target == target]
        env = envs[sub.source.iloc[0]]
        t = parse_target(target)
        noise = {"e2e_retest_mdape": round(retest_mdape(pairs), 3) if pairs else None,
                 "e2e_retest_p90": _p90(pct), "n_retest": len(pairs),
                 "kernel_retest_mdape": None, "kernel_retest_p90": None,
                 "label": "energy_mj (dynamic energy per inference)",
                 "power_retest_mdape": round(retest_mdape(ppairs), 3) if ppairs else None}
        ds.update_manifest(
            target, runtime=t.runtime, runtime_version=env["torch"],
            machine=f"device machine, {env.get('gpu')}, driver {env.get('driver')}",
            cpu_model="(host CPU not used for timing)", threads=1, precision=t.precision,
            batch=t.batch, date=env["date"], warmup=0, repeats=int(sub.n_runs.median()),
            protocol={"measure": "NVML total-energy counter between two of its edges under "
                                 "sustained CUDA-graph replay (latpred.profile.energy)",
                      "argv": env.get("argv")},
            idle_power_w={k: round(v, 2) for k, v in idles.items()},
            sm_clock_mhz_median=float(sub.sm_clock_mhz.median()),
            torch=env["torch"], cuda=env["cuda"], cudnn=env["cudnn"], gpu=env.get("gpu"),
            driver=env.get("driver"), device_calls=sorted(sub.source.unique()),
            counts={"models": len(sub), "models_ok": int((sub.status == "ok").sum())},
            noise=noise)
        summary[target] = {"models": len(sub), "noise": noise,
                           "power_w_range": [float(sub.power_w.min()), float(sub.power_w.max())]}
    ds.compact()
    print(json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("energy", "kernels"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", choices=("zoo", "synthetic"), default="zoo")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    if a.what == "energy":
        energy(a)
    else:
        from power_counters import kernels
        kernels(a)


if __name__ == "__main__":
    main()
