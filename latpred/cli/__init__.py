"""The `latpred` command line.

Every command is a thin layer over the public API. Errors a user can cause are `LatpredError`s:
they are printed as one sentence and the process exits with code 2, never with a traceback.

The commands live in one module per stage of the flow: `architectures` (sample, zoo),
`measurement` (profile, import-benchmark, targets), `datasets` (dataset ...), `training`
(train, adapt, evaluate, demo) and `prediction` (inspect, predict). They are plain click
commands, attached to `main` here, so that no command module imports this one.
"""

from __future__ import annotations

import sys

import click

from latpred.cli import architectures, datasets, measurement, prediction, training
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


for _command in (prediction.inspect, prediction.predict, architectures.sample, architectures.zoo,
                 measurement.profile, measurement.import_benchmark, measurement.targets,
                 datasets.dataset_group, training.train, training.adapt, training.evaluate,
                 training.demo):
    main.add_command(_command)
del _command
