"""What `latpred evaluate` prints: the summary table of a report (rich)."""

from __future__ import annotations

from typing import Any


def print_summary(ev: Any, report_path: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from latpred.evaluate.noise import noise_line
    from latpred.evaluate.report import kernel_accuracy, summary_rows

    # Every accuracy figure sits beside the label noise of the data it was computed on: the
    # first rows of the table give it in the columns of the figures it bounds.
    kernels = {m.name: kernel_accuracy(m).get("all") for m in ev.methods}
    with_kernels = any(k and k["n"] for k in kernels.values())
    table = Table(title=f"{ev.target}: trained on {ev.n_train}, tested on {len(ev.test)} models")
    cols = ["method", "MAPE", "signed", "±10%", "RMSE ms", "Kendall τ"]
    cols += ["kernel MAPE"] if with_kernels else []
    for col in cols + ["train s"]:
        table.add_column(col, justify="left" if col == "method" else "right",
                         no_wrap=col == "method")
    for what, key in (("label noise (MdAPE)", "retest_mdape"), ("label noise (p90)", "retest_p90")):
        e2e, kern = ev.noise.get(f"e2e_{key}"), ev.noise.get(f"kernel_{key}")
        if e2e is None and kern is None and key == "retest_p90":
            continue
        cells = [what, _pct(e2e), "", "", "", ""] + ([_pct(kern)] if with_kernels else [])
        table.add_row(*cells, "", style="dim", end_section=key == "retest_p90" or
                      ev.noise.get("e2e_retest_p90") is None)
    for r in summary_rows(ev):
        cells = [r["method"], f"{100 * r['mape']:.2f}%", f"{100 * r.get('mpe', 0.0):+.1f}%",
                 f"{100 * r['acc10']:.0f}%",
                 f"{r['rmse_ms']:.3g}", f"{r['kendall_tau']:.3f}"]
        if with_kernels:
            k = kernels.get(r["method"])
            cells.append(f"{100 * k['mape']:.2f}%" if k and k["n"] else "-")
        table.add_row(*cells, f"{r['fit_seconds']:.0f}")
    console = Console()
    console.print(table)
    console.print(noise_line(ev.noise))
    for note in ev.notes:
        console.print(f"note: {note}")
    if report_path:
        console.print(f"report: {report_path}")


def _pct(value: Any) -> str:
    """A manifest noise figure (percent) as printed; "n/a" when not measured."""
    return "n/a" if value is None else f"{float(value):.2f}%"
