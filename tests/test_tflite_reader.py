"""The .tflite reader on files TensorFlow's converter wrote (tests/fixtures, made by
scripts/make_fixtures.py), cross-checked against the generated object API and the Keras models,
plus every kind of bad input."""

from __future__ import annotations

import json
import pathlib
import time

import flatbuffers
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as fb

from latpred.errors import ModelFormatError, ShapeError, UnsupportedModelError
from latpred.graph import Graph, Op, Tensor
from latpred.tflite import read_tflite, write_tflite
from latpred.tflite.dynamic import input_shapes_from_specs
from latpred.tflite.options import OPERATOR_NAMES
from latpred.tflite.versions import op_version

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
STATIC = ["small_cnn", "small_cnn_int8", "grouped_conv", "mbv2_block", "tiny_vit"]
DTYPES = {0: "float32", 2: "int32", 9: "int8"}


def _read(name: str, **kw) -> Graph:
    return read_tflite(FIXTURES / f"{name}.tflite", **kw)


def _facts(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _pack(model: fb.ModelT) -> bytes:
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _model(name: str) -> fb.ModelT:
    return fb.ModelT.InitFromPackedBuf((FIXTURES / f"{name}.tflite").read_bytes(), 0)


# -- what the converter wrote ---------------------------------------------------------------------

def test_small_cnn_ops_and_attributes() -> None:
    g = _read("small_cnn")
    assert [op.type for op in g.ops] == [
        "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D", "MEAN",
        "FULLY_CONNECTED", "SOFTMAX"]
    conv, dw, _, maxp, avgp, mean, fc, sm = g.ops
    assert conv.attr_dict == {"stride": (1, 1), "padding": "SAME", "dilation": (1, 1),
                              "activation": "RELU", "groups": 1}
    assert dw.attr_dict == {"stride": (2, 2), "padding": "SAME", "dilation": (1, 1),
                            "activation": "RELU6", "depth_multiplier": 1}
    assert maxp.attr_dict == {"stride": (2, 2), "padding": "VALID", "filter": (2, 2),
                              "activation": "NONE"}
    assert avgp.attr("padding") == "SAME"
    assert mean.attr_dict == {"keep_dims": False}
    assert g.tensors[mean.inputs[1]].value == (1, 2)
    assert fc.attr_dict == {"activation": "NONE", "keep_num_dims": False}
    assert sm.attr_dict == {"beta": 1.0}
    w = g.tensors[conv.inputs[1]]
    assert w.shape == (8, 3, 3, 3) and w.is_constant and w.value is None
    assert not g.tensors[conv.outputs[0]].is_constant


def test_grouped_and_dilated_convolutions() -> None:
    g = _read("grouped_conv")
    assert [op.attr("groups") for op in g.ops] == [4, 2, 1]
    assert [g.tensors[op.inputs[1]].shape for op in g.ops] == [
        (16, 3, 3, 2), (16, 3, 3, 8), (8, 3, 3, 16)]
    assert g.ops[2].attr("dilation") == (2, 2)


def test_mobilenet_block_ops() -> None:
    types = _read("mbv2_block").op_types()
    assert types == {"CONV_2D": 5, "HARD_SWISH": 2, "DEPTHWISE_CONV_2D": 1, "MEAN": 1,
                     "MUL": 2, "ADD": 1, "PAD": 1, "LOGISTIC": 1}
    g = _read("mbv2_block")
    pad = next(op for op in g.ops if op.type == "PAD")
    assert g.tensors[pad.inputs[1]].value == (0, 0, 1, 1, 1, 1, 0, 0)


def test_vit_block_ops_and_attributes() -> None:
    g = _read("tiny_vit")
    types = g.op_types()
    for t in ("BATCH_MATMUL", "GELU", "RESHAPE", "TRANSPOSE", "SOFTMAX", "STRIDED_SLICE",
              "SQUARED_DIFFERENCE", "RSQRT", "FULLY_CONNECTED"):
        assert t in types
    bmm = [op for op in g.ops if op.type == "BATCH_MATMUL"]
    assert [op.attr_dict for op in bmm] == [{"adj_x": False, "adj_y": True},
                                            {"adj_x": False, "adj_y": False}]
    assert next(op for op in g.ops if op.type == "GELU").attr_dict == {"approximate": False}
    perms = [g.tensors[op.inputs[1]].value for op in g.ops if op.type == "TRANSPOSE"]
    assert perms == [(0, 2, 3, 1, 4), (0, 2, 1, 3)]
    ss = next(op for op in g.ops if op.type == "STRIDED_SLICE")
    assert ss.attr("shrink_axis_mask") == 2 and ss.attr("offset") is False
    assert next(op for op in g.ops if op.type == "SQUARED_DIFFERENCE").attr_dict == {}
    assert sum(op.attr("keep_num_dims") is True for op in g.ops) == 3


def test_int8_fixture_quantization() -> None:
    g = _read("small_cnn_int8")
    x, y = g.tensors[g.inputs[0]], g.tensors[g.outputs[0]]
    assert x.dtype == y.dtype == "int8" and len(x.quantization.scale) == 1
    conv, dw = g.ops[0], g.ops[1]
    w, b = g.tensors[conv.inputs[1]], g.tensors[conv.inputs[2]]
    assert w.dtype == "int8" and len(w.quantization.scale) == 8 and w.quantization.axis == 0
    assert set(w.quantization.zero_point) == {0}
    assert b.dtype == "int32" and b.value is None  # quantized ints are weights, not values
    in_scale = g.tensors[conv.inputs[0]].quantization.scale[0]
    assert np.allclose(b.quantization.scale, np.array(w.quantization.scale) * in_scale)
    assert g.tensors[dw.inputs[1]].quantization.axis == 3
    sm_out = g.tensors[g.ops[-1].outputs[0]].quantization
    assert sm_out.zero_point == (-128,) and sm_out.scale[0] == pytest.approx(1 / 256)


@pytest.mark.parametrize("name", STATIC)
def test_reader_agrees_with_generated_object_api(name: str) -> None:
    """Tensor by tensor and op by op, against ai_edge_litert's own generated decoder."""
    g, model = _read(name), _model(name)
    sub = model.subgraphs[0]
    assert len(g.tensors) == len(sub.tensors) and len(g.ops) == len(sub.operators)
    for t, ref in zip(g.tensors, sub.tensors):
        assert t.name == ref.name.decode()
        assert t.shape == tuple(np.asarray(ref.shape).tolist())
        assert t.dtype == DTYPES[ref.type]
        data = model.buffers[ref.buffer].data
        assert t.is_constant == (data is not None and len(data) > 0)
        q = ref.quantization
        if q is not None and q.scale is not None and len(q.scale):
            assert t.quantization.scale == pytest.approx(tuple(q.scale))
            assert t.quantization.zero_point == tuple(np.asarray(q.zeroPoint).tolist())
            assert t.quantization.axis == q.quantizedDimension
        else:
            assert t.quantization is None
    names = [OPERATOR_NAMES[max(c.builtinCode, c.deprecatedBuiltinCode)]
             for c in model.operatorCodes]
    highest: dict[str, int] = {}
    for op, ref in zip(g.ops, sub.operators):
        assert op.type == names[ref.opcodeIndex]
        assert op.inputs == tuple(np.asarray(ref.inputs).tolist())
        assert op.outputs == tuple(np.asarray(ref.outputs).tolist())
        # The reader builds Ops without Op.make's freezing pass: same value, hashable.
        assert op == Op.make(op.type, op.inputs, op.outputs, **op.attr_dict) and hash(op)
        highest[op.type] = max(highest.get(op.type, 1), op_version(op, g.tensors))
    # The writer's opcode versions are the converter's: one per type, its highest need.
    assert highest == {n: c.version for n, c in zip(names, model.operatorCodes)}


@pytest.mark.parametrize("name", STATIC)
def test_reader_matches_the_keras_model(name: str) -> None:
    g, facts = _read(name), _facts(name)
    assert [list(g.tensors[i].shape) for i in g.inputs] == facts["inputs"]
    assert [list(g.tensors[i].shape) for i in g.outputs] == facts["outputs"]
    shapes = {t.shape for t in g.tensors}
    for layer, shape in facts["layers"].items():
        # Every Keras layer's output exists as a tensor (the converter may fold the layer into
        # its producer, e.g. batch norm into the conv, but the shape survives).
        assert tuple(shape) in shapes, layer


# -- dynamic shapes ------------------------------------------------------------------------------

def test_dynamic_batch_reads_as_stored_batch_without_flags() -> None:
    # TFLiteConverter marks every Keras input's batch -1 in shape_signature and stores 1 in
    # shape; LiteRT runs the file at batch 1, and so does latpred, on the fast path.
    g = _read("small_cnn_dynamic")
    static = _read("small_cnn")
    assert [op.type for op in g.ops] == [op.type for op in static.ops]
    assert [g.tensors[o].shape for op in g.ops for o in op.outputs] == \
        [static.tensors[o].shape for op in static.ops for o in op.outputs]


def test_dynamic_spatial_input_needs_a_shape() -> None:
    with pytest.raises(UnsupportedModelError,
                       match=r"beyond the batch.*--input-shape serving_default_image:0=1xHxWx3"):
        _read("small_cnn_dynamic_hw")
    g = _read("small_cnn_dynamic_hw", input_shapes=(1, 64, 64, 3))   # a bare shape: one input
    assert g.tensors[g.ops[0].outputs[0]].shape == (1, 64, 64, 8)
    named = _read("small_cnn_dynamic_hw", input_shapes={"serving_default_image:0": (1, 64, 64, 3)})
    assert named.tensors[named.outputs[0]].shape == g.tensors[g.outputs[0]].shape == (1, 10)


@pytest.mark.parametrize("spec, expected", [
    (("1x224x224x3",), (1, 224, 224, 3)),
    (("image=1X96x96x3",), {"image": (1, 96, 96, 3)}),
    (("a=1x4", "b=2x3"), {"a": (1, 4), "b": (2, 3)}),
])
def test_input_shape_specs(spec, expected) -> None:
    assert input_shapes_from_specs(spec) == expected


@pytest.mark.parametrize("spec", [("1x0x3",), ("axb",), ("x=",), ("1x2", "a=1x2")])
def test_bad_input_shape_specs(spec) -> None:
    with pytest.raises(ShapeError):
        input_shapes_from_specs(spec)


def test_dynamic_batch_with_input_shapes_propagates_through_litert() -> None:
    name = "serving_default_image:0"
    g = _read("small_cnn_dynamic", input_shapes={name: (3, 32, 32, 3)})
    assert all(g.tensors[op.outputs[0]].shape[0] == 3 for op in g.ops)
    assert g.tensors[g.outputs[0]].shape == (3, 10)
    static = _read("small_cnn_dynamic", input_shapes={name: (1, 32, 32, 3)})
    assert [op.type for op in static.ops] == [op.type for op in _read("small_cnn").ops]


@pytest.mark.parametrize("shapes, error", [
    ({"nope": (1, 32, 32, 3)}, ShapeError),
    ({"serving_default_image:0": (1, 32, 32)}, ShapeError),
    ({"serving_default_image:0": (1, 16, 32, 3)}, ShapeError),
    ({"serving_default_image:0": (0, 32, 32, 3)}, ShapeError),
])
def test_bad_input_shapes(shapes, error) -> None:
    with pytest.raises(error):
        _read("small_cnn_dynamic", input_shapes=shapes)


# -- bad input -----------------------------------------------------------------------------------

def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(ModelFormatError, match="does not exist"):
        read_tflite(tmp_path / "nope.tflite")
    with pytest.raises(ModelFormatError, match="directory"):
        read_tflite(tmp_path)


def test_not_a_tflite_file() -> None:
    data = (FIXTURES / "small_cnn.tflite").read_bytes()
    with pytest.raises(ModelFormatError, match="too short"):
        read_tflite(b"TFL3")
    with pytest.raises(ModelFormatError, match="file identifier"):
        read_tflite(data[:4] + b"ABCD" + data[8:])
    with pytest.raises(ModelFormatError, match="file identifier"):
        read_tflite(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(ModelFormatError, match="corrupted or truncated"):
        read_tflite(b"\xff\xff\xff\x7fTFL3" + bytes(64))
    with pytest.raises(ModelFormatError, match="corrupted or truncated"):
        read_tflite(data[: len(data) // 2])


def test_control_flow_is_unsupported() -> None:
    model = _model("small_cnn")
    model.subgraphs.append(model.subgraphs[0])
    code = fb.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = fb.BuiltinOperator.IF  # 118 < 127
    model.operatorCodes.append(code)
    model.subgraphs[0].operators[0].opcodeIndex = len(model.operatorCodes) - 1
    with pytest.raises(UnsupportedModelError, match=r"control flow \(IF\) across 2 subgraphs"):
        read_tflite(_pack(model))


def test_unknown_tensor_type_is_unsupported() -> None:
    model = _model("small_cnn")
    model.subgraphs[0].tensors[0].type = 10  # FLOAT64
    with pytest.raises(UnsupportedModelError, match="type 10"):
        read_tflite(_pack(model))


def test_shapes_that_do_not_fit_the_op() -> None:
    model = _model("small_cnn")
    model.subgraphs[0].tensors[model.subgraphs[0].inputs[0]].shape = np.array([1, 32, 32, 5])
    with pytest.raises(ShapeError, match="CONV_2D"):
        read_tflite(_pack(model))


def test_constant_with_wrong_byte_count_is_rejected() -> None:
    model = _model("small_cnn")
    sub = model.subgraphs[0]
    w = sub.tensors[sub.operators[0].inputs[1]]
    model.buffers[w.buffer].data = model.buffers[w.buffer].data[:-4]
    with pytest.raises(ModelFormatError, match="holds"):
        read_tflite(_pack(model))


# -- generic ops, custom ops, speed ---------------------------------------------------------------

def test_generic_and_custom_ops_keep_their_names_and_options() -> None:
    t = (Tensor("x", (1, 1, 4, 1)), Tensor("y", (1, 4)), Tensor("z", (1, 4)))
    g = Graph(t, (Op.make("SQUEEZE", (0,), (1,), squeeze_dims=(1, 3)),
                  Op.make("CUSTOM:MyOp", (1,), (2,))), (0,), (2,), "g")
    back = read_tflite(write_tflite(g))
    assert back.ops[0].attr_dict == {"squeeze_dims": (1, 3)}
    assert back.ops[1].type == "CUSTOM:MyOp"


def _chain(blocks: int) -> Graph:
    from latpred.builder import GraphBuilder

    b = GraphBuilder("chain")
    x = b.input((1, 28, 28, 32))
    for _ in range(blocks):
        y = b.conv2d(x, 32, 1, activation="RELU")
        y = b.hard_swish(b.depthwise_conv2d(y, 3, activation="RELU6"))
        x = b.add(x, y)
    b.output(x)
    return b.build()


def test_a_200_op_model_reads_in_milliseconds() -> None:
    g = _chain(50)
    assert len(g.ops) == 200
    data = write_tflite(g)
    assert read_tflite(data) == g
    times = []
    for _ in range(5):
        start = time.perf_counter()
        read_tflite(data)
        times.append(time.perf_counter() - start)
    # Typically ~5 ms; the bound leaves room for a loaded CI machine, not for a regression.
    assert sorted(times)[2] < 0.05


def test_weights_are_not_copied() -> None:
    """Reading a model with 16 MB of weights costs no more than one with a few KB."""
    from latpred.builder import GraphBuilder

    b = GraphBuilder("big")
    x = b.input((1, 4096))
    b.output(b.fully_connected(x, 1024))
    data = write_tflite(b.build())
    assert len(data) > 16 * 2**20
    import tracemalloc

    tracemalloc.start()
    read_tflite(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20
