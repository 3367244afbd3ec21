"""Commands that measure: `profile` (this CPU, a phone over adb, a Ray cluster),
`import-benchmark` (a phone's benchmark_model output) and `targets` (the device profiles and
their target strings)."""

from __future__ import annotations

import click

from latpred.cli.options import input_shape_option, parse_input_shapes


@click.command()
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
              help="Interleaved and --adb: time the drift reference once every N models "
                   "(0: never).")
@click.option("--drift-bound", default=3.0, show_default=True, type=click.FloatRange(min=0),
              help="Interleaved and --adb: flag the campaign when the reference moves by more "
                   "(percent).")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds one measurement may take before it is killed as a hang.")
@click.option("--seed", default=0, show_default=True, help="Seed of the noise-floor sample.")
@click.option("--no-pin", is_flag=True, help="Do not pin the measuring process to CPU cores.")
@click.option("--no-realtime", is_flag=True,
              help="Do not time under SCHED_FIFO (used where allowed: far less noise).")
@click.option("--adb", "adb_serial", default=None, metavar="SERIAL",
              help="Measure on the phone with this adb serial (benchmark_model with op "
                   "profiling; of the options above only --kernels, --timeout and the drift "
                   "reference's apply).")
@click.option("--benchmark-binary", default="/data/local/tmp/benchmark_model", show_default=True,
              help="With --adb: where benchmark_model is on the phone.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Spread the campaign over the devices of this Ray cluster (one actor per "
                   "device; 'local' starts one here); needs `pip install 'latpred[ray]'`.")
@input_shape_option
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
                               binary=benchmark_binary, kernels=kernels, timeout_s=timeout,
                               drift_every=drift_every, drift_bound_pct=drift_bound).summary())
        return
    options = RunOptions(per_kernel=not e2e_only, retest_fraction=retest, seed=seed,
                         timeout_s=timeout, kernel_timing=kernel_timing.replace("-", "_"),
                         protocol=protocol, drift_every=drift_every, drift_bound_pct=drift_bound,
                         input_shapes=parse_input_shapes(input_shape))
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


@click.command("import-benchmark")
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def targets(as_json: bool) -> None:
    """List the device profiles, their runtimes and GPU rule sets, and example target strings."""
    import json

    from latpred.device_profile import available_devices, load_device
    from latpred.target import target_strings

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
