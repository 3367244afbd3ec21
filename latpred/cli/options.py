"""Options that several commands share."""

from __future__ import annotations

import click


def input_shape_option(f):
    """`--input-shape NAME=1x224x224x3` (repeatable), or `--input-shape 1x224x224x3`."""
    return click.option(
        "--input-shape", "input_shape", multiple=True, metavar="[NAME=]1x224x224x3",
        help="Static shape for a model input with dynamic dimensions beyond the batch "
             "(repeat per input; the name may be left out for a single input).")(f)


def parse_input_shapes(specs: tuple[str, ...]):
    """The --input-shape values as the tflite reader takes them (None: none given)."""
    from latpred.tflite.dynamic import input_shapes_from_specs

    return input_shapes_from_specs(specs)
