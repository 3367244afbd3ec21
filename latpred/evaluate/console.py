"""What `latpred evaluate` prints: the summary table of a report (rich)."""

from __future__ import annotations

from typing import Any


def print_summary(ev: Any, report_path: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from latpred.evaluate.noise import noise_cell, noise_line
    from latpred.evaluate.report import kernel_accuracy, summary_rows

    # Every accuracy figure sits beside the label noise of the data it was computed on.
    e2e_noise, kernel_noise = noise_cell(ev.noise), noise_cell(ev.noise, "kernel")
    kernels = {m.name: kernel_accuracy(m).get("all") for m in ev.methods}
    with_kernels = any(k and k["n"] for k in kernels.values())
    table = Table(title=f"{ev.target}: trained on {ev.n_train}, tested on {len(ev.test)} models")
    table.add_column("method", no_wrap=True)
    table.add_column(f"MAPE\nlabel noise\n{e2e_noise}", justify="right")
    for col in ("±10%", "RMSE ms", "Kendall τ"):
        table.add_column(col, justify="right")
    if with_kernels:
        table.add_column(f"kernel MAPE\nlabel noise\n{kernel_noise}", justify="right")
    table.add_column("train s", justify="right")
    for r in summary_rows(ev):
        cells = [r["method"], f"{100 * r['mape']:.2f}%", f"{100 * r['acc10']:.0f}%",
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
