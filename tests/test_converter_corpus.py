"""Files TensorFlow's converter wrote (scripts/converter_corpus.py) read, deduce and run as is.

The committed fixtures in tests/fixtures/corpus are small variants of keras.applications'
MobileNet V1/V2/V3 and EfficientNet, converted by `TFLiteConverter.from_keras_model`: every
input's batch is dynamic (shape_signature -1), and they hold the converter's idioms (the
SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chain, MEAN-based squeeze-and-excite, HARD_SWISH).
When the full corpus has been generated into out/corpus (dev machines), it is checked too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from latpred.deduce import deduce
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
    graph = read_tflite(path)
    for target in TARGETS:
        kernels = deduce(graph, target)
        covered = sorted(i for k in kernels for i in k.ops)
        assert set(covered) == set(range(len(graph.ops))), target


def test_the_dynamic_reshape_chain_runs_on_the_cpu_under_the_gpu_delegate():
    # SHAPE has no parser in either delegate (gpu_support.TFLITE_29_OPS / MLDRIFT_OPS); the int32
    # STRIDED_SLICE and PACK fail IsAllAllowedTensors (non-constant tensors must be float); the
    # RESHAPE gets its shape at run time (ReshapeOperationParser: one runtime input).
    graph = read_tflite(ROOT / "tests" / "fixtures" / "corpus" / "fx_efficientnet_tiny_96.tflite")
    for target in ("pixel4/gpu/fp16", "h100/gpu/fp16"):
        by_op = {i: k for k in deduce(graph, target) for i in k.ops}
        chain = [i for i, op in enumerate(graph.ops) if op.type in CHAIN]
        assert len(chain) == 4 * 7
        assert all(by_op[i].device == "cpu" for i in chain)
        reshapes = [by_op[i].rule for i in chain if graph.ops[i].type == "RESHAPE"]
        assert all("runtime" in rule for rule in reshapes), reshapes


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
