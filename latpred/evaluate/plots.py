"""PNG plots of an Evaluation: predicted vs measured, error CDF, per-kernel-type MAPE, sizes.

Figures are built with matplotlib's object API (`Figure`, no pyplot), so nothing touches the
global backend or figure registry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def _save(fig: Figure, path: Path) -> str:
    """Save as a 256-colour palette PNG: a chart has few colours, and the quantized file is
    about a third of matplotlib's RGBA one (reports are committed beside the datasets)."""
    from io import BytesIO

    from PIL import Image  # matplotlib's own dependency

    fig.tight_layout()
    buf = BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
            path, optimize=True)
    return path.name


def pred_vs_measured(ev, path: Path) -> str:
    fig = Figure(figsize=(6, 5.5))
    ax = fig.add_subplot()
    y = ev.test.measured_ms
    for m in ev.methods:
        ax.scatter(y, m.predicted_ms, s=10, alpha=0.6, label=f"{m.name} ({m.metrics['mape']:.1%})")
    lo, hi = float(np.min(y)) * 0.8, float(np.max(y)) * 1.25
    line = np.array([lo, hi])
    ax.plot(line, line, "k-", lw=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.15, label="±10%")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured end-to-end latency (ms)", ylabel="predicted (ms)",
           title=f"{ev.target}: {len(y)} test models")
    ax.legend(fontsize=7)
    return _save(fig, path)


def error_cdf(ev, path: Path) -> str:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    y = ev.test.measured_ms
    for m in ev.methods:
        err = np.sort(np.abs(m.predicted_ms - y) / y) * 100
        ax.step(err, np.arange(1, len(err) + 1) / len(err), where="post", label=m.name)
    ax.axvline(10, color="grey", ls="--", lw=1)
    ax.set(xscale="symlog", xlabel="absolute percentage error (%)",
           ylabel="fraction of test models", title="error CDF", ylim=(0, 1.01))
    ax.legend(fontsize=7)
    return _save(fig, path)


def kernel_types(ev, path: Path) -> str | None:
    methods = [m for m in ev.methods if m.per_type]
    if not methods:
        return None
    types = list(methods[0].per_type)
    fig = Figure(figsize=(max(6, len(types) * 0.7), 4))
    ax = fig.add_subplot()
    width = 0.8 / len(methods)
    x = np.arange(len(types))
    for i, m in enumerate(methods):
        vals = [m.per_type.get(t, {}).get("mape", np.nan) * 100 for t in types]
        ax.bar(x + i * width, vals, width, label=m.name)
    ax.set_xticks(x + 0.4 - width / 2, [f"{t} ({methods[0].per_type[t]['share']:.0%})"
                                        for t in types], fontsize=7, rotation=35, ha="right")
    ax.set(ylabel="kernel MAPE (%)", yscale="log",
           title="per kernel type (share of measured kernel time)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def sizes(ev, path: Path) -> str | None:
    if ev.sizes is None or ev.sizes.empty:
        return None
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for name, rows in ev.sizes.groupby("method", sort=False):
        ax.plot(rows["n_train"], rows["mape"] * 100, marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="training models",
           ylabel="end-to-end MAPE (%)", title="training-set size")
    ax.set_xticks(sorted(ev.sizes["n_train"].unique()),
                  [str(n) for n in sorted(ev.sizes["n_train"].unique())])
    ax.legend(fontsize=7)
    return _save(fig, path)
