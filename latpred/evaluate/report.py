"""Write an Evaluation as a directory: report.md, results.json and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from latpred.evaluate import plots as plotting
from latpred.evaluate.metrics import SIZE_CLASSES
from latpred.evaluate.noise import noise_cell

_TITLES = {"split": "(a) hold-out split of one dataset", "sizes": "(b) training-set sizes",
           "transfer": "(c) train on one dataset, test on another",
           "predictor": "a trained predictor on a dataset",
           "fewshot": "few-shot adaptation to a new device"}


def summary_rows(ev) -> list[dict[str, Any]]:
    """One row per method: the figures the CLI and the report print."""
    return [{"method": m.name, "kind": m.kind, **m.metrics, "fit_seconds": m.fit_seconds}
            for m in ev.methods]


def write_report(ev, out: str | Path, plots: bool = True) -> Path:
    """Write report.md, results.json and (with `plots`) the PNG plots into `out`; returns
    report.md's path."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    images = _plots(ev, root) if plots else []
    (root / "results.json").write_text(json.dumps(_results(ev), indent=1, default=_plain))
    path = root / "report.md"
    path.write_text(markdown(ev, [i for i in images if i]))
    return path


def _plots(ev, root: Path) -> list[str | None]:
    return [plotting.pred_vs_measured(ev, root / "pred_vs_measured.png"),
            plotting.error_cdf(ev, root / "error_cdf.png"),
            plotting.kernel_types(ev, root / "kernel_types.png"),
            plotting.sizes(ev, root / "training_sizes.png")]


def markdown(ev, images: list[str]) -> str:
    lines = [f"# latpred evaluation: {_TITLES.get(ev.protocol, ev.protocol)}", "",
             f"- target: `{ev.target}`",
             f"- trained on: `{ev.train_dataset}` ({ev.n_train} models)",
             f"- tested on: `{ev.test.dataset}` ({len(ev.test)} models)",
             f"- noise floor: {_noise(ev.noise)}", "", "## End-to-end accuracy", "",
             "Label noise: the test-retest MdAPE (and 90th percentile) of the test set's "
             "labels; no MAPE can be read below it.", "",
             "| method | MAPE | label noise | ±10% | RMSE (ms) | Kendall τ | train (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    noise = noise_cell(ev.noise)
    for r in summary_rows(ev):
        lines.append(f"| {r['method']} | {_pct(r['mape'])} | {noise} | {_pct(r['acc10'], 0)} | "
                     f"{r['rmse_ms']:.3g} | {r['kendall_tau']:.3f} | {r['fit_seconds']:.0f} |")
    lines += _by_size(ev) + _per_kernel(ev) + _per_type(ev) + _sizes(ev)
    notes = list(ev.notes) + [f"{m.name}: {n}" for m in ev.methods for n in m.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if images:
        lines += ["", "## Plots", ""] + [f"![{i}]({i})" for i in images]
    return "\n".join(lines) + "\n"


def _by_size(ev) -> list[str]:
    """Mean signed error overall and MAPE / signed error per size class of the test models:
    a bias (predicting small models too slow, say) hides inside a good MAPE."""
    classes = [c[0] for c in SIZE_CLASSES]
    lines = ["", "## Bias by model size", "",
             "Mean signed error (positive: predicted too slow), and MAPE / signed error per "
             "size class of the measured latency (models in the class).", "",
             "| method | signed | " + " | ".join(classes) + " |",
             "|---|---:|" + "---:|" * len(classes)]
    for m in ev.methods:
        per = m.metrics.get("size_classes", {})
        cells = [f"{_pct(per[c]['mape'])} / {100 * per[c]['mpe']:+.1f}% ({per[c]['n']})"
                 if c in per else "-" for c in classes]
        lines.append(f"| {m.name} | {100 * m.metrics.get('mpe', math.nan):+.1f}% | "
                     + " | ".join(cells) + " |")
    return lines


def kernel_accuracy(m) -> dict[str, dict[str, Any]]:
    """Per-kernel MAPE / acc10 of a method over all test kernels and the conv-like ones (the
    kernel types the analytical features are for); empty without per-kernel predictions."""
    from latpred.evaluate.metrics import kernel_metrics
    from latpred.predictors.analytical import CONV_LIKE

    if m.kernels is None:
        return {}
    return {"all": kernel_metrics(m.kernels), "conv_like": kernel_metrics(m.kernels, CONV_LIKE)}


def _per_kernel(ev) -> list[str]:
    rows = [(m.name, kernel_accuracy(m)) for m in ev.methods]
    rows = [(name, acc) for name, acc in rows if acc]
    if not rows:
        return []
    noise = noise_cell(ev.noise, "kernel")
    lines = ["", "## Per-kernel accuracy (test kernels)", "",
             "| method | kernels | MAPE | kernel label noise | ±10% | conv-like kernels | MAPE "
             "| ±10% |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, acc in rows:
        a, c = acc["all"], acc["conv_like"]
        lines.append(f"| {name} | {a['n']} | {_pct(a['mape'])} | {noise} | "
                     f"{_pct(a['acc10'], 0)} | {c['n']} | {_pct(c['mape'])} | "
                     f"{_pct(c['acc10'], 0)} |")
    return lines


def _per_type(ev) -> list[str]:
    methods = [m for m in ev.methods if m.per_type]
    if not methods:
        return []
    types = list(methods[0].per_type)
    lines = ["", "## Per kernel type (test kernels, MAPE)", "",
             f"Kernel label noise of the test set: {noise_cell(ev.noise, 'kernel')}.", "",
             "| kernel type | kernels | share of time | " + " | ".join(m.name for m in methods)
             + " |", "|---|---:|---:|" + "---:|" * len(methods)]
    for t in types:
        first = methods[0].per_type[t]
        cells = [_pct(m.per_type.get(t, {}).get("mape", math.nan)) for m in methods]
        lines.append(f"| {t} | {first['n']} | {_pct(first['share'])} | " + " | ".join(cells)
                     + " |")
    return lines


def _sizes(ev) -> list[str]:
    if ev.sizes is None or ev.sizes.empty:
        return []
    table = ev.sizes.pivot_table(index="method", columns="n_train", values="mape", sort=False)
    # few-shot rows are means over random draws: their spread is shown beside them
    spread = (ev.sizes.pivot_table(index="method", columns="n_train", values="mape_std",
                                   sort=False) if "mape_std" in ev.sizes else None)
    cols = list(table.columns)
    title = ("Models measured on the new device (end-to-end MAPE, mean ± sd over draws)"
             if spread is not None else "Training-set sizes (end-to-end MAPE)")
    lines = ["", f"## {title}", "",
             f"Label noise of the test set: {noise_cell(ev.noise)}.", "",
             "| method | " + " | ".join(str(c) for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for method, row in table.iterrows():
        cells = [_pct(row[c]) + ("" if spread is None else f" ± {_pct(spread.loc[method, c])}")
                 for c in cols]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _noise(noise: dict[str, Any]) -> str:
    e2e, kern = noise.get("e2e_retest_mdape"), noise.get("kernel_retest_mdape")
    if e2e is None and kern is None:
        return "not measured for this dataset"
    # the manifest stores test-retest differences in percent, _pct takes fractions
    e2e, kern = (None if v is None else v / 100 for v in (e2e, kern))
    text = (f"re-measuring gives a median absolute percentage difference of {_pct(e2e, 2)} end "
            f"to end and {_pct(kern, 2)} per kernel ({noise.get('n_retest', '?')} retests)")
    e90, k90 = (None if v is None else v / 100 for v in (noise.get("e2e_retest_p90"),
                                                          noise.get("kernel_retest_p90")))
    if e90 is not None or k90 is not None:
        text += f"; 90th percentile {_pct(e90)} end to end, {_pct(k90)} per kernel"
    if noise.get("retest") == "start_vs_end":
        text += " (a sample retested at the start and at the end of the campaign)"
    return text


def _pct(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{100 * float(v):.{digits}f}%"


def _results(ev) -> dict[str, Any]:
    return {"protocol": ev.protocol, "target": ev.target, "train_dataset": ev.train_dataset,
            "test_dataset": ev.test.dataset, "n_train": ev.n_train, "n_test": len(ev.test),
            "noise": ev.noise, "methods": [{**r, "per_kernel_type": m.per_type,
                                            "per_kernel": kernel_accuracy(m),
                                            "notes": list(m.notes)}
                                           for r, m in zip(summary_rows(ev), ev.methods)],
            "sizes": None if ev.sizes is None else ev.sizes.to_dict("records"),
            "notes": list(ev.notes)}


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")
