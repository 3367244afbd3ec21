"""Accuracy figures, from scikit-learn and scipy: MAPE, +-10% accuracy, RMSE, Kendall's tau."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau
from sklearn.metrics import mean_absolute_percentage_error, root_mean_squared_error


# Size classes of the converter-corpus targets (issue 11): a predictor must not be biased for
# small models, whose fixed per-call costs weigh most.
SIZE_CLASSES = (("under 3 ms", 0.0, 3.0), ("3-10 ms", 3.0, 10.0), ("over 10 ms", 10.0, np.inf))


def e2e_metrics(measured: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """End-to-end figures over models: MAPE, acc10 and the mean signed error (MPE, positive:
    predicted too slow) as fractions, RMSE in ms, tau, n, and MAPE/MPE per size class."""
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if len(y) == 0:
        return {"n": 0, "mape": float("nan"), "acc10": float("nan"), "mpe": float("nan"),
                "rmse_ms": float("nan"), "kendall_tau": float("nan"), "size_classes": {}}
    tau = kendalltau(y, p).statistic if len(y) > 1 else float("nan")
    return {"n": int(len(y)), "mape": float(mean_absolute_percentage_error(y, p)),
            # within ±10%, the boundary included (with room for the rounding of p - y)
            "acc10": float(np.mean(np.abs(p - y) / y <= 0.10 + 1e-12)),
            "mpe": float(np.mean((p - y) / y)),
            "rmse_ms": float(root_mean_squared_error(y, p)), "kendall_tau": float(tau),
            "size_classes": size_classes(y, p)}


def size_classes(y: np.ndarray, p: np.ndarray) -> dict[str, dict[str, float]]:
    """Per size class of the measured latency: n, MAPE and mean signed error (fractions)."""
    out = {}
    for name, low, high in SIZE_CLASSES:
        sel = (y >= low) & (y < high)
        if sel.any():
            err = (p[sel] - y[sel]) / y[sel]
            out[name] = {"n": int(sel.sum()), "mape": float(np.mean(np.abs(err))),
                         "mpe": float(np.mean(err))}
    return out


def kernel_metrics(kernels: pd.DataFrame, types: Any = None) -> dict[str, Any]:
    """MAPE and acc10 over the test kernels (columns kernel_type, measured_ms, predicted_ms),
    those of `types` only when given."""
    rows = kernels if types is None else kernels[kernels["kernel_type"].isin(types)]
    if rows.empty:
        return {"n": 0, "mape": float("nan"), "acc10": float("nan")}
    y, p = rows["measured_ms"].to_numpy(np.float64), rows["predicted_ms"].to_numpy(np.float64)
    return {"n": int(len(y)), "mape": float(mean_absolute_percentage_error(y, p)),
            "acc10": float(np.mean(np.abs(p - y) / y <= 0.10 + 1e-12))}


def per_type_mape(kernels: pd.DataFrame) -> dict[str, dict[str, float]]:
    """MAPE per kernel type from columns kernel_type, measured_ms, predicted_ms.

    Also the type's share of the measured kernel time, which says how much its error matters
    end to end (the paper's point about "mean" on CPUs).
    """
    out: dict[str, dict[str, float]] = {}
    if kernels.empty:
        return out
    total = float(kernels["measured_ms"].sum())
    for ktype, rows in kernels.groupby("kernel_type"):
        out[str(ktype)] = {
            "n": int(len(rows)),
            "mape": float(mean_absolute_percentage_error(rows["measured_ms"],
                                                         rows["predicted_ms"])),
            "share": float(rows["measured_ms"].sum() / total) if total > 0 else float("nan")}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["share"]))
