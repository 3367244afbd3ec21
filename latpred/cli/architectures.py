"""Commands that make models to measure: `sample` (a NAS space) and `zoo` (published
architectures)."""

from __future__ import annotations

import click


@click.command()
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


@click.group()
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
