"""What `latpred train` and `latpred predict` print (rich tables)."""

from __future__ import annotations

from typing import Any, Sequence


def print_training(model: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model.family} predictor for {model.target}")
    for col in ("kernel type", "rows", "cv MAPE", "train MAPE", "best hyperparameters"):
        table.add_column(col, justify="left" if col in ("kernel type",
                                                         "best hyperparameters") else "right")
    for ktype, fit in model.types.items():
        m = fit.metrics
        cv = "-" if m.get("cv_mape") is None else f"{100 * m['cv_mape']:.2f}%"
        params = ", ".join(f"{k}={v}" for k, v in (m.get("best_params") or {}).items())
        if "scale" in m:  # a type adapted from another device (predictors/adapt/)
            params = f"source x {m['scale']:.3f}" + (" x residual trees" * bool(m["residual"]))
        if "blend_weight" in m:  # mixed with (or, at 0, retrained as) a scratch Lasso
            params = f"{m['blend_weight']:.2f} x adapted + {1 - m['blend_weight']:.2f} x scratch"
        table.add_row(ktype, str(m["n_rows"]), cv, f"{100 * m['train_mape']:.2f}%", params)
    console = Console()
    console.print(table)
    o = model.overhead
    per = (f"{o.per_kernel:.5f} ms per kernel" if not o.per_type else
           "per kernel " + ", ".join(f"{t} {c:.5f}" for t, c in o.per_type)
           + f", other types {o.per_kernel:.5f} ms")
    console.print(f"overhead ({o.kind}): {o.intercept:.4f} ms + {per} "
                  f"+ {o.per_kernel_ms:.4f} x kernel time, from {o.n_models} models")
    t = model.training
    if "residual_cv_mape_with" in t:   # predictors/residual.py: kept or not, and why
        console.print(f"end-to-end residual stage: {t['residual']} (cross-validated MAPE "
                      f"{100 * t['residual_cv_mape_without']:.2f}% without, "
                      f"{100 * t['residual_cv_mape_with']:.2f}% with)")


def print_predictions(paths: Sequence[str], preds: Sequence[Any], graphs: Sequence[Any],
                      breakdown: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="predicted latency")
    for col in ("model", "total ms", "kernels", "kernel sum ms", "overhead ms", "fallback"):
        table.add_column(col, justify="left" if col in ("model", "fallback") else "right",
                         overflow="fold")
    for path, p in zip(paths, preds):
        table.add_row(str(path), f"{p.total_ms:.3f}", str(len(p.kernels)),
                      f"{p.kernel_sum_ms:.3f}", f"{p.overhead_ms:.3f}",
                      ", ".join(p.fallback_types))
    console.print(table)
    if not breakdown:
        return
    for path, p, g in zip(paths, preds, graphs):
        kt = Table(title=f"{path}: per kernel")
        for col in ("#", "kernel", "ops", "ms", "share"):
            kt.add_column(col, justify="right" if col in ("#", "ms", "share") else "left")
        for r in p.breakdown(g):
            name = r["type"] + (f" ({r['part']})" if r["part"] else "")
            name += " [fallback]" if r["fallback"] else ""
            kt.add_row(str(r["index"]), name, " + ".join(r["ops"]), f"{r['latency_ms']:.4f}",
                       f"{r['latency_ms'] / p.total_ms:.1%}")
        console.print(kt)


class TrainingProgress:
    """A tqdm bar over kernel rows for LatencyModel.fit's progress callback (ETA by rows)."""

    def __init__(self, desc: str):
        self.desc = desc
        self._pending = 0

    def __enter__(self) -> "TrainingProgress":
        from tqdm import tqdm

        self.bar = tqdm(desc=self.desc, unit="row", dynamic_ncols=True)
        return self

    def __call__(self, kernel_type: str, rows: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(self._pending)  # the previous kernel type is done
        self._pending = rows
        self.bar.set_postfix_str(f"{kernel_type} ({rows} rows)")

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.bar.update(self._pending)
        self.bar.close()
