"""Commands that fit and score predictors: `train`, `adapt`, `evaluate`, and `demo`, which runs
the whole flow (sample, measure, train, evaluate) on this CPU."""

from __future__ import annotations

import click

_FAMILY = click.Choice(["lasso", "rf", "gbdt", "mlp"])


def _ray_option(what: str):
    return click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
                        help=f"{what} on the CPUs of this Ray cluster ('local' starts one "
                             "here, 'auto' finds a running one); needs "
                             "`pip install 'latpred[ray]'`, and no campaign measuring there.")


def _on(ray_address: str | None):
    """`cluster.on_ray(ray_address)`, or nothing without an address."""
    from contextlib import nullcontext

    from latpred.predictors.cluster import on_ray

    return nullcontext() if ray_address is None else on_ray(ray_address)


@click.command()
@click.option("--data", required=True, type=click.Path(file_okay=False, exists=True),
              help="Measured dataset directory.")
@click.option("--target", "target_name", required=True, help="e.g. host/cpu/fp32/t1.")
@click.option("--family", default="gbdt", show_default=True, type=_FAMILY)
@click.option("--search", default="latpred", show_default=True,
              help="Search in configs/predictors/<family>.yaml: latpred, paper, or none.")
@click.option("--overhead", default="auto", show_default=True,
              type=click.Choice(["auto", "constant", "linear", "typed"]))
@click.option("--residual", default="auto", show_default=True,
              type=click.Choice(["auto", "off"]),
              help="The end-to-end residual stage (docs/interfaces.md): auto keeps it where "
                   "it cross-validates better.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--analytical-features", is_flag=True,
              help="Give conv-like kernel types the tile/wave and TMModel features "
                   "(docs/analytical-features.md; off by default).")
@_ray_option("Run the searches' fits and the residual stage's refits")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Predictor directory to write.")
def train(data: str, target_name: str, family: str, search: str, overhead: str, residual: str,
          seed: int, analytical_features: bool, ray_address: str | None, out: str) -> None:
    """Train one regressor per kernel type plus the overhead on DATA, save it to OUT."""
    from latpred.predictors import LatencyModel
    from latpred.predictors.console import TrainingProgress, print_training

    with _on(ray_address), TrainingProgress(f"training {family}") as progress:
        model = LatencyModel.fit(data, target_name, family=family, search=search,
                                 overhead=overhead, seed=seed, progress=progress,
                                 analytical_features=analytical_features, residual=residual)
    model.save(out)
    print_training(model)
    click.echo(f"Saved the predictor to {out}.")


@click.command()
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
              type=click.Choice(["auto", "scaled", "pinned", "refit"]),
              help="The source's overhead times the common factor; that with its cost per "
                   "kernel kept and the rest re-fitted on DATA; one re-fitted on DATA; or "
                   "the pinned one only where it cross-validates over 5% better.")
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


@click.command()
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
@click.option("--no-plots", is_flag=True,
              help="Write report.md and results.json only, without the PNG plots.")
@_ray_option("Run the protocol's search fits and residual refits")
@click.option("--out", default="latpred-report", show_default=True,
              type=click.Path(file_okay=False), help="Report directory (Markdown + PNG).")
def evaluate(data: str, predictor: str | None, protocol: str | None, target_name: str | None,
             train_data: str | None, families: tuple[str, ...], searches: tuple[str, ...],
             sizes: str | None, draws: int, no_baselines: bool, no_ablations: bool,
             analytical_features: bool, include_training: bool, seed: int, no_plots: bool,
             ray_address: str | None, out: str) -> None:
    """Score a predictor on DATA, or run an evaluation protocol with baselines; write a report."""
    from latpred.evaluate import write_report
    from latpred.evaluate.console import print_summary
    from latpred.evaluate.run import run_cli

    with _on(ray_address):
        ev = run_cli(data, predictor, protocol, target_name, train_data, families, searches,
                     sizes, not no_baselines, not no_ablations, include_training, seed,
                     analytical_features, draws)
    print_summary(ev, write_report(ev, out, plots=not no_plots))


@click.command()
@click.option("--out", default="latpred-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the models, datasets and reports.")
@click.option("--quick", is_flag=True, help="A 2-minute smoke run with tiny sizes.")
@click.option("--seed", default=0, show_default=True, help="Seed of the sampled models and split.")
def demo(out: str, quick: bool, seed: int) -> None:
    """Sample, measure on this CPU, train GBDT and Lasso, predict held-out and zoo models."""
    from latpred.demo import run_demo

    reports = run_demo(out, quick=quick, seed=seed, say=click.echo)
    click.echo("Reports: " + ", ".join(str(r) for r in reports))
