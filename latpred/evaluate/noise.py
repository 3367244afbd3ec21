"""The label noise of the data an evaluation scored, as printed beside every accuracy figure.

An accuracy figure cannot be read below the noise of the labels it was computed against: a
predictor that were exact would still show about the labels' test-retest difference. The
dataset's manifest keeps that noise per target (`noise`, in percent): the median absolute
percentage difference between two measurements of the same models (`*_retest_mdape`) and, for
campaigns of the interleaved protocol, their 90th percentile (`*_retest_p90`), end to end and
per kernel. `latpred evaluate` prints it next to each MAPE: the test set's, since that is what
was scored.
"""

from __future__ import annotations

from typing import Any


def noise_cell(noise: dict[str, Any], level: str = "e2e") -> str:
    """E.g. "1.52% (p90 3.1%)", "5.9%", or "not measured" for `level` "e2e" or "kernel"."""
    mdape, p90 = noise.get(f"{level}_retest_mdape"), noise.get(f"{level}_retest_p90")
    if mdape is None:
        return "not measured"
    text = f"{float(mdape):.2f}%"
    return text + (f" (p90 {float(p90):.1f}%)" if p90 is not None else "")


def noise_line(noise: dict[str, Any]) -> str:
    """One sentence: both levels, how many retests, and what was compared."""
    if noise.get("e2e_retest_mdape") is None and noise.get("kernel_retest_mdape") is None:
        return "label noise: not measured for this dataset"
    pair = {"start_vs_end": "retests at the start and end of its campaign",
            "split_half_campaigns": (f"the median of half of its {noise.get('campaigns', '?')} "
                                     "campaigns against the other half's: an upper bound "
                                     "for the combined labels")}.get(
        str(noise.get("retest")), "label vs a retest at the end of its campaign")
    return (f"label noise (test-retest MdAPE, {pair}, {noise.get('n_retest', '?')} models): "
            f"end to end {noise_cell(noise)}, per kernel {noise_cell(noise, 'kernel')}")
