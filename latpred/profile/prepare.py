"""A model made ready to measure: the bytes a profile run times, its row and its kernel plans.

`_prepare` reads a model entry's file with its inputs fixed to static shapes (`model_bytes`),
checks it against the target's precision, keeps its architecture in the row (`with_graph`: the
Graph itself, for a file nothing else rebuilds) and plans its kernels (`kernels.kernel_plans`); a
model that cannot be read becomes a failed row, one whose kernels cannot be planned a row without
kernels, never the end of the run. Both timing protocols start from it, the sequential loop
(`runner.py`) and the interleaved campaign (`campaign.py`); the noise floor's re-measurements
(`noise.py`) take the bytes alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latpred.errors import LatpredError
from latpred.profile.entries import ModelEntry
from latpred.profile.kernels import check_precision, kernel_plans

if TYPE_CHECKING:
    from latpred.profile.runner import RunOptions


@dataclass(frozen=True)
class _Prepared:
    """A model read and planned: its row's identity columns, its graph and kernel plans.

    `error`: why the model cannot be measured at all (unreadable, wrong precision): a failed
    row. `note`: why its kernels are not measured (the model still is).
    """

    data: bytes
    row: dict
    graph: Any = None
    plans: tuple = ()
    note: str = ""
    error: str = ""


def model_bytes(path: Path, input_shapes: Any = None) -> bytes:
    """The bytes to measure: the file with its inputs fixed to static shapes.

    A converter's file declares a dynamic batch (shape_signature -1); LiteRT's CompiledModel
    API, which the in-context profiler uses, sizes its input buffers from that signature and
    refuses a -1. The interpreter runs such a file at its stored batch 1, so the inputs are fixed
    to that (or to the user's `--input-shape`) first; the weights are untouched.
    """
    data = path.read_bytes()
    from latpred.tflite.dynamic import with_input_shapes

    try:
        return with_input_shapes(data, input_shapes)
    except LatpredError:
        return data  # unreadable or shapes that do not fit: reported when it is read


def with_graph(arch: str, graph) -> str:
    """`arch`, or for a file no sampler or zoo description rebuilds (a converter's, a user's),
    that file's JSON plus its Graph, so evaluation can rebuild the model without the file."""
    import json

    info = json.loads(arch) if arch else {}
    if isinstance(info, dict) and ("blocks" in info or "zoo" in info or "graph" in info):
        return arch
    from latpred.graph_json import graph_to_json

    info = {"description": info} if not isinstance(info, dict) else info
    return json.dumps({**info, "graph": graph_to_json(graph)}, sort_keys=True,
                      separators=(",", ":"))


def _prepare(entry: ModelEntry, target, options: RunOptions) -> _Prepared:
    data = model_bytes(entry.path, options.input_shapes)
    row = {"model_id": entry.model_id, "space": entry.space, "seed": entry.seed,
           "arch": entry.arch, "file_hash": hashlib.sha256(data).hexdigest(),
           "target": str(target), "error": ""}
    try:
        from latpred.tflite import read_tflite

        graph = read_tflite(data)
        check_precision(graph, target)
    except LatpredError as err:  # an unreadable model is a row, not the end of the run
        return _Prepared(data, row, error=str(err))
    row["arch"] = with_graph(entry.arch, graph)
    plans, note = [], ""
    try:
        plans = kernel_plans(graph, target) if options.per_kernel else []
    except LatpredError as err:  # no kernels (e.g. an op deduce has no rule for): e2e only
        note = f"kernels not measured: {err}"
    if any(plan.kernel.part for plan in plans):
        # A stage of a multi-kernel lowering shares its ops with its siblings: neither a
        # sub-model nor the ops' in-context times can tell the stages apart.
        plans, note = [], "kernels not measured: a stage of a multi-kernel lowering " \
                          "cannot be timed alone"
    return _Prepared(data, row, graph, tuple(plans), note)
