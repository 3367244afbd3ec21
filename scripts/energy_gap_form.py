"""Dev check: the gap-form energy calibration, E = a sum P_k t_k + b (L - sum t_k), on the zoo
(docs/energy.md, "Tried, not kept"). Needs out/power/predictor-cuda9 (docs/energy.md trains it).

    python scripts/energy_gap_form.py
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import power_eval as pe
from latpred.dataset import Dataset
from latpred.power.energy import EnergyModel, KernelPowerModel
from scipy.optimize import nnls
T = pe.TARGET
kd = Dataset.open("datasets/h100-cuda-kernel-counters").kernels(T); kd = kd[(kd.status == "ok") & kd.power_aligned_dyn_w.notna()]
power = KernelPowerModel().fit(kd, kd.power_aligned_dyn_w, kd.latency_ms, seed=0)
tr = Dataset.open("datasets/h100-cuda-energy-synthetic").models(T); tr = tr[tr.status == "ok"].set_index("model_id")
te = Dataset.open("datasets/h100-cuda-energy-zoo").models(T); te = te[te.status == "ok"].set_index("model_id")
for mode in ("measured", "predicted"):
    if mode == "measured":
        ktr = pe._model_kernels("datasets/h100-cuda-synthetic", T); ktr = ktr[ktr.model_id.isin(tr.index)]
        kte = pe._model_kernels("datasets/h100-cuda-zoo", T); kte = kte[kte.model_id.isin(te.index)]
        ltr = Dataset.open("datasets/h100-cuda-synthetic").models(T).set_index("model_id").latency_ms
        lte = Dataset.open("datasets/h100-cuda-zoo").models(T).set_index("model_id").latency_ms
    else:
        ktr, ltr = pe._predicted("out/power/predictor-cuda9", list(tr.index), "synthetic")
        kte, lte = pe._predicted("out/power/predictor-cuda9", list(te.index), "zoo")
    em = EnergyModel(T, power)
    s_tr = pe._sums(em, ktr, ktr.latency_ms.to_numpy(float)); s_te = pe._sums(em, kte, kte.latency_ms.to_numpy(float))
    b_tr = ktr.groupby("model_id").latency_ms.sum(); b_te = kte.groupby("model_id").latency_ms.sum()
    ids = [i for i in tr.index if i in s_tr.index and i in ltr.index]; tid = [i for i in te.index if i in s_te.index and i in lte.index]
    e = tr.loc[ids, "energy_mj"].to_numpy(); w = 1 / e
    A = np.column_stack([s_tr[ids], np.maximum(ltr[ids] - b_tr[ids], 0)])
    c, _ = nnls(A * w[:, None], e * w)
    p = c[0] * s_te[tid] + c[1] * np.maximum(lte[tid] - b_te[tid], 0)
    y = te.loc[tid, "energy_mj"]
    print(mode, "gap form a,b", np.round(c, 3), "zoo MAPE %.2f" % ((p / y - 1).abs().mean() * 100),
          "gap share median %.3f" % float(np.median(np.maximum(lte[tid] - b_te[tid], 0) / lte[tid])))
