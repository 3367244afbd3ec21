"""Commands on a model file: `inspect` (its operations, kernels, memory) and `predict` (its
latency with a trained predictor)."""

from __future__ import annotations

import click

from latpred.cli.options import input_shape_option, parse_input_shapes


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", "target_name", default=None,
              help="Also list the kernels the runtime of this target executes, e.g. pixel4/gpu/fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--metadata", is_flag=True, help="Show metadata embedded in the model.")
@click.option("--memory", is_flag=True,
              help="Peak memory per op on --target (default host/cpu/fp32/t1): which op sets it.")
@click.option("--memory-kernels", default="xnnpack", show_default=True,
              type=click.Choice(["xnnpack", "builtin"]), help="CPU kernels for --memory.")
@input_shape_option
def inspect(model: str, target_name: str | None, as_json: bool, metadata: bool, memory: bool,
            memory_kernels: str, input_shape: tuple[str, ...]) -> None:
    """List a .tflite model's operations (shapes, attributes, FLOPs, parameters) and totals."""
    import json
    from pathlib import Path

    from latpred import inspect_model as im
    from latpred.errors import ModelFormatError
    from latpred.tflite import read_tflite

    path = Path(model)
    if not path.is_file():
        raise ModelFormatError(f"Model file {model} does not exist.")
    data = path.read_bytes()
    graph = read_tflite(data, input_shapes=parse_input_shapes(input_shape))
    rows = im.op_rows(graph)
    report: dict = {"model": model, "operations": rows, "totals": im.totals(graph, rows)}
    if target_name:
        from latpred.deduce.explain import explain

        explained = explain(graph, target_name)
        report["target"] = explained["summary"]["target"]
        report["kernel_summary"] = explained["summary"]
        report["kernels"] = explained["kernels"]
    if metadata:
        report["metadata"] = im.metadata_entries(data)
        try:
            report["metadata_json"] = im.metadata_json(data)
        except ImportError:
            report["metadata_json"] = None
            if not as_json:
                click.echo("Full metadata needs tflite-support: pip install 'latpred[metadata]'.",
                           err=True)
    if memory:
        from latpred.memory import predict_memory
        from latpred.memory.console import memory_report, print_memory

        mem = predict_memory(graph, target_name or "host/cpu/fp32/t1", memory_kernels, len(data))
        report["memory"] = memory_report(mem)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print_inspect(report)
        if memory:
            print_memory(model, mem, graph)


def _print_inspect(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from latpred.inspect_model import attrs_text

    console = Console()
    table = Table(title=report["model"], show_lines=False)
    for col, justify in (("#", "right"), ("op", "left"), ("inputs", "left"), ("outputs", "left"),
                         ("attributes", "left"), ("MFLOPs", "right"), ("params", "right")):
        table.add_column(col, justify=justify)
    for r in report["operations"]:
        table.add_row(str(r["index"]), r["type"], _shapes(r["inputs"]), _shapes(r["outputs"]),
                      attrs_text(r["attrs"]), f"{r['flops'] / 1e6:.2f}", f"{r['params']:,}")
    console.print(table)
    t = report["totals"]
    console.print(f"{t['operations']} operations, {t['flops'] / 1e6:.1f} MFLOPs, "
                  f"{t['params']:,} parameters; inputs {_shapes(t['inputs'])}, "
                  f"outputs {_shapes(t['outputs'])}")
    if "kernels" in report:
        kt = Table(title=f"kernels on {report['target']}")
        for col in ("#", "kernel", "ops", "runs on", "rule"):
            kt.add_column(col)
        for k in report["kernels"]:
            name = k["type"] + (f" ({k['part']})" if k["part"] else "")
            kt.add_row(str(k["index"]), name, " + ".join(k["ops"]), k["device"], k["rule"])
        console.print(kt)
        summary = report["kernel_summary"]
        where = ("runs entirely on the GPU" if summary["fully_on_gpu"] else
                 f"falls back to CPU for {', '.join(summary['cpu_fallback_ops'])}"
                 if summary["cpu_fallback_ops"] else "runs on the CPU")
        console.print(f"{summary['kernels']} kernels ({summary['runtime']}); the model {where}.")
    if "metadata" in report:
        if not report["metadata"]:
            console.print("No metadata embedded in this model.")
        for entry in report["metadata"]:
            console.print(f"metadata {entry['name']!r}: {entry['bytes']} bytes")
        if report.get("metadata_json"):
            console.print(report["metadata_json"])


def _shapes(shapes: list) -> str:
    return ", ".join("x".join(str(d) for d in s) for s in shapes)


@click.command()
@click.option("--predictor", required=True, type=click.Path(file_okay=False),
              help="Predictor directory written by `latpred train`.")
@click.option("--target", "target_name", default=None, help="Refuse a predictor for another one.")
@click.option("--breakdown", is_flag=True, help="Also print the latency of every kernel.")
@click.option("--allow-fallback", is_flag=True,
              help="Predict kernel types without a regressor by the flagged fallback.")
@click.option("--memory", is_flag=True, help="Also predict each model's peak memory.")
@input_shape_option
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
def predict(predictor: str, target_name: str | None, breakdown: bool, allow_fallback: bool,
            memory: bool, input_shape: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Predict the latency of .tflite MODELS (or torch.export .pt2 programs, converted by
    latpred.from_torch) with a trained predictor."""
    from latpred.predictors import LatencyModel
    from latpred.predictors.console import print_predictions
    from latpred.tflite import read_tflite

    model = LatencyModel.load(predictor, target=target_name)
    shapes = parse_input_shapes(input_shape)
    graphs = [_pt2_graph(m) if m.endswith(".pt2") else read_tflite(m, input_shapes=shapes)
              for m in models]
    preds = model.predict_many(graphs, allow_fallback=allow_fallback)
    print_predictions(models, preds, graphs, breakdown)
    from latpred.power.energy import find as find_energy

    energy_dir = find_energy(predictor)
    if energy_dir is not None and "/cuda/" in str(model.target):
        from latpred.power.energy import EnergyModel, print_energy

        print_energy(models, graphs, preds, EnergyModel.load(energy_dir))
    if memory:
        from latpred.memory import predict_memory
        from latpred.memory.console import print_memory

        for m, g in zip(models, graphs):
            print_memory(m, predict_memory(g, model.target), g, per_op=breakdown)


def _pt2_graph(path: str):
    from latpred.pytorch.export import load_pt2   # imports torch: only for .pt2 files

    return load_pt2(path)
