"""The .tflite writer: round trips, determinism, and LiteRT really running fp32 and int8 output."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from latpred.builder import GraphBuilder
from latpred.errors import TargetError, UnsupportedModelError
from latpred.graph import Graph, Op, Quantization, Tensor
from latpred.tflite import read_tflite, write_tflite

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def _run(data: bytes, seed: int = 0) -> list[np.ndarray]:
    """Load, allocate and invoke in LiteRT on seeded inputs; the outputs."""
    interp = Interpreter(model_content=data)
    interp.allocate_tensors()
    rng = np.random.default_rng(seed)
    for d in interp.get_input_details():
        x = rng.standard_normal(d["shape"])
        if d["dtype"] == np.int8:
            scale, zero = d["quantization"]
            x = np.clip(np.round(x / scale) + zero, -128, 127)
        interp.set_tensor(d["index"], x.astype(d["dtype"]))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def every_op() -> Graph:
    """One graph with every builder op."""
    b = GraphBuilder("every_op")
    x = b.input((1, 16, 16, 8))
    y = b.conv2d(x, 16, 3, stride=2, activation="RELU6")
    y = b.conv2d(y, 16, 3, groups=4)
    y = b.depthwise_conv2d(y, 3, depth_multiplier=2, dilation=2)
    y = b.squeeze_excite(y)
    y = b.swish(b.hard_swish(y))
    y = b.max_pool(y, 2)
    z = b.avg_pool(y, 2, stride=1, padding="SAME")
    y = b.div(b.mul(b.sub(b.add(y, z), z), z), b.sigmoid(z))
    y = b.relu6(b.relu(b.tanh(y)))
    y = b.pad(y, 1)
    a, c = b.split(y, 2, axis=-1)
    d, e = b.split_v(y, (4, -1), axis=-1)
    y = b.concat([a, c, d, e], axis=-1)
    y = b.squeeze_excite(y, gate="hard_sigmoid")
    y = b.transpose(y, (0, 2, 1, 3))
    y = b.reshape(b.mean(y, (1, 2), keep_dims=False), (1, -1))
    b.output(b.softmax(b.fully_connected(y, 10, activation="RELU")))
    return b.build()


def _single(op: str) -> Graph:
    """A small graph around one builder op (int8 must run for each on its own)."""
    b = GraphBuilder(op)
    x = b.input((1, 8, 8, 8))
    make = {
        "conv2d": lambda: b.conv2d(x, 8, 3, stride=2, activation="RELU"),
        "grouped_conv2d": lambda: b.conv2d(x, 8, 3, groups=2),
        "dilated_conv2d": lambda: b.conv2d(x, 4, 3, dilation=2, padding="VALID"),
        "depthwise_conv2d": lambda: b.depthwise_conv2d(x, 3, depth_multiplier=2),
        "fully_connected": lambda: b.fully_connected(b.reshape(x, (1, 512)), 16),
        "avg_pool": lambda: b.avg_pool(x, 2), "max_pool": lambda: b.max_pool(x, 3, 2, "SAME"),
        "mean": lambda: b.mean(x), "add": lambda: b.add(x, b.relu(x)),
        "sub": lambda: b.sub(x, b.relu(x)), "mul": lambda: b.mul(x, x),
        "div": lambda: b.div(x, b.sigmoid(x)), "relu": lambda: b.relu(x),
        "relu6": lambda: b.relu6(x), "sigmoid": lambda: b.sigmoid(x),
        "hard_swish": lambda: b.hard_swish(x), "tanh": lambda: b.tanh(x),
        "swish": lambda: b.swish(x), "pad": lambda: b.pad(x, ((1, 2), (0, 1))),
        "concat": lambda: b.concat([x, b.relu(x)], axis=-1),
        "split": lambda: b.add(*b.split(x, 2, axis=1)),
        "split_v": lambda: b.split_v(x, (3, 5))[1],
        "reshape": lambda: b.reshape(x, (1, 64, 8)),
        "transpose": lambda: b.transpose(x, (0, 3, 1, 2)),
        "softmax": lambda: b.softmax(b.reshape(x, (1, 512))),
        "squeeze_excite": lambda: b.squeeze_excite(x),
        "squeeze_excite_hard": lambda: b.squeeze_excite(x, gate="hard_sigmoid"),
    }
    b.output(make[op]())
    return b.build()


SINGLE_OPS = ["conv2d", "grouped_conv2d", "dilated_conv2d", "depthwise_conv2d",
              "fully_connected", "avg_pool", "max_pool", "mean", "add", "sub", "mul", "div",
              "relu", "relu6", "sigmoid", "hard_swish", "tanh", "swish", "pad", "concat",
              "split", "split_v", "reshape", "transpose", "softmax", "squeeze_excite",
              "squeeze_excite_hard"]


# -- fp32 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", SINGLE_OPS)
def test_fp32_round_trip_and_runs(op: str) -> None:
    g = _single(op)
    data = write_tflite(g)
    assert read_tflite(data) == g
    assert all(np.isfinite(y).all() for y in _run(data))


def test_every_op_graph_round_trips_and_runs(tmp_path) -> None:
    g = every_op()
    assert {op.type for op in g.ops} >= {
        "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D",
        "MEAN", "ADD", "SUB", "MUL", "DIV", "RELU", "RELU6", "LOGISTIC", "HARD_SWISH", "TANH",
        "PAD", "CONCATENATION", "SPLIT", "SPLIT_V", "RESHAPE", "TRANSPOSE", "SOFTMAX"}
    path = tmp_path / "every_op.tflite"
    data = write_tflite(g, path)
    assert path.read_bytes() == data
    assert read_tflite(path) == g
    (y,) = _run(data)
    assert y.shape == (1, 10) and np.isfinite(y).all()


@pytest.mark.parametrize("name", ["small_cnn", "grouped_conv", "mbv2_block", "tiny_vit"])
def test_converter_graphs_round_trip(name: str) -> None:
    g = read_tflite(FIXTURES / f"{name}.tflite")
    data = write_tflite(g)
    assert read_tflite(data) == g
    assert all(np.isfinite(y).all() for y in _run(data))


def test_same_seed_same_bytes_other_seed_other_weights() -> None:
    g = every_op()
    a, b, c = write_tflite(g, seed=1), write_tflite(g, seed=1), write_tflite(g, seed=2)
    assert a == b and a != c and len(a) == len(c)
    assert read_tflite(c) == g


def test_deep_network_stays_finite() -> None:
    """He-style scaling: 40 convolutions without activation neither explode nor vanish."""
    b = GraphBuilder("deep")
    x = b.input((1, 8, 8, 16))
    for _ in range(40):
        x = b.conv2d(x, 16, 3)
    b.output(x)
    (y,) = _run(write_tflite(b.build()))
    assert np.isfinite(y).all() and 1e-6 < np.abs(y).max() < 1e6


def test_bad_requests() -> None:
    g = _single("relu")
    with pytest.raises(TargetError):
        write_tflite(g, precision="fp16x")
    q = Quantization((0.1,), (0,))
    quantized = Graph((Tensor("x", (1, 4), "int8", q), Tensor("y", (1, 4), "int8", q)),
                      (Op.make("RELU", (0,), (1,)),), (0,), (1,))
    with pytest.raises(UnsupportedModelError, match="fp32 graph"):
        write_tflite(quantized, precision="int8")


def test_quantized_graph_writes_as_it_is() -> None:
    g = read_tflite(FIXTURES / "small_cnn_int8.tflite")
    data = write_tflite(g)
    assert read_tflite(data) == g
    assert _run(data)[0].dtype == np.int8


# -- int8 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", SINGLE_OPS)
def test_int8_runs_in_litert(op: str) -> None:
    g = _single(op)
    data = write_tflite(g, precision="int8")
    q = read_tflite(data)
    assert [op.type for op in q.ops] == [op.type for op in g.ops]
    for i in (*q.inputs, *q.outputs):
        assert q.tensors[i].dtype == "int8"
    assert all(y.dtype == np.int8 for y in _run(data))


def test_int8_every_op_graph_runs_and_is_deterministic() -> None:
    g = every_op()
    data = write_tflite(g, precision="int8", seed=5)
    assert data == write_tflite(g, precision="int8", seed=5)
    (y,) = _run(data)
    assert y.dtype == np.int8 and y.shape == (1, 10)


def _params(q: Graph, op_type: str, k: int = 0) -> list[Tensor]:
    return [q.tensors[op.inputs[k]] for op in q.ops if op.type == op_type]


def test_int8_parameters_follow_tflite_rules() -> None:
    q = read_tflite(write_tflite(every_op(), precision="int8"))
    for op in q.ops:
        x = q.tensors[op.inputs[0]] if op.type != "SPLIT" else q.tensors[op.inputs[1]]
        out = q.tensors[op.outputs[0]]
        if op.type in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            w, b = q.tensors[op.inputs[1]], q.tensors[op.inputs[2]]
            axis = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3}.get(op.type)
            assert w.dtype == "int8" and set(w.quantization.zero_point) == {0}
            if axis is None:
                assert len(w.quantization.scale) == 1
            else:
                assert w.quantization.axis == axis
                assert len(w.quantization.scale) == w.shape[axis]
            assert b.dtype == "int32" and set(b.quantization.zero_point) == {0}
            want = np.array(w.quantization.scale) * x.quantization.scale[0]
            assert np.allclose(b.quantization.scale, np.broadcast_to(want, (b.shape[0],)),
                               rtol=1e-6)
        if op.type in ("LOGISTIC", "SOFTMAX"):
            assert out.quantization.zero_point == (-128,)
            assert out.quantization.scale[0] == pytest.approx(1 / 256)
        if op.type == "TANH":
            assert out.quantization == Quantization((1 / 128,), (0,))
        if op.type in ("RESHAPE", "TRANSPOSE", "PAD", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                       "SPLIT", "SPLIT_V"):
            assert all(q.tensors[o].quantization == x.quantization for o in op.outputs)
        if op.type == "CONCATENATION":
            assert all(q.tensors[i].quantization == out.quantization for i in op.inputs)


def test_int8_output_tracks_fp32_output() -> None:
    """Calibrated ranges are honest: int8 and fp32 models compute nearly the same thing."""
    b = GraphBuilder("cnn")
    x = b.input((1, 16, 16, 3))
    y = b.conv2d(x, 16, 3, stride=2, activation="RELU")
    y = b.depthwise_conv2d(y, 3, activation="RELU6")
    y = b.conv2d(y, 16, 1)
    b.output(b.reshape(b.mean(y, keep_dims=False), (1, 16)))
    g = b.build()
    fp, q = write_tflite(g, seed=4), write_tflite(g, precision="int8", seed=4)
    interp = Interpreter(model_content=q)
    scale, zero = interp.get_output_details()[0]["quantization"]
    for sample in range(3):
        (ref,) = _run(fp, seed=sample)
        (got,) = _run(q, seed=sample)
        deq = (got.astype(np.float32) - zero) * scale
        assert np.corrcoef(ref.ravel(), deq.ravel())[0, 1] > 0.95
        assert np.abs(ref - deq).max() < 0.1 * np.abs(ref).max() + 4 * scale


@pytest.mark.parametrize("name", ["small_cnn", "grouped_conv", "mbv2_block", "tiny_vit"])
def test_int8_converter_graphs_run(name: str) -> None:
    g = read_tflite(FIXTURES / f"{name}.tflite")
    q = read_tflite(write_tflite(g, precision="int8"))
    assert q.op_types() == g.op_types()
    assert all(y.dtype == np.int8 for y in _run(write_tflite(g, precision="int8")))


def test_op_without_int8_kernel_stays_fp32_between_dequantize_and_quantize() -> None:
    t = (Tensor("x", (1, 8)), Tensor("e", (1, 8)), Tensor("y", (1, 8)))
    g = Graph(t, (Op.make("EXP", (0,), (1,)), Op.make("RELU", (1,), (2,))), (0,), (2,), "exp")
    q = read_tflite(write_tflite(g, precision="int8"))
    assert [op.type for op in q.ops] == ["DEQUANTIZE", "EXP", "QUANTIZE", "RELU"]
    exp = q.ops[1]
    assert q.tensors[exp.inputs[0]].dtype == q.tensors[exp.outputs[0]].dtype == "float32"
    assert _run(write_tflite(g, precision="int8"))[0].dtype == np.int8


def _run_builtin(data: bytes) -> list[np.ndarray]:
    """Allocate and invoke with TFLite's built-in kernels only (no XNNPACK delegate): their
    Prepare checks the int8 parameters (the delegate does not check them all)."""
    from ai_edge_litert.interpreter import OpResolverType

    interp = Interpreter(model_content=data,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def test_int8_every_op_graph_runs_with_builtin_kernels() -> None:
    assert _run_builtin(write_tflite(every_op(), precision="int8", seed=5))[0].dtype == np.int8


def test_int8_conflicting_fixed_parameters_are_requantized() -> None:
    """TANH (1/128, 0) and LOGISTIC (1/256, -128) concatenated: one group cannot hold both. The
    first keeps the group, the other is requantized into it by a QUANTIZE op, so each kernel
    gets the output parameters it requires (TFLite refuses a LOGISTIC with TANH's at Prepare)."""
    b = GraphBuilder("tanh_sigmoid_concat")
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 8, 1)
    b.output(b.conv2d(b.concat([b.tanh(y), b.sigmoid(y)], axis=-1), 8, 1))
    data = write_tflite(b.build(), precision="int8", seed=3)
    q = read_tflite(data)
    assert [op.type for op in q.ops] == ["CONV_2D", "TANH", "LOGISTIC", "QUANTIZE",
                                         "CONCATENATION", "CONV_2D"]
    tanh, sigmoid, requant, concat = (q.ops[i] for i in (1, 2, 3, 4))
    assert q.tensors[tanh.outputs[0]].quantization == Quantization((1 / 128,), (0,))
    assert q.tensors[sigmoid.outputs[0]].quantization == Quantization((1 / 256,), (-128,))
    assert requant.inputs == sigmoid.outputs and concat.inputs[1] == requant.outputs[0]
    assert all(q.tensors[t].quantization == Quantization((1 / 128,), (0,))
               for t in (*concat.inputs, *concat.outputs))
    assert _run_builtin(data)[0].dtype == _run(data)[0].dtype == np.int8


def test_int8_bytes_survive_another_cpus_last_bits(monkeypatch) -> None:
    """Another CPU's built-in kernels compute the calibration values a few ulps apart: the
    rounded ranges, and so the int8 file, stay the same."""
    from latpred.tflite import calibrate

    g = every_op()
    before = write_tflite(g, precision="int8", seed=5)
    observed = calibrate.observed_ranges
    rng = np.random.default_rng(0)

    def jittered(*args, **kwargs):
        return {i: (lo * (1 + rng.choice((-1, 1)) * 3e-7), hi * (1 + rng.choice((-1, 1)) * 3e-7))
                for i, (lo, hi) in observed(*args, **kwargs).items()}

    monkeypatch.setattr(calibrate, "observed_ranges", jittered)
    assert write_tflite(g, precision="int8", seed=5) == before


def test_coarse_rounds_bounds_outward() -> None:
    from latpred.tflite.calibrate import coarse

    assert coarse(0.0) == 0.0 and coarse(6.0) == 6.0 and coarse(-6.0) == -6.0
    assert coarse(0.3) == 0.30078125 and coarse(-0.3) == -0.30078125
    for v in np.random.default_rng(1).standard_normal(200) * 10:
        assert abs(coarse(v)) >= abs(v) and abs(coarse(v) - v) <= abs(v) / 64


def test_int8_all_zero_tensor_gets_the_converters_unit_scale() -> None:
    """x - x is 0 on every calibration input: scale 1.0, zero point -128 (as the converter),
    not a tiny scale whose requantization XNNPACK refuses when it creates its runtime."""
    b = GraphBuilder("zeros")
    x = b.input((1, 8, 8, 4))
    z = b.sub(x, x)
    y = b.conv2d(b.conv2d(z, 8, 1, activation="RELU"), 8, 1)
    b.output(b.add(y, b.conv2d(x, 8, 1)))
    data = write_tflite(b.build(), precision="int8", seed=2)
    q = read_tflite(data)
    sub = next(op for op in q.ops if op.type == "SUB")
    assert q.tensors[sub.outputs[0]].quantization == Quantization((1.0,), (-128,))
    assert _run(data)[0].dtype == _run_builtin(data)[0].dtype == np.int8


def test_float_twin_is_the_layout_before_its_data_types() -> None:
    """`float_twin`: the layout's ops and wiring, with float32 where the layout has int8 or
    int32 (a requantized conflict's new tensor is int8 already); None for an fp32 island."""
    from latpred.tflite.quantize import float_twin, int8_layout

    b = GraphBuilder("twin")
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 8, 1)
    b.output(b.concat([b.tanh(y), b.sigmoid(y)], axis=-1))
    conflict = b.build()
    b = GraphBuilder("plain")
    x = b.input((1, 8, 8, 4))
    b.output(b.sigmoid(b.conv2d(x, 8, 3)))
    plain = b.build()
    t = (Tensor("x", (1, 8)), Tensor("e", (1, 8)), Tensor("y", (1, 8)))
    exp = Graph(t, (Op.make("EXP", (0,), (1,)), Op.make("RELU", (1,), (2,))), (0,), (2,), "exp")
    assert float_twin(plain) is plain and float_twin(exp) is None
    twin, layout = float_twin(conflict), int8_layout(conflict)
    assert [op.type for op in twin.ops].count("QUANTIZE") == 1
    assert [(op.type, op.inputs, op.outputs) for op in twin.ops] == \
        [(op.type, op.inputs, op.outputs) for op in layout.ops]
    assert [t.shape for t in twin.tensors] == [t.shape for t in layout.tensors]
    assert [t.dtype for t in twin.tensors][-1] == "int8"


def test_int8_layout_is_the_written_int8_structure() -> None:
    """`int8_layout` (no calibration, no weights) gives the ops, wiring, shapes and data types
    of the int8 file the writer makes: islands, requantized conflicts, int32 biases."""
    from latpred.tflite.quantize import int8_layout

    b = GraphBuilder("layout")
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 8, 1)
    y = b.concat([b.tanh(y), b.sigmoid(y)], axis=-1)
    t = (Tensor("x", (1, 8)), Tensor("e", (1, 8)), Tensor("y", (1, 8)))
    exp = Graph(t, (Op.make("EXP", (0,), (1,)), Op.make("RELU", (1,), (2,))), (0,), (2,), "exp")
    b.output(b.fully_connected(b.reshape(b.mean(y, (1, 2), keep_dims=False), (1, -1)), 4))
    for g in (b.build(), every_op(), exp):
        want, got = read_tflite(write_tflite(g, precision="int8", seed=1)), int8_layout(g)
        assert [(op.type, op.inputs, op.outputs) for op in got.ops] == \
            [(op.type, op.inputs, op.outputs) for op in want.ops]
        assert [(t.shape, t.dtype, t.is_constant) for t in got.tensors] == \
            [(t.shape, t.dtype, t.is_constant) for t in want.tensors]
