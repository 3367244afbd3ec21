"""The tile-quantization paper's convolution latency model (Section III, Eq. 1-6).

Two parts, fitted on measured convolutions (a DataFrame with one row per configuration: N, C,
H, W, K, R, S, P, Q, the measured `latency_ms`, the implementation `kernel` the library ran
and that kernel's measured `grid` size):

- Kernel latency model, one per implementation i: the tile tau = <blkM, blkN> that best
  reproduces the measured grid sizes (Eq. 3, `fit_tau`), then phi = <t_K, t_out, t_in, gamma>
  of t = g*K*t_K + m_out*t_out + m_in*t_in + gamma (Eq. 2) by least absolute error (Eq. 4,
  `fit_phi`). `work="waves"` replaces g by ceil(g / SMs)*blkM*blkN/1024: on a GPU with many SMs
  a grid smaller than one wave costs one wave, which Eq. 2's linear g does not see.
  `tile_from_name=True` takes tau from the kernel's name where it carries one (Hopper's sm90
  kernels are persistent: their launch grid says nothing about the tile) and Eq. 3 otherwise.
- Kernel selection model: a classifier over the configuration, the GEMM sizes, the grid and
  memory terms and every implementation's predicted latency, which learns which implementation
  the library's heuristics pick (the paper's features (1)-(4)).

`TileLatencyModel(...).fit(df).predict(df)` chains them: predict the implementation, then its
latency. Implementations seen fewer than `min_rows` times share one pooled model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import QuantileRegressor

from latpred.errors import LatpredError
from latpred.features.tile import conv_gemm

RARE = "_rare"
# Tile edges in cuDNN / CUTLASS kernel names: xmma "tilesize128x16x64", CUTLASS "gemm_f16_64x64_".
NAMED_TILE = (re.compile(r"tilesize(\d+)x(\d+)x\d+"),
              re.compile(r"gemm_(?:f16_|f32_)?(\d+)x(\d+)_"))
CONFIG = ("N", "C", "H", "W", "K", "R", "S", "P", "Q")
# Candidate tile edges for Eq. 3: those GEMM libraries use (multiples of 8 up to 256).
EDGES = (8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def gemm_terms(df: pd.DataFrame) -> pd.DataFrame:
    """M, N, K, m_in, m_out (Eq. 2) of each convolution row."""
    cols = {c: df[c].to_numpy(np.int64) for c in CONFIG}
    g = [conv_gemm(*(int(cols[c][i]) for c in CONFIG)) for i in range(len(df))]
    return pd.DataFrame({"gm": [x.m for x in g], "gn": [x.n for x in g],
                         "gk": [x.k for x in g], "m_in": [x.m_in for x in g],
                         "m_out": [x.m_out for x in g]}, index=df.index)


def grids(m: np.ndarray, n: np.ndarray, blk_m: int, blk_n: int) -> np.ndarray:
    """Eq. 1, vectorised."""
    return np.ceil(m / blk_m) * np.ceil(n / blk_n)


def fit_tau(m: np.ndarray, n: np.ndarray, measured: np.ndarray,
            edges: Sequence[int] = EDGES) -> tuple[int, int]:
    """Eq. 3: the tile whose grid sizes are closest (L1) to the measured ones."""
    best = min(((np.abs(measured - grids(m, n, bm, bn)).sum(), bm, bn)
                for bm in edges for bn in edges))
    return best[1], best[2]


def name_tile(kernel: str) -> tuple[int, int] | None:
    """(blkM, blkN) read from a kernel name, or None. Needed on Hopper: its sm90 kernels are
    persistent (a grid of about one CTA per SM, whatever the GEMM size), so Eq. 3 fitted to
    the launch grid finds no tile there."""
    for pat in NAMED_TILE:
        m = pat.search(kernel)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def work_term(gm: np.ndarray, gn: np.ndarray, gk: np.ndarray, tau: tuple[int, int],
              work: str, units: int) -> np.ndarray:
    g = grids(gm, gn, *tau)
    if work == "waves":   # whole waves of tiles, each the size of the tile
        g = np.ceil(g / units) * units * (tau[0] * tau[1] / 1024.0)
    return g * gk


def design(terms: pd.DataFrame, tau: tuple[int, int], work: str, units: int) -> np.ndarray:
    """Columns of Eq. 2: g*K, m_out, m_in (gamma is the intercept)."""
    w = work_term(terms["gm"].to_numpy(float), terms["gn"].to_numpy(float),
                  terms["gk"].to_numpy(float), tau, work, units)
    return np.column_stack([w, terms["m_out"].to_numpy(float), terms["m_in"].to_numpy(float)])


def fit_phi(x: np.ndarray, t: np.ndarray, relative: bool = True) -> np.ndarray:
    """Eq. 4 by least absolute error (weighted by 1/t when `relative`): (t_K, t_out, t_in,
    gamma). Columns are scaled first so that the LP is well conditioned."""
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
    reg = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs")
    reg.fit(x / scale, t, sample_weight=1.0 / t if relative else None)
    return np.append(reg.coef_ / scale, reg.intercept_)


@dataclass(frozen=True)
class KernelLatencyModel:
    """theta_i = <tau, phi> of one implementation."""

    tau: tuple[int, int]
    phi: tuple[float, float, float, float]

    def predict(self, terms: pd.DataFrame, work: str, units: int) -> np.ndarray:
        x = design(terms, self.tau, work, units)
        return x @ np.asarray(self.phi[:3]) + self.phi[3]


@dataclass
class TileLatencyModel:
    """Kernel latency models + kernel selection classifier (scikit-learn style)."""

    work: str = "grid"
    tile_from_name: bool = False   # tau from the kernel name where it has one, Eq. 3 otherwise
    compute_units: int = 132
    min_rows: int = 8
    n_estimators: int = 200
    random_state: int = 0
    models_: dict[str, KernelLatencyModel] = field(default_factory=dict, init=False)
    classifier_: RandomForestClassifier | None = field(default=None, init=False)

    def fit(self, df: pd.DataFrame) -> "TileLatencyModel":
        if self.work not in ("grid", "waves"):
            raise LatpredError(f"work must be 'grid' or 'waves', not {self.work!r}.")
        terms = gemm_terms(df)
        labels = self._labels(df["kernel"])
        t = df["latency_ms"].to_numpy(float)
        measured = df["grid"].to_numpy(float)
        self.models_ = {}
        for name in np.unique(labels):
            rows = labels == name
            tau = self._tau(name, terms[rows], measured[rows])
            phi = fit_phi(design(terms[rows], tau, self.work, self.compute_units), t[rows])
            self.models_[name] = KernelLatencyModel(tau, tuple(float(v) for v in phi))
        self.classifier_ = RandomForestClassifier(
            n_estimators=self.n_estimators, random_state=self.random_state, n_jobs=1)
        self.classifier_.fit(self._selection_features(df, terms), labels)
        return self

    def _tau(self, name: str, terms: pd.DataFrame, measured: np.ndarray) -> tuple[int, int]:
        named = name_tile(name) if self.tile_from_name else None
        seen = np.isfinite(measured)        # NaN: grid not measured for this kernel
        if named or not seen.any():
            return named or (64, 64)
        return fit_tau(terms["gm"].to_numpy(float)[seen], terms["gn"].to_numpy(float)[seen],
                       measured[seen])

    def _labels(self, kernels: pd.Series) -> np.ndarray:
        counts = kernels.value_counts()
        keep = set(counts[counts >= self.min_rows].index)
        return np.array([k if k in keep else RARE for k in kernels], dtype=object)

    def _per_kernel(self, terms: pd.DataFrame) -> np.ndarray:
        return np.column_stack([m.predict(terms, self.work, self.compute_units)
                                for m in self.models_.values()])

    def _selection_features(self, df: pd.DataFrame, terms: pd.DataFrame) -> np.ndarray:
        """(1) configuration, (2) GEMM sizes, (3) grid per fitted tile and m_in / m_out,
        (4) each implementation's predicted latency."""
        conf = df[list(CONFIG) + ["stride", "is_fp16"]].to_numpy(float)
        gm, gn = terms["gm"].to_numpy(float), terms["gn"].to_numpy(float)
        g = np.column_stack([grids(gm, gn, *m.tau) for m in self.models_.values()])
        return np.column_stack([conf, terms.to_numpy(float), g, self._per_kernel(terms)])

    def predict_kernel(self, df: pd.DataFrame) -> np.ndarray:
        if self.classifier_ is None:
            raise LatpredError("TileLatencyModel.predict called before fit.")
        return self.classifier_.predict(self._selection_features(df, gemm_terms(df)))

    def predict(self, df: pd.DataFrame, kernels: Sequence[str] | None = None) -> np.ndarray:
        """Latency (ms); `kernels` given (the measured implementations) skips selection."""
        terms = gemm_terms(df)
        chosen = self.predict_kernel(df) if kernels is None else np.array(
            [k if k in self.models_ else RARE for k in kernels], dtype=object)
        per = self._per_kernel(terms)
        col = {name: i for i, name in enumerate(self.models_)}
        fallback = col.get(RARE, 0)
        idx = np.array([col.get(k, fallback) for k in chosen])
        return per[np.arange(len(df)), idx]
