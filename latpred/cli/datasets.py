"""`latpred dataset`: maintain measured datasets (merge, combine, drift-correct, estimators)."""

from __future__ import annotations

import click


@click.group("dataset")
def dataset_group() -> None:
    """Maintain measured datasets."""


def sources_to_new_dataset(command):
    """SOURCES (existing dataset directories) and --out (a new one) of a dataset command."""
    command = click.option("--out", required=True, type=click.Path(file_okay=False),
                           help="New dataset directory (the sources are left as they are).")(
        command)
    return click.argument("sources", nargs=-1, required=True,
                          type=click.Path(file_okay=False, exists=True))(command)


@dataset_group.command("merge")
@sources_to_new_dataset
def dataset_merge(sources: tuple[str, ...], out: str) -> None:
    """Merge SOURCES (datasets of different models) into one, e.g. to train on several spaces."""
    from latpred.dataset_merge import merge_datasets

    ds = merge_datasets(sources, out)
    click.echo(f"Wrote {len(ds.models())} model rows from {len(sources)} datasets to {out}.")


@dataset_group.command("combine")
@sources_to_new_dataset
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
    """Rescale SOURCE's labels by its drift reference, interpolated at each model's time (a
    Ray farm's: through each model's own device's readings, every device to one level)."""
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
