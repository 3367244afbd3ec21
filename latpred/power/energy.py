"""Energy per inference for a NAS loop, summed over kernels like latency.

The counters of a kernel are not known before it runs, so the NAS-time model learns *power*
directly from what is known: the kernel's architecture features (`latpred.features`, the same
columns the latency regressors see), its type, and its latency (predicted by the latency model
at prediction time, measured when training), through which achieved throughput
(FLOPs / s, bytes / s) enters. APGPM's counter model (`latpred.power.apgpm`) is the
explanation of that power, not an input.

    P_k  = KernelPowerModel(features_k, latency_k)          dynamic power (W) of kernel k
    E    = a * sum_k P_k * t_k + b * L                       dynamic energy per inference (mJ)

`t_k` are the kernel latencies (ms) and `L` the end-to-end latency (ms); `a` and `b` (W: the
dynamic power of the gaps between kernels) are fitted by non-negative least squares on measured
models (`calibrate`). The kernel power regressor is LightGBM, trained on the per-kernel power
dataset (`datasets/h100-cuda-kernel-counters`); saved as LightGBM's text model beside a JSON
file, so loading runs no code.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from latpred.errors import PredictorError

FORMAT_VERSION = 1
MANIFEST = "energy.json"
BOOSTER = "kernel_power.txt"
_THROUGHPUT = ("f_flops", "f_bytes_read", "f_bytes_written")


def design(kernels: pd.DataFrame, latency_ms, types: Sequence[str], columns: Sequence[str]) \
        -> np.ndarray:
    """The power regressor's inputs: log1p of the feature columns (0 where missing), one-hot
    kernel type, log latency, and log throughput of FLOPs and bytes over that latency."""
    lat = np.maximum(np.asarray(latency_ms, float), 1e-6)
    parts = []
    for c in columns:
        v = kernels[c].to_numpy(float) if c in kernels else np.zeros(len(kernels))
        parts.append(np.log1p(np.abs(np.nan_to_num(v))))
    for t in types:
        parts.append((kernels["kernel_type"].to_numpy() == t).astype(float))
    parts.append(np.log(lat))
    for c in _THROUGHPUT:
        v = kernels[c].to_numpy(float) if c in kernels else np.zeros(len(kernels))
        parts.append(np.log1p(np.nan_to_num(v) / lat))
    return np.column_stack(parts)


@dataclass
class KernelPowerModel:
    """Dynamic power (W) of one kernel run back to back, from features and latency."""

    columns: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    params: dict = field(default_factory=lambda: {
        "n_estimators": 400, "learning_rate": 0.03, "num_leaves": 15, "min_child_samples": 5,
        "subsample": 0.8, "subsample_freq": 1, "colsample_bytree": 0.8, "verbose": -1})
    booster: Any = None

    def fit(self, kernels: pd.DataFrame, power_w, latency_ms, seed: int = 0) \
            -> "KernelPowerModel":
        import lightgbm as lgb

        self.columns = sorted(c for c in kernels.columns if c.startswith("f_")
                              and kernels[c].notna().any())
        self.types = sorted(kernels["kernel_type"].unique())
        X = design(kernels, latency_ms, self.types, self.columns)
        reg = lgb.LGBMRegressor(random_state=seed, **self.params)
        reg.fit(X, np.log(np.maximum(np.asarray(power_w, float), 0.5)))
        self.booster = reg.booster_
        return self

    def predict(self, kernels: pd.DataFrame, latency_ms) -> np.ndarray:
        X = design(kernels, latency_ms, self.types, self.columns)
        return np.exp(self.booster.predict(X))


def calibrate(kernel_energy_mj, latency_ms, energy_mj) -> tuple[float, float]:
    """(a, b) >= 0 of E = a * sum P_k t_k + b * L by non-negative least squares (scipy),
    weighted so that each model's relative error counts alike."""
    from scipy.optimize import nnls

    s, lat, e = (np.asarray(v, float) for v in (kernel_energy_mj, latency_ms, energy_mj))
    w = 1.0 / np.maximum(e, 1e-9)
    coef, _ = nnls(np.column_stack([s * w, lat * w]), e * w)
    return float(coef[0]), float(coef[1])


@dataclass
class EnergyModel:
    """Kernel power regressor + calibration for one target (see the module docstring)."""

    target: str
    power: KernelPowerModel
    a: float = 1.0
    b: float = 0.0
    info: dict = field(default_factory=dict)

    def kernel_power(self, kernels: pd.DataFrame, latency_ms) -> np.ndarray:
        return self.power.predict(kernels, latency_ms)

    def energy_mj(self, kernels: pd.DataFrame, kernel_ms, total_ms: float) -> float:
        """Dynamic energy per inference (mJ) of one model from its kernels' rows."""
        p = self.kernel_power(kernels, kernel_ms)
        return self.a * float(np.sum(p * np.asarray(kernel_ms, float))) + self.b * total_ms

    def predict_graph(self, graph, prediction) -> dict:
        """Energy of `graph` from a latency Prediction (its kernels and per-kernel ms)."""
        from latpred.features import kernel_features
        from latpred.target import parse_target

        target = parse_target(self.target)
        rows = [{"kernel_type": k.type, **{f"f_{n}": (np.nan if v is None else float(v))
                                            for n, v in kernel_features(graph, k, target).items()}}
                for k in prediction.kernels]
        kt = pd.DataFrame(rows)
        ms = np.asarray(prediction.kernel_ms, float)
        p = self.kernel_power(kt, ms)
        e = self.a * float(np.sum(p * ms)) + self.b * float(prediction.total_ms)
        return {"energy_mj": e, "avg_power_w": e / prediction.total_ms
                if prediction.total_ms > 0 else math.nan, "kernel_power_w": p}

    # -- persistence -----------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        text = self.power.booster.model_to_string()
        (root / BOOSTER).write_text(text)
        manifest = {"format_version": FORMAT_VERSION, "target": self.target, "a": self.a,
                    "b": self.b, "columns": self.power.columns, "types": self.power.types,
                    "booster": BOOSTER,
                    "booster_sha256": hashlib.sha256(text.encode()).hexdigest(),
                    "info": self.info}
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
        return root

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "EnergyModel":
        import lightgbm as lgb

        root = Path(directory)
        try:
            m = json.loads((root / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PredictorError(f"{root} holds no readable energy model ({err}).") from err
        if m.get("format_version") != FORMAT_VERSION:
            raise PredictorError(f"{root / MANIFEST} has format version "
                                 f"{m.get('format_version')}, not {FORMAT_VERSION}.")
        text = (root / BOOSTER).read_text()
        if hashlib.sha256(text.encode()).hexdigest() != m["booster_sha256"]:
            raise PredictorError(f"{root / BOOSTER} does not match its checksum.")
        power = KernelPowerModel(columns=m["columns"], types=m["types"],
                                 booster=lgb.Booster(model_str=text))
        return cls(target=m["target"], power=power, a=m["a"], b=m["b"], info=m.get("info", {}))


def find(predictor_dir: str | os.PathLike) -> Path | None:
    """The energy model stored with a latency predictor (`<predictor>/energy/`), if any."""
    p = Path(predictor_dir) / "energy"
    return p if (p / MANIFEST).exists() else None


def print_energy(paths: Sequence[str], graphs: Sequence[Any], preds: Sequence[Any],
                 model: EnergyModel) -> None:
    """A table of predicted energy per inference beside the predicted latency."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"predicted energy per inference ({model.target}, dynamic: above idle)")
    for col in ("model", "latency ms", "energy mJ", "avg power W"):
        table.add_column(col, justify="left" if col == "model" else "right", overflow="fold")
    for path, g, p in zip(paths, graphs, preds):
        e = model.predict_graph(g, p)
        table.add_row(str(path), f"{p.total_ms:.3f}", f"{e['energy_mj']:.3f}",
                      f"{e['avg_power_w']:.1f}")
    Console().print(table)
