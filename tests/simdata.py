"""A simulated measured dataset: real sampled graphs, real deduction and features, latencies
from a known cost model, written through latpred.dataset. Lets the predictor and evaluation
tests (and the speed benchmark) run the whole flow before measured datasets exist."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from latpred.dataset import Dataset
from latpred.deduce import deduce
from latpred.errors import DelegateRefusedError
from latpred.features import kernel_features
from latpred.sampler import build_graph, sample
from latpred.target import parse_target

SPACE = Path(__file__).resolve().parents[1] / "search_space" / "synthetic_cnn.yaml"

# Seconds per FLOP and per byte moved, per kernel type (a roofline-like cost model with a
# type-specific launch cost); anything else uses "other".
_COST = {"conv2d": (4e-12, 2e-11, 3e-3), "grouped_conv2d": (8e-12, 2e-11, 4e-3),
         "dwconv2d": (2e-11, 3e-11, 2e-3), "fc": (5e-12, 2e-11, 2e-3),
         "winograd_input_transform": (3e-12, 2e-11, 2e-3),
         "winograd_matmul": (2e-12, 1e-11, 2e-3), "winograd_output_transform": (3e-12, 2e-11, 2e-3),
         "other": (1e-11, 3e-11, 1e-3)}


def kernel_ms(ktype: str, f: dict) -> float:
    per_flop, per_byte, launch = _COST.get(ktype, _COST["other"])
    # A mild nonlinearity (efficiency drops for thin channels) that linear models cannot fit.
    thin = 1.0 + 2.0 / np.sqrt(max(f.get("input_c", 1.0), 1.0))
    return 1e3 * (per_flop * f["flops"] * thin + per_byte * (f["bytes_read"] + f["bytes_written"])
                  ) + launch


def simulate(root: str | Path, target: str = "host/cpu/fp32/t1", n_models: int = 60,
             seed: int = 0, noise: float = 0.01,
             type_scale: dict[str, float] | None = None) -> Dataset:
    """Write a dataset of `n_models` synthetic_cnn models measured on `target` by the cost model;
    `type_scale` multiplies some kernel types' latencies (another device, for few-shot tests)."""
    type_scale = type_scale or {}
    rng = np.random.default_rng(seed)
    t = parse_target(target)
    ds = Dataset.create(root, "simulated")
    models, kernels = [], []
    for arch in sample(SPACE, n_models, seed):
        g = build_graph(arch)
        total = 0.0
        try:
            ks = deduce(g, t)
        except DelegateRefusedError:
            continue    # the runtime would not run it (a GPU target): never measured

        for i, k in enumerate(ks):
            f = kernel_features(g, k, t)
            ms = kernel_ms(k.type, f) * type_scale.get(k.type, 1.0) * rng.lognormal(0, noise)
            total += ms
            kernels.append({"model_id": g.name, "target": target, "kernel_index": i,
                            "kernel_type": k.type,
                            "ops": "+".join(g.ops[o].type for o in k.ops),
                            "config_hash": f"{g.name}-{i}", "status": "ok", "latency_ms": ms,
                            "latency_iqr_ms": 0.0, "latency_min_ms": ms, "n_runs": 5,
                            **{f"f_{name}": float(v) for name, v in f.items()}})
        e2e = (total + 0.05 + 0.002 * len(ks)) * rng.lognormal(0, noise)
        models.append({"model_id": g.name, "space": arch["space"], "seed": seed,
                       "arch": json.dumps(arch), "file_hash": "", "target": target,
                       "status": "ok", "error": "", "latency_ms": e2e, "latency_iqr_ms": 0.0,
                       "latency_min_ms": e2e, "n_runs": 5})
    ds.append_kernels(pd.DataFrame(kernels))
    ds.append_models(pd.DataFrame(models))
    ds.update_manifest(target, runtime=t.runtime, runtime_version=t.runtime_version,
                       machine="simulated", threads=t.threads, precision=t.precision,
                       noise={"e2e_retest_mdape": 100 * noise,  # stored in percent
                              "kernel_retest_mdape": 100 * noise,
                              "n_retest": 0})
    return ds


def with_residual_stage(model, seed: int = 1):
    """`model` (a LatencyModel) with an end-to-end residual stage that reads every one of its
    kernel types, fitted on made-up models: for tests of the paths that carry the stage."""
    from dataclasses import replace

    from latpred.predictors.residual import ResidualStage

    rng = np.random.default_rng(seed)
    types = sorted(model.types)
    counts = rng.integers(0, 10, (300, len(types))).astype(float)
    sums = counts * rng.uniform(0.01, 0.1, counts.shape)
    residual = np.sin(sums.sum(axis=1) * 3) * 0.05
    stage = ResidualStage.fit(counts, sums, residual, np.full(300, 1.0), types)
    return replace(model, residual=stage)
