"""Does a model's GPU latency depend on how long the GPU was busy before it is timed?

Run on the device machine (`. scripts/device_gpu.sh` first). Loads a few models of a campaign
plan in one process, then times each after an idle gap with several sustained warm-up
durations (`GpuProtocol.warmup_s`), in rounds so that every setting sees the same conditions,
and reads the SM clock (NVML, when importable) right after each timing.

  python3 scripts/gpu_clock_probe.py --plan .gpu_campaign/plan.json --models 0 5 7 12 \
      --plan .gpu_zoo/plan.json --models mobilenet_v2_1.3 regnet_x_400mf --out $OUT/probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_campaign import model_bytes  # noqa: E402

from latpred.profile import litert_gpu as lg  # noqa: E402


def _sm_clock():
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # noqa: BLE001 - no NVML: the clock column stays empty
        return lambda: None


def _chosen(plan_path: str, wanted: list[str]) -> list[tuple[str, dict]]:
    models = json.loads(Path(plan_path).read_text())["models"]
    by_key = {m["model_id"]: m for m in models} | {str(m["index"]): m for m in models}
    return [(by_key[w]["model_id"], by_key[w]["arch"]) for w in wanted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True)
    ap.add_argument("--models", nargs="+", action="append", required=True)
    ap.add_argument("--warmup-s", type=float, nargs="+", default=[0.0, 0.25, 1.0, 2.0])
    ap.add_argument("--idle-s", type=float, default=0.5, help="idle gap before each timing")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    chosen = [c for plan, wanted in zip(args.plan, args.models) for c in _chosen(plan, wanted)]
    env = lg.new_environment()
    loaded = [lg.load(mid, model_bytes(arch), environment=env) for mid, arch in chosen]
    clock = _sm_clock()
    rows = []
    for rnd in range(args.rounds):
        for warm in args.warmup_s:
            protocol = lg.GpuProtocol(warmup_s=warm)
            for model in loaded:
                time.sleep(args.idle_s)
                est = lg.estimate(lg.time_models([model], protocol)[0], protocol)
                rows.append({"model": model.key, "round": rnd, "warmup_s": warm,
                             "latency_ms": est.latency_ms, "pass_means_ms": est.pass_means_ms,
                             "sm_clock_mhz": clock()})
                print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    for model in loaded:
        by_warm = {w: [r["latency_ms"] for r in rows if r["model"] == model.key
                       and r["warmup_s"] == w] for w in args.warmup_s}
        print(model.key, {w: np.round(v, 3).tolist() for w, v in by_warm.items()})


if __name__ == "__main__":
    main()
