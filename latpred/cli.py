"""The `latpred` command line.

Every command is a thin layer over the public API. Errors a user can cause are `LatpredError`s:
they are printed as one sentence and the process exits with code 2, never with a traceback.
"""

from __future__ import annotations

import sys

import click

from latpred.errors import LatpredError


class _Group(click.Group):
    """A click group that turns LatpredError into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LatpredError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="latpred")
def main() -> None:
    """Predict the inference latency of neural architectures on mobile and edge devices."""


# Commands are registered below, one block per stage; keep each block short and call the API.


def _input_shape_option(f):
    """`--input-shape NAME=1x224x224x3` (repeatable), or `--input-shape 1x224x224x3`."""
    return click.option(
        "--input-shape", "input_shape", multiple=True, metavar="[NAME=]1x224x224x3",
        help="Static shape for a model input with dynamic dimensions beyond the batch "
             "(repeat per input; the name may be left out for a single input).")(f)


def _input_shapes(specs: tuple[str, ...]):
    from latpred.tflite.dynamic import input_shapes_from_specs

    return input_shapes_from_specs(specs)


# -- inspect ------------------------------------------------------------------------------------
@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", "target_name", default=None,
              help="Also list the kernels the runtime of this target executes, e.g. pixel4/gpu/fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--metadata", is_flag=True, help="Show metadata embedded in the model.")
@click.option("--memory", is_flag=True,
              help="Peak memory per op on --target (default host/cpu/fp32/t1): which op sets it.")
@click.option("--memory-kernels", default="xnnpack", show_default=True,
              type=click.Choice(["xnnpack", "builtin"]), help="CPU kernels for --memory.")
@_input_shape_option
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
    graph = read_tflite(data, input_shapes=_input_shapes(input_shape))
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


# -- sample -------------------------------------------------------------------------------------
@main.command()
@click.option("--space", "space_file", required=True, type=click.Path(dir_okay=False),
              help="Search-space YAML, e.g. search_space/synthetic_cnn.yaml.")
@click.option("--n", "n", required=True, type=click.IntRange(min=0), help="Models to draw.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for <model_id>.tflite and <model_id>.json.")
@click.option("--precision", default="fp32", show_default=True,
              type=click.Choice(["fp32", "int8"]))
def sample(space_file: str, n: int, seed: int, out: str, precision: str) -> None:
    """Draw N architectures from a NAS space and write them as .tflite plus architecture JSON."""
    from tqdm import tqdm

    from latpred.sampler import load_space, write_samples

    space = load_space(space_file)
    with tqdm(total=n, desc=f"sampling {space.name}", unit="model") as bar:
        paths = write_samples(space, n, seed, out, precision, progress=lambda: bar.update())
    click.echo(f"Wrote {len(paths)} models to {out}.")


# -- profile (host CPU) and import-benchmark (phones) ------------------------------------------
@main.command()
@click.option("--target", "target_name", required=True, help="A CPU target, e.g. host/cpu/fp32/t1.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Dataset directory: created, or resumed where a run stopped.")
@click.option("--kernels", default="xnnpack", show_default=True,
              type=click.Choice(["xnnpack", "builtin"]), help="LiteRT's CPU kernels.")
@click.option("--e2e-only", is_flag=True, help="Skip the per-kernel measurements.")
@click.option("--kernel-timing", default="in-context", show_default=True,
              type=click.Choice(["in-context", "isolated"]),
              help="Kernels timed inside the whole model by LiteRT's profiler (XNNPACK only), "
                   "or each alone as a sub-model.")
@click.option("--retest", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="Fraction of models re-measured for the noise floor (interleaved: at the "
                   "start and at the end; sequential: at the end).")
@click.option("--protocol", default="interleaved", show_default=True,
              type=click.Choice(["interleaved", "sequential"]),
              help="Batches of models timed round-robin with a low-quantile estimator and "
                   "sequential stopping (docs/measurement.md), or one model after the other.")
@click.option("--estimator", default="min", show_default=True,
              type=click.Choice(["min", "p05", "p10", "lowmean"]),
              help="Interleaved: the estimator over a model's (or kernel's) runs.")
@click.option("--batch-size", default=12, show_default=True, type=click.IntRange(min=1),
              help="Interleaved: models loaded and timed round-robin together.")
@click.option("--drift-every", default=12, show_default=True, type=click.IntRange(min=0),
              help="Interleaved: time the drift reference once every N models (0: never).")
@click.option("--drift-bound", default=3.0, show_default=True, type=click.FloatRange(min=0),
              help="Interleaved: flag the campaign when the reference moves by more (percent).")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds one measurement may take before it is killed as a hang.")
@click.option("--seed", default=0, show_default=True, help="Seed of the noise-floor sample.")
@click.option("--no-pin", is_flag=True, help="Do not pin the measuring process to CPU cores.")
@click.option("--no-realtime", is_flag=True,
              help="Do not time under SCHED_FIFO (used where allowed: far less noise).")
@click.option("--adb", "adb_serial", default=None, metavar="SERIAL",
              help="Measure on the phone with this adb serial (benchmark_model with op "
                   "profiling; of the options above only --kernels and --timeout apply).")
@click.option("--benchmark-binary", default="/data/local/tmp/benchmark_model", show_default=True,
              help="With --adb: where benchmark_model is on the phone.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Spread the campaign over the devices of this Ray cluster (one actor per "
                   "device; 'local' starts one here); needs `pip install 'latpred[ray]'`.")
@_input_shape_option
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True))
def profile(target_name: str, out: str, kernels: str, e2e_only: bool, kernel_timing: str,
            retest: float, protocol: str, estimator: str, batch_size: int, drift_every: int,
            drift_bound: float, timeout: float, seed: int, no_pin: bool, no_realtime: bool,
            adb_serial: str | None, benchmark_binary: str, ray_address: str | None,
            input_shape: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Measure .tflite MODELS (files or folders; architecture .json beside) on this CPU, on a
    phone over adb (--adb), or on a Ray cluster's devices (--ray)."""
    from latpred.profile.interleaved import InterleavedProtocol
    from latpred.profile.runner import RunOptions, cpu_measurer, model_paths, profile_models
    from latpred.target import parse_target

    target = parse_target(target_name)
    if adb_serial is not None and ray_address is None:
        from latpred.profile.adb_campaign import profile_adb

        click.echo(profile_adb(model_paths(models), target, out, adb_serial,
                               binary=benchmark_binary, kernels=kernels,
                               timeout_s=timeout).summary())
        return
    options = RunOptions(per_kernel=not e2e_only, retest_fraction=retest, seed=seed,
                         timeout_s=timeout, kernel_timing=kernel_timing.replace("-", "_"),
                         protocol=protocol, drift_every=drift_every, drift_bound_pct=drift_bound,
                         input_shapes=_input_shapes(input_shape))
    interleaved = InterleavedProtocol(batch_size=batch_size, estimator=estimator)
    if ray_address is not None:
        from latpred.profile.farm import FarmOptions, profile_on_ray

        click.echo(profile_on_ray(model_paths(models), target, out, ray_address,
                                  FarmOptions(kernels=kernels, run=options,
                                              interleaved=interleaved,
                                              realtime=not no_realtime,
                                              benchmark_binary=benchmark_binary)).summary())
        return
    report = profile_models(model_paths(models), target, out,
                            cpu_measurer(target, kernels, pin=not no_pin,
                                         realtime=not no_realtime, interleaved=interleaved),
                            options)
    click.echo(report.summary())


@main.group("dataset")
def dataset_group() -> None:
    """Maintain measured datasets."""


@dataset_group.command("merge")
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="New dataset directory (the sources are left as they are).")
def dataset_merge(sources: tuple[str, ...], out: str) -> None:
    """Merge SOURCES (datasets of different models) into one, e.g. to train on several spaces."""
    from latpred.dataset_merge import merge_datasets

    ds = merge_datasets(sources, out)
    click.echo(f"Wrote {len(ds.models())} model rows from {len(sources)} datasets to {out}.")


@dataset_group.command("combine")
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="New dataset directory (the sources are left as they are).")
def dataset_combine(sources: tuple[str, ...], out: str) -> None:
    """Combine SOURCES (campaigns of the same models) into labels that are their median."""
    from latpred.dataset_merge import combine_campaigns

    for target, n in combine_campaigns(sources, out).items():
        click.echo(f"{target}: median of {n['campaigns']} campaigns; split-half retest "
                   f"{n['e2e_retest_mdape']}% end to end (p90 {n['e2e_retest_p90']}%), "
                   f"{n['kernel_retest_mdape']}% per kernel, {n['n_retest']} models.")
    click.echo(f"Wrote the combined dataset to {out}.")


@dataset_group.command("drift-correct")
@click.argument("source", type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="New dataset directory for the corrected copy (SOURCE is left as it is).")
@click.option("--target", "targets", multiple=True,
              help="Correct only this target (repeatable; default: every one with a series).")
@click.option("--reference-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Bring the labels to the machine state in which the drift reference reads "
                   "this many ms (give several datasets the same value to compare campaigns "
                   "measured at different times); default: the campaign's own median.")
def dataset_drift_correct(source: str, out: str, targets: tuple[str, ...],
                          reference_ms: float | None) -> None:
    """Rescale SOURCE's labels by its drift reference, interpolated at each model's time."""
    from latpred.profile.drift import drift_correct

    for target, f in drift_correct(source, out, targets, reference_ms).items():
        click.echo(f"{target}: labels divided by {f['min_factor']:.4f}-{f['max_factor']:.4f}.")
    click.echo(f"Wrote the drift-corrected dataset to {out}.")


@dataset_group.command("estimators")
@click.argument("data", type=click.Path(file_okay=False, exists=True))
@click.option("--target", "target_name", required=True, help="e.g. host/cpu/fp32/t1.")
def dataset_estimators(data: str, target_name: str) -> None:
    """Odd-vs-even-round retest of each estimator over an interleaved campaign's rounds."""
    from latpred.dataset import Dataset
    from latpred.errors import DatasetError
    from latpred.profile.interleaved_rows import split_half_figures

    ds = Dataset.open(data)
    models, kernels = ds.models(target_name), ds.kernels(target_name)
    if "rounds_json" not in models.columns:
        raise DatasetError(f"{data} has no per-round statistics for {target_name}: it was not "
                           "measured with the interleaved protocol.")
    rows = {"end to end": split_half_figures(models["rounds_json"].fillna("").tolist()),
            "per kernel": split_half_figures(kernels["rounds_json"].fillna("").tolist()
                                             if "rounds_json" in kernels.columns else [],
                                             series=None)}
    for level, figures in rows.items():
        for est, f in figures.items():
            if f["n"]:
                click.echo(f"{level:10s} {est:8s} MdAPE {f['mdape']:6.2f}%  p90 {f['p90']:6.2f}%"
                           f"  ({f['n']} rows)")


@main.command("import-benchmark")
@click.option("--target", "target_name", required=True, help="Where it ran, e.g. pixel4/cpu/fp32/1L.")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The .tflite that was benchmarked (architecture .json beside, if any).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Dataset directory.")
@click.argument("outputs", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
def import_benchmark(target_name: str, model: str, out: str, outputs: tuple[str, ...]) -> None:
    """Store benchmark_model --enable_op_profiling=true OUTPUTS (log and/or CSV) of MODEL."""
    from latpred.profile.benchmark_import import import_benchmark as run_import
    from latpred.target import parse_target

    r = run_import(outputs, model, parse_target(target_name), out)
    click.echo(f"Imported {r.model_id} on {r.target}: {r.latency_ms:.3f} ms end to end, "
               f"{r.kernels} kernels over {r.profiled_runs} profiled runs.")


# -- targets --------------------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def targets(as_json: bool) -> None:
    """List the device profiles, their runtimes and GPU rule sets, and example target strings."""
    import json

    from latpred.target import available_devices, load_device, target_strings

    rows = []
    for name in available_devices():
        d = load_device(name)
        rows.append({"device": name, "name": d.display_name, "runtime":
                     f"{d.runtime} {d.runtime_version}", "gpu": d.gpu.model if d.gpu else "",
                     "gpu_rules": d.gpu_rules or "", "cpu_cores": "+".join(
                         f"{c.count}{c.name}" for c in d.clusters), "targets": target_strings(d)})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        click.echo(f"{r['device']:11s} {r['name']} | {r['runtime']} | GPU {r['gpu'] or '-'} "
                   f"({r['gpu_rules'] or '-'}) | CPU {r['cpu_cores']}\n"
                   f"            {'  '.join(r['targets'])}")


# -- train, predict, evaluate ---------------------------------------------------------------------
_FAMILY = click.Choice(["lasso", "rf", "gbdt", "mlp"])


@main.command()
@click.option("--data", required=True, type=click.Path(file_okay=False, exists=True),
              help="Measured dataset directory.")
@click.option("--target", "target_name", required=True, help="e.g. host/cpu/fp32/t1.")
@click.option("--family", default="gbdt", show_default=True, type=_FAMILY)
@click.option("--search", default="latpred", show_default=True,
              help="Search in configs/predictors/<family>.yaml: latpred, paper, or none.")
@click.option("--overhead", default="auto", show_default=True,
              type=click.Choice(["auto", "constant", "linear"]))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--analytical-features", is_flag=True,
              help="Give conv-like kernel types the tile/wave and TMModel features "
                   "(docs/analytical-features.md; off by default).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Predictor directory to write.")
def train(data: str, target_name: str, family: str, search: str, overhead: str, seed: int,
          analytical_features: bool, out: str) -> None:
    """Train one regressor per kernel type plus the overhead on DATA, save it to OUT."""
    from latpred.predictors import LatencyModel
    from latpred.predictors.console import TrainingProgress, print_training

    with TrainingProgress(f"training {family}") as progress:
        model = LatencyModel.fit(data, target_name, family=family, search=search,
                                 overhead=overhead, seed=seed, progress=progress,
                                 analytical_features=analytical_features)
    model.save(out)
    print_training(model)
    click.echo(f"Saved the predictor to {out}.")


@main.command()
@click.option("--from", "source", required=True, type=click.Path(file_okay=False, exists=True),
              help="Predictor trained on another device (`latpred train`).")
@click.option("--data", required=True, type=click.Path(file_okay=False, exists=True),
              help="Dataset of the few models (10-30) measured on the new device.")
@click.option("--target", "target_name", default=None,
              help="The new device's target (default: DATA's only target).")
@click.option("--method", default="auto", show_default=True,
              type=click.Choice(["auto", "global", "scale", "residual", "stacked"]),
              help="One factor for all kernels, per-kernel-type factors, factors plus residual "
                   "trees, the linear family refitted with the source's prediction as a term, "
                   "or the simplest of these within 5% of the best in a cross-validation over "
                   "DATA, each kernel type then mixed with a Lasso trained on DATA alone by the "
                   "weight the same folds favour.")
@click.option("--overhead", default="auto", show_default=True,
              type=click.Choice(["auto", "scaled", "refit"]),
              help="The source's overhead times the common factor, one re-fitted on DATA, or "
                   "the re-fitted one only where it cross-validates over 5% better.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Predictor directory to write.")
def adapt(source: str, data: str, target_name: str | None, method: str, overhead: str,
          seed: int, out: str) -> None:
    """Adapt a predictor to a new device from a few models measured there (docs/fewshot.md)."""
    from latpred.predictors.adapt import adapt_dataset
    from latpred.predictors.console import print_training

    model = adapt_dataset(source, data, target_name, method, seed, overhead)
    model.save(out)
    print_training(model)
    cv = model.training.get("method_cv_mape") or {}
    chosen = model.training["method"] + (
        " (cross-validated MAPE " + ", ".join(f"{m} {100 * v:.1f}%" for m, v in cv.items()) + ")"
        if cv else "")
    mixed = [t for t, w in (model.training.get("blend_weights") or {}).items() if w < 1]
    partner = {"gbdt": "GBDT"}.get(model.training.get("blend_partner"), "Lasso")
    blend = f", {len(mixed)} kernel types mixed with a scratch {partner}" if mixed else ""
    click.echo(f"Adapted from {model.training['adapted_from']} with {chosen} on "
               f"{model.training['n_models']} models, {model.training['overhead']} "
               f"overhead{blend}; saved the predictor to {out}.")


@main.command()
@click.option("--predictor", required=True, type=click.Path(file_okay=False),
              help="Predictor directory written by `latpred train`.")
@click.option("--target", "target_name", default=None, help="Refuse a predictor for another one.")
@click.option("--breakdown", is_flag=True, help="Also print the latency of every kernel.")
@click.option("--allow-fallback", is_flag=True,
              help="Predict kernel types without a regressor by the flagged fallback.")
@click.option("--memory", is_flag=True, help="Also predict each model's peak memory.")
@_input_shape_option
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
def predict(predictor: str, target_name: str | None, breakdown: bool, allow_fallback: bool,
            memory: bool, input_shape: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Predict the latency of .tflite MODELS (or torch.export .pt2 programs, converted by
    latpred.from_torch) with a trained predictor."""
    from latpred.predictors import LatencyModel
    from latpred.predictors.console import print_predictions
    from latpred.tflite import read_tflite

    model = LatencyModel.load(predictor, target=target_name)
    shapes = _input_shapes(input_shape)
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


@main.command()
@click.option("--data", required=True, type=click.Path(file_okay=False, exists=True),
              help="Dataset to test on (to train on too, for --protocol a and b).")
@click.option("--predictor", default=None, type=click.Path(file_okay=False),
              help="Score this trained predictor on DATA (its training models left out).")
@click.option("--protocol", default=None, type=click.Choice(["a", "b", "c", "fewshot"]),
              help="a: 90/10 split (900/100), b: training sizes, c: train on --train-data, "
                   "fewshot: adapt --predictor to DATA's device from --sizes models.")
@click.option("--target", "target_name", default=None, help="Target, for --protocol.")
@click.option("--train-data", default=None, type=click.Path(file_okay=False, exists=True),
              help="Protocol c: the dataset to train on (DATA is the test set); fewshot: "
                   "the pool the few models are drawn from.")
@click.option("--family", "families", multiple=True, type=_FAMILY,
              help="Families to train (repeatable; default all four).")
@click.option("--search", "searches", multiple=True,
              help="Searches to run (repeatable: latpred, paper, none; default latpred).")
@click.option("--sizes", default=None,
              help="Protocol b: training-set sizes [30,100,300,900]; fewshot: numbers of "
                   "models [10,20,30].")
@click.option("--draws", default=10, show_default=True, type=click.IntRange(min=1),
              help="Protocol fewshot: random draws of the models per size.")
@click.option("--no-baselines", is_flag=True, help="Skip FLOPs-linear and nn-Meter.")
@click.option("--no-ablations", is_flag=True, help="Skip the GPU ablations.")
@click.option("--analytical-features", is_flag=True,
              help="Also train each family with the analytical features (method "
                   "'<family> + analytical'), the ablation of docs/analytical-features.md.")
@click.option("--include-training", is_flag=True, help="With --predictor: score every model.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--out", default="latpred-report", show_default=True,
              type=click.Path(file_okay=False), help="Report directory (Markdown + PNG).")
def evaluate(data: str, predictor: str | None, protocol: str | None, target_name: str | None,
             train_data: str | None, families: tuple[str, ...], searches: tuple[str, ...],
             sizes: str | None, draws: int, no_baselines: bool, no_ablations: bool,
             analytical_features: bool, include_training: bool, seed: int, out: str) -> None:
    """Score a predictor on DATA, or run an evaluation protocol with baselines; write a report."""
    from latpred.evaluate import write_report
    from latpred.evaluate.console import print_summary
    from latpred.evaluate.run import run_cli

    ev = run_cli(data, predictor, protocol, target_name, train_data, families, searches, sizes,
                 not no_baselines, not no_ablations, include_training, seed,
                 analytical_features, draws)
    print_summary(ev, write_report(ev, out))


# -- zoo ------------------------------------------------------------------------------------------
@main.group()
def zoo() -> None:
    """The real-world model zoo (published architectures)."""


@zoo.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def zoo_list(as_json: bool) -> None:
    """List the zoo's models: name, family, parameters, MFLOPs, operations."""
    import json

    from latpred.zoo import ZOO, summary

    rows = [summary(name) for name in ZOO]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'name':22s} {'family':14s} {'params':>11s} {'MFLOPs':>9s} {'ops':>5s} {'res':>4s}")
    for r in rows:
        click.echo(f"{r['name']:22s} {r['family']:14s} {r['params']:>11,d} {r['mflops']:>9.1f} "
                   f"{r['ops']:>5d} {r['resolution']:>4d}")


@zoo.command("export")
@click.argument("name")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The .tflite to write.")
@click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "int8"]))
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights.")
def zoo_export(name: str, out: str, precision: str, seed: int) -> None:
    """Write zoo model NAME as a .tflite (random weights, converter-style graph)."""
    from latpred.tflite import write_tflite
    from latpred.zoo import build

    data = write_tflite(build(name), out, precision=precision, seed=seed)
    click.echo(f"Wrote {name} ({precision}, {len(data) / 1e6:.1f} MB) to {out}.")


@zoo.command("export-all")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for <name>.tflite and <name>.json (ready for `latpred profile`).")
@click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "int8"]))
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights.")
def zoo_export_all(out: str, precision: str, seed: int) -> None:
    """Write every zoo model with its architecture JSON, to measure them as a dataset."""
    from tqdm import tqdm

    from latpred.zoo import ZOO, write_models

    with tqdm(total=len(ZOO), desc="writing zoo", unit="model") as bar:
        paths = write_models(out, precision=precision, seed=seed, progress=bar.update)
    click.echo(f"Wrote {len(paths)} zoo models to {out}.")


# -- demo -----------------------------------------------------------------------------------------
@main.command()
@click.option("--out", default="latpred-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the models, datasets and reports.")
@click.option("--quick", is_flag=True, help="A 2-minute smoke run with tiny sizes.")
@click.option("--seed", default=0, show_default=True, help="Seed of the sampled models and split.")
def demo(out: str, quick: bool, seed: int) -> None:
    """Sample, measure on this CPU, train GBDT and Lasso, predict held-out and zoo models."""
    from latpred.demo import run_demo

    reports = run_demo(out, quick=quick, seed=seed, say=click.echo)
    click.echo("Reports: " + ", ".join(str(r) for r in reports))
