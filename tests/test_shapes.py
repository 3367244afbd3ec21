"""Shape inference per op type and whole-graph validation."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latpred.builder import GraphBuilder
from latpred.errors import ShapeError
from latpred.graph import Graph, Op, Tensor
from latpred.graph_checks import validate_graph
from latpred.shapes import broadcast, infer_shapes
from latpred.windows import out_size, same_padding

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def T(shape, dtype="float32", const=False, value=None, name="t"):
    return Tensor(name, tuple(shape), dtype, None, const, value)


def C(values, shape=None):
    """An int32 constant operand holding `values`."""
    values = tuple(values)
    return T((len(values),) if shape is None else shape, "int32", True, values)


# -- window formulas ---------------------------------------------------------------------------
@pytest.mark.parametrize("size,filt,stride,dil,padding,expected", [
    (7, 3, 1, 1, "SAME", 7), (7, 3, 2, 1, "SAME", 4), (8, 3, 2, 1, "SAME", 4),
    (7, 3, 1, 1, "VALID", 5), (7, 3, 2, 1, "VALID", 3), (8, 3, 2, 1, "VALID", 3),
    (7, 3, 1, 2, "VALID", 3), (7, 3, 1, 3, "VALID", 1), (7, 3, 1, 4, "VALID", -1),
    (224, 7, 2, 1, "SAME", 112), (224, 7, 2, 1, "VALID", 109), (5, 1, 3, 1, "VALID", 2),
])
def test_out_size_matches_tflite_formula(size, filt, stride, dil, padding, expected):
    # VALID: (size + stride - ((filt - 1) * dil + 1)) // stride; SAME: ceil(size / stride).
    assert out_size(size, filt, stride, dil, padding) == expected


def test_same_padding_puts_the_odd_pixel_after():
    assert same_padding(8, 3, 2, 1) == (0, 1)     # out 4: needs 3*2+3-8 = 1 pixel
    assert same_padding(7, 3, 1, 2) == (2, 2)     # effective 5: 4 pixels
    assert same_padding(7, 1, 1, 1) == (0, 0)


def test_unknown_padding_is_a_shape_error():
    with pytest.raises(ShapeError, match="padding"):
        out_size(7, 3, 1, 1, "FULL")


# -- per-op rules ------------------------------------------------------------------------------
def test_conv_grouped_and_depthwise():
    x = T((1, 9, 9, 8))
    conv = {"stride": (2, 2), "padding": "VALID", "dilation": (1, 1)}
    assert infer_shapes("CONV_2D", [x, T((16, 3, 3, 8)), T((16,))], conv) == [(1, 4, 4, 16)]
    assert infer_shapes("CONV_2D", [x, T((16, 3, 3, 2)), None], {**conv, "groups": 4}) \
        == [(1, 4, 4, 16)]
    assert infer_shapes("DEPTHWISE_CONV_2D", [x, T((1, 3, 3, 16)), T((16,))],
                        {"stride": (1, 1), "padding": "SAME", "dilation": (2, 2)}) \
        == [(1, 9, 9, 16)]


@pytest.mark.parametrize("inputs,attrs,match", [
    ([T((1, 8, 8, 6)), T((8, 3, 3, 4))], {}, "do not divide"),
    ([T((1, 8, 8, 8)), T((5, 3, 3, 4))], {}, "not divisible"),
    ([T((1, 8, 8, 8)), T((8, 3, 3, 4))], {"groups": 3}, "groups=3"),
    ([T((1, 8, 8, 8)), T((8, 3, 3, 8)), T((4,))], {}, "bias"),
    ([T((1, 2, 2, 8)), T((8, 5, 5, 8))], {"padding": "VALID"}, "does not fit"),
    ([T((8, 8, 8)), T((8, 3, 3, 8))], {}, "rank-4"),
])
def test_conv_errors(inputs, attrs, match):
    with pytest.raises(ShapeError, match=match):
        infer_shapes("CONV_2D", inputs, attrs)


def test_depthwise_filter_must_fit_channels():
    with pytest.raises(ShapeError, match="multiplier"):
        infer_shapes("DEPTHWISE_CONV_2D", [T((1, 8, 8, 4)), T((1, 3, 3, 6))], {})


def test_fully_connected_flattens_or_keeps_dims():
    w = T((10, 32))
    assert infer_shapes("FULLY_CONNECTED", [T((1, 2, 2, 8)), w, None], {}) == [(1, 10)]
    assert infer_shapes("FULLY_CONNECTED", [T((1, 5, 32)), w, T((10,))],
                        {"keep_num_dims": True}) == [(1, 5, 10)]
    with pytest.raises(ShapeError, match="multiple"):
        infer_shapes("FULLY_CONNECTED", [T((1, 30)), w], {})
    with pytest.raises(ShapeError, match="does not end"):
        infer_shapes("FULLY_CONNECTED", [T((1, 5, 30)), w], {"keep_num_dims": True})


def test_pool_and_reductions():
    x = T((1, 7, 7, 3))
    assert infer_shapes("MAX_POOL_2D", [x], {"filter": (3, 3), "stride": (2, 2),
                                            "padding": "VALID"}) == [(1, 3, 3, 3)]
    assert infer_shapes("AVERAGE_POOL_2D", [x], {"filter": (3, 3), "stride": (2, 2),
                                                "padding": "SAME"}) == [(1, 4, 4, 3)]
    assert infer_shapes("MEAN", [x, C((1, 2))], {"keep_dims": True}) == [(1, 1, 1, 3)]
    assert infer_shapes("MEAN", [x, C((-3, -2))], {"keep_dims": False}) == [(1, 3)]
    assert infer_shapes("SUM", [x, C((3,), ())], {}) == [(1, 7, 7)]
    assert infer_shapes("MEAN", [x, T((2,), "int32", True)], {}) is None  # axes unknown
    with pytest.raises(ShapeError, match="out of range"):
        infer_shapes("MEAN", [x, C((4,))], {})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 4), max_size=4), st.lists(st.integers(1, 4), max_size=4))
def test_broadcast_agrees_with_numpy(a, b):
    a, b = tuple(a), tuple(b)
    try:
        expected = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast(a, b)
    else:
        assert broadcast(a, b) == expected
        assert infer_shapes("ADD", [T(a), T(b)], {}) == [expected]


def test_concat_split_split_v():
    a, b = T((1, 4, 4, 3)), T((1, 4, 4, 5))
    assert infer_shapes("CONCATENATION", [a, b], {"axis": 3}) == [(1, 4, 4, 8)]
    assert infer_shapes("CONCATENATION", [a, b], {"axis": -1}) == [(1, 4, 4, 8)]
    with pytest.raises(ShapeError, match="matching"):
        infer_shapes("CONCATENATION", [a, b], {"axis": 1})
    x = T((1, 4, 4, 6))
    assert infer_shapes("SPLIT", [C((3,), ()), x], {"num_splits": 3}) == [(1, 4, 4, 2)] * 3
    with pytest.raises(ShapeError, match="equal parts"):
        infer_shapes("SPLIT", [C((3,), ()), x], {"num_splits": 4})
    assert infer_shapes("SPLIT_V", [x, C((1, -1)), C((-1,), ())], {"num_splits": 2}) \
        == [(1, 4, 4, 1), (1, 4, 4, 5)]
    with pytest.raises(ShapeError, match="add up"):
        infer_shapes("SPLIT_V", [x, C((1, 2)), C((3,), ())], {"num_splits": 2})


def test_reshape_transpose_pad():
    x = T((1, 4, 4, 6))
    assert infer_shapes("RESHAPE", [x, C((1, -1))], {}) == [(1, 96)]
    assert infer_shapes("RESHAPE", [x], {"new_shape": (4, 24)}) == [(4, 24)]
    assert infer_shapes("RESHAPE", [x, T((2,), "int32")], {}) is None   # run-time shape
    with pytest.raises(ShapeError, match="cannot fit"):
        infer_shapes("RESHAPE", [x, C((5, -1))], {})
    with pytest.raises(ShapeError, match="one -1"):
        infer_shapes("RESHAPE", [x, C((-1, -1))], {})
    assert infer_shapes("TRANSPOSE", [x, C((0, 3, 1, 2))], {}) == [(1, 6, 4, 4)]
    with pytest.raises(ShapeError, match="permutation"):
        infer_shapes("TRANSPOSE", [x, C((0, 1, 1, 2))], {})
    assert infer_shapes("PAD", [x, C((0, 0, 1, 2, 3, 0, 0, 1), (4, 2))], {}) == [(1, 7, 7, 7)]
    with pytest.raises(ShapeError, match="non-negative"):
        infer_shapes("PAD", [x, C((0, 0, -1, 0, 0, 0, 0, 0), (4, 2))], {})


def test_batch_matmul_adjoint_and_broadcast():
    a, b = T((2, 1, 3, 4)), T((5, 4, 6))
    assert infer_shapes("BATCH_MATMUL", [a, b], {}) == [(2, 5, 3, 6)]
    assert infer_shapes("BATCH_MATMUL", [T((2, 4, 3)), T((2, 6, 4))],
                        {"adj_x": True, "adj_y": True}) == [(2, 3, 6)]
    with pytest.raises(ShapeError, match="inner"):
        infer_shapes("BATCH_MATMUL", [a, T((5, 3, 4))], {})


_AXIS = st.tuples(st.integers(-7, 7), st.integers(-7, 7), st.sampled_from([1, 2, 3, -1, -2]),
                  st.booleans(), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_strided_slice_agrees_with_numpy(shape, data):
    axes = [data.draw(_AXIS) for _ in shape]
    begin, end, strides, index = [], [], [], []
    bmask = emask = shrink = 0
    for i, (b, e, s, bm, em, sh) in enumerate(axes):
        dim = shape[i]
        if sh and -dim <= b < dim:
            shrink |= 1 << i
            index.append(b)
            s = 1
        else:
            bmask |= bm << i
            emask |= em << i
            index.append(slice(None if bm else b, None if em else e, s))
        begin.append(b), end.append(e), strides.append(s)
    expected = np.zeros(shape)[tuple(index)].shape
    attrs = {"begin_mask": bmask, "end_mask": emask, "shrink_axis_mask": shrink}
    got = infer_shapes("STRIDED_SLICE", [T(shape), C(begin), C(end), C(strides)], attrs)
    assert got == [expected]


def test_unknown_and_malformed_ops():
    assert infer_shapes("CUSTOM:Foo", [T((1, 2))], {}) is None
    with pytest.raises(ShapeError, match="needs 2 inputs"):
        infer_shapes("ADD", [T((1, 2))], {})
    with pytest.raises(ShapeError, match="malformed"):
        infer_shapes("SPLIT", [C((), (0,)), T((1, 4))], {"num_splits": 2})   # empty axis


# -- whole graphs ------------------------------------------------------------------------------
def _graph(ops, tensors, inputs=(0,), outputs=None):
    outputs = outputs if outputs is not None else (len(tensors) - 1,)
    return Graph(tuple(tensors), tuple(ops), tuple(inputs), tuple(outputs))


def test_validate_graph_accepts_builder_and_converter_graphs():
    b = GraphBuilder()
    x = b.input((1, 16, 16, 3))
    y = b.conv2d(x, 8, 3, stride=2, dilation=1, padding="VALID", activation="RELU")
    y = b.squeeze_excite(b.depthwise_conv2d(y, 5, dilation=2))
    b.output(b.softmax(b.fully_connected(b.mean(y, keep_dims=False), 4)))
    validate_graph(b.build())
    from latpred.tflite import read_tflite   # calls validate_graph on files TF wrote

    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.tflite"))):
        if "dynamic" not in path:
            validate_graph(read_tflite(path))


def test_validate_graph_catches_wrong_output_shape():
    tensors = [T((1, 4, 4, 2), name="x"), T((1, 4, 4, 3), name="y")]
    with pytest.raises(ShapeError, match=r"should output shape \(1, 4, 4, 2\).*'y'"):
        validate_graph(_graph([Op.make("RELU", [0], [1])], tensors))


def test_validate_graph_catches_order_and_references():
    t = [T((1, 2), name=n) for n in "abc"]
    relu = lambda i, o: Op.make("RELU", [i], [o])  # noqa: E731
    with pytest.raises(ShapeError, match="execution order"):
        validate_graph(_graph([relu(1, 2), relu(0, 1)], t))
    with pytest.raises(ShapeError, match="written by operations 0 and 1"):
        validate_graph(_graph([relu(0, 1), relu(0, 1)], t))
    with pytest.raises(ShapeError, match="reads tensor 7"):
        validate_graph(_graph([relu(7, 1)], t))
    with pytest.raises(ShapeError, match="refers to tensor 9"):
        validate_graph(_graph([relu(0, 1)], t, outputs=(9,)))
    with pytest.raises(ShapeError, match="produced by no operation"):
        validate_graph(_graph([relu(0, 1)], t, outputs=(2,)))
    with pytest.raises(ShapeError, match="dynamic or negative"):
        validate_graph(_graph([relu(0, 1)], [T((-1, 2), name="a"), *t[1:]], outputs=(1,)))
    with pytest.raises(ShapeError, match=r"Operation 0 \(ADD\)"):
        validate_graph(_graph([Op.make("ADD", [0, 1], [2])],
                              [T((1, 3)), T((1, 2), const=True), T((1, 3))]))


def test_validate_graph_skips_ops_without_rules():
    t = [T((1, 2), name="a"), T((5, 5), name="b")]
    validate_graph(_graph([Op.make("CUSTOM:Foo", [0], [1])], t))


def test_builder_shapes_agree_with_litert():
    """The runtime itself computes the same output shapes as our inference."""
    from ai_edge_litert.interpreter import Interpreter

    from latpred.tflite import write_tflite

    b = GraphBuilder()
    x = b.input((1, 13, 11, 8))
    outs = [b.conv2d(x, 8, (3, 5), stride=(2, 3), padding=p, dilation=d)
            for p in ("SAME", "VALID") for d in (1, 2)]
    outs += [b.depthwise_conv2d(x, 3, stride=2, padding=p, depth_multiplier=2)
             for p in ("SAME", "VALID")]
    outs += [b.conv2d(x, 12, 3, groups=4, padding="VALID", stride=2),
             b.max_pool(x, 3, stride=2, padding="SAME"), b.avg_pool(x, (2, 3)),
             b.mean(x, (1,), keep_dims=False), b.pad(x, ((1, 2), (0, 3))),
             b.transpose(x, (0, 3, 2, 1)), b.reshape(x, (1, -1, 4)),
             *b.split_v(x, (3, -1), axis=1), b.fully_connected(b.reshape(x, (13, 88)), 5)]
    b.output(*outs)
    g = b.build()
    interp = Interpreter(model_content=write_tflite(g))
    interp.allocate_tensors()
    got = [tuple(d["shape"]) for d in interp.get_output_details()]
    assert sorted(got) == sorted(g.tensors[t].shape for t in g.outputs)
