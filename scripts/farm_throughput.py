"""Throughput of `latpred profile --ray` with 1 and 2 devices on this machine, beside the
single-machine profiler, and each campaign's retest MdAPE (developer tool, not a test).

Usage: .venv/bin/python scripts/farm_throughput.py MODELS_DIR OUT_DIR [RETEST_FRACTION [ORDER]]
(ORDER: the campaigns in the order run, default single,farm1,farm2.)
Each device is one core (`latpred-cpu-<c>`) of a local Ray instance; run it on an idle machine
(a timing campaign: nothing else running). Writes OUT_DIR/summary.json beside the datasets.
"""

import json
import sys
import time
from pathlib import Path

import ray

from latpred.dataset import Dataset
from latpred.profile.farm import FarmOptions, device_resources, profile_on_ray
from latpred.profile.runner import RunOptions, model_paths, profile_models
from latpred.target import parse_target

TARGET = "host/cpu/fp32/t1"


def main(models_dir: str, out_dir: str, retest: str = "0.25",
         order: str = "single,farm1,farm2") -> None:
    paths = model_paths([models_dir])
    out = Path(out_dir)
    target = parse_target(TARGET)
    run = RunOptions(retest_fraction=float(retest))
    rows = []
    for campaign in order.split(","):
        t0 = time.perf_counter()
        if campaign == "single":
            r = profile_models(paths, target, out / "single", options=run, progress=False)
            rows.append(("latpred profile (one machine)", time.perf_counter() - t0,
                         out / "single", r))
            continue
        cores = [1] if campaign == "farm1" else [0, 1]
        ray.init(resources=device_resources(cores), include_dashboard=False, log_to_driver=False)
        t0 = time.perf_counter()
        r = profile_on_ray(paths, target, out / campaign, options=FarmOptions(run=run),
                           progress=False)
        rows.append((f"--ray, {len(cores)} device(s)", time.perf_counter() - t0, out / campaign, r))
        ray.shutdown()
    summary = []
    for name, wall, ds, r in rows:
        noise = Dataset.open(ds).manifest["targets"][TARGET]["noise"]
        print(f"{name:32s} {len(paths)} models in {wall:6.1f} s = {len(paths) / wall * 60:5.1f} "
              f"models/min; e2e retest MdAPE {noise['e2e_retest_mdape']}% "
              f"({noise.get('retest', 'start_vs_end')}, n={noise['n_retest']})")
        summary.append({"campaign": name, "dataset": ds.name, "models": len(paths),
                        "wall_s": round(wall, 1),
                        "models_per_min": round(len(paths) / wall * 60, 1), "noise": noise})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
