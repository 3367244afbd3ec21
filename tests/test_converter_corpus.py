"""Files TensorFlow's converter wrote (scripts/converter_corpus.py) read, deduce and run as is.

The committed fixtures in tests/fixtures/corpus are small variants of keras.applications'
MobileNet V1/V2/V3 and EfficientNet, converted by `TFLiteConverter.from_keras_model`: every
input's batch is dynamic (shape_signature -1), and they hold the converter's idioms (the
SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chain, MEAN-based squeeze-and-excite, HARD_SWISH).
When the full corpus has been generated into out/corpus (dev machines), it is checked too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from latpred.deduce import deduce
from latpred.errors import DelegateRefusedError
from latpred.inspect_model import op_rows, totals
from latpred.device_profile import available_devices, load_device
from latpred.target import target_strings
from latpred.tflite import read_tflite

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.tflite"))
CORPUS = sorted((ROOT / "out" / "corpus").glob("*.tflite"))
TARGETS = [t for d in available_devices() for t in target_strings(load_device(d))]
CHAIN = ("SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE")


def _facts(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def test_the_fixtures_are_there():
    assert len(FIXTURES) >= 4


@pytest.mark.parametrize("path", FIXTURES + CORPUS, ids=lambda p: p.stem)
def test_reads_without_flags_at_the_batch_litert_runs(path: Path):
    facts = _facts(path)
    assert all(s[0] == -1 for s in facts["inputs"]), "expected the converter's dynamic batch"
    graph = read_tflite(path)
    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    runtime = [tuple(d["shape"]) for d in interp.get_input_details()]
    assert [graph.tensors[i].shape for i in graph.inputs] == runtime
    assert [graph.tensors[o].shape for o in graph.outputs] == \
        [tuple(1 if d == -1 else d for d in s) for s in facts["outputs"]]
    # And LiteRT agrees with every intermediate shape latpred read (after a run: tensors whose
    # shape is data, such as ConvNeXt's Dense reshapes, are sized when their op runs).
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], np.float32))
    interp.invoke()
    found = {d["name"]: tuple(d["shape"]) for d in interp.get_tensor_details()}
    for t in graph.tensors:
        if t.name in found and not t.is_constant:
            assert t.shape == found[t.name], t.name


@pytest.mark.parametrize("path", FIXTURES + CORPUS, ids=lambda p: p.stem)
def test_parameters_match_keras_after_batch_norm_folding(path: Path):
    # Keras counts 4 vectors per batch norm; the converter folds them into one bias. On the
    # fixtures (convolutions without bias before each batch norm) random initialisation leaves
    # two artefacts worth at most 0.1%: all-zero dense biases are dropped and hard-sigmoid
    # scalars (3, 1/6) become constants. The full corpus has two more, worth at most 0.5%:
    # ResNet's convolutions keep a bias of their own before the batch norm (4 vectors fold into
    # 1, not 4 into 1 plus one), and separable convolutions (NASNet, Xception) get a zero bias
    # on their depthwise half.
    facts = _facts(path)
    graph = read_tflite(path)
    expected = facts["params"] - 3 * facts["bn_channels"]
    # ConvNeXt has no batch norm but six zero-initialised vectors per block that the converter
    # folds away (LayerNorm betas, Dense biases): up to 1% on the tiny fixture.
    tolerance = 1e-2 if "convnext" in path.stem else 1e-3 if path in FIXTURES else 5e-3
    assert totals(graph, op_rows(graph))["params"] == pytest.approx(expected, rel=tolerance)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_deduces_for_every_target(path: Path):
    """Every target deduces every op, but a GPU delegate refuses a graph whose shapes are known
    only at run time (TFLite's ModifyGraphWithDelegate, `deduce.gpu._check_static_shapes`)."""
    graph = read_tflite(path)
    dynamic = any(op.type == "PACK" for op in graph.ops)   # the converter's dynamic-batch chain
    for target in TARGETS:
        if "/gpu/" in target and dynamic:
            with pytest.raises(DelegateRefusedError, match="free batch size"):
                deduce(graph, target)
            continue
        kernels = deduce(graph, target)
        covered = sorted(i for k in kernels for i in k.ops)
        assert set(covered) == set(range(len(graph.ops))), target


def test_gpu_refusals_match_what_the_h100_compiled():
    """LiteRT's GPU accelerator compiled the fixtures without the dynamic-batch chain and
    failed on the others (status 3: the delegate could not be applied), in both precisions
    (datasets/h100-gpu-memory, session 28)."""
    import pandas as pd

    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-memory" / "models.parquet")
    runs = runs[runs.source == "corpus"]
    assert len(runs) == 2 * len(FIXTURES)
    for r in runs.itertuples():
        path = ROOT / "tests" / "fixtures" / "corpus" / f"{r.model}.tflite"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == r.sha256
        try:
            deduce(read_tflite(path), f"h100/gpu/{r.precision}")
            refused = False
        except DelegateRefusedError:
            refused = True
        assert refused == ("status 3" in r.error), (r.model, r.error)


def test_the_dynamic_reshape_chain_is_why_the_gpu_delegate_is_refused():
    # The chain's RESHAPE gets its shape at run time (reshape.cc: kTfLiteOutputShapeNotKnown),
    # so Prepare finds a dynamic tensor; were the delegate applied, the op would also stay on
    # the CPU: SHAPE has no parser in either delegate, the int32 STRIDED_SLICE and PACK fail
    # IsAllAllowedTensors, the RESHAPE has two runtime inputs (ReshapeOperationParser).
    from latpred.deduce.gpu_support import MLDRIFT_OPS, TFLITE_29_OPS, unsupported_reason
    from latpred.deduce.prepare import first_run_time_shape

    graph = read_tflite(ROOT / "tests" / "fixtures" / "corpus" / "fx_efficientnet_tiny_96.tflite")
    chain = [i for i, op in enumerate(graph.ops) if op.type in CHAIN]
    assert len(chain) == 4 * 7
    stop = first_run_time_shape(graph)
    assert graph.ops[stop].type == "RESHAPE" and stop == chain[3]
    for target in ("pixel4/gpu/fp16", "h100/gpu/fp16"):
        with pytest.raises(DelegateRefusedError, match=f"op {stop} \\(RESHAPE\\)"):
            deduce(graph, target)
    for supported, spatial in ((TFLITE_29_OPS, True), (MLDRIFT_OPS, False)):
        assert all(unsupported_reason(graph, graph.ops[i], supported, spatial) for i in chain)
    reshapes = [unsupported_reason(graph, graph.ops[i], TFLITE_29_OPS, True) for i in chain
                if graph.ops[i].type == "RESHAPE"]
    assert all("run time" in r for r in reshapes), reshapes


def test_fixtures_run_in_litert_at_batch_one():
    for path in FIXTURES:
        interp = Interpreter(model_path=str(path))
        interp.allocate_tensors()
        d = interp.get_input_details()[0]
        interp.set_tensor(d["index"], np.zeros(d["shape"], np.float32))
        interp.invoke()
        assert np.isfinite(interp.get_tensor(interp.get_output_details()[0]["index"])).all()


# Each converter idiom on each GPU rule set, with the delegate source that decides it:
# (op type, predicate on the op, device on TFLite 2.9 (pixel4), device on ML Drift (h100)).
# - LayerNorm's MEAN over channels: TFLite 2.9's MeanOperationParser takes only height/width
#   axes (model_builder.cc @ v2.9.0); ML Drift reduces any axis.
# - GELU: no parser in TFLite 2.9's NewOperationParser; ML Drift has one.
# - GATHER and REDUCE_PROD on the int32 shape vectors: TFLite 2.9 has no GATHER parser, and both
#   delegates require float non-constant tensors (IsAllAllowedTensors / IsAllAllowedTensors in
#   ML Drift's model_builder).
# - NEG, SQUARED_DIFFERENCE, RSQRT, HARD_SWISH: element-wise parsers in both.
IDIOMS = [
    ("MEAN", lambda g, op: g.tensors[op.inputs[1]].value == (-1,), "cpu", "gpu"),
    ("GELU", lambda g, op: True, "cpu", "gpu"),
    ("GATHER", lambda g, op: True, "cpu", "cpu"),
    ("REDUCE_PROD", lambda g, op: True, "cpu", "cpu"),
    ("SQUARED_DIFFERENCE", lambda g, op: True, "gpu", "gpu"),
    ("RSQRT", lambda g, op: True, "gpu", "gpu"),
]


@pytest.mark.parametrize("op_type, which, tflite29, mldrift", IDIOMS, ids=[i[0] for i in IDIOMS])
def test_gpu_support_of_converter_idioms(op_type, which, tflite29, mldrift):
    from latpred.deduce.gpu_support import MLDRIFT_OPS, TFLITE_29_OPS, unsupported_reason

    graph = read_tflite(ROOT / "tests" / "fixtures" / "corpus" / "fx_convnext_mini_64.tflite")
    ops = [op for op in graph.ops if op.type == op_type and which(graph, op)]
    assert ops, op_type
    for supported, spatial_only, expected in ((TFLITE_29_OPS, True, tflite29),
                                              (MLDRIFT_OPS, False, mldrift)):
        devices = {"cpu" if unsupported_reason(graph, op, supported, spatial_only) else "gpu"
                   for op in ops}
        assert devices == {expected}, (op_type, spatial_only)
