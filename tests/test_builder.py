"""GraphBuilder: the ops, attributes and constants the TFLite converter would emit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latpred.builder import GraphBuilder
from latpred.errors import ShapeError
from latpred.graph import Graph
from latpred.graph_checks import validate_graph


def _only(graph: Graph, op_type: str):
    ops = [op for op in graph.ops if op.type == op_type]
    assert len(ops) == 1, graph.op_types()
    return ops[0]


def _tensor(graph: Graph, op, k: int):
    return graph.tensors[op.inputs[k]]


def _build(fn, shape=(1, 8, 8, 4)):
    b = GraphBuilder("t")
    out = fn(b, b.input(shape))
    b.output(*(out if isinstance(out, list) else [out]))
    g = b.build()
    validate_graph(g)
    assert g.topological_order() == tuple(range(len(g.ops)))   # ops in execution order
    return g


def test_conv2d_weights_bias_and_attributes():
    g = _build(lambda b, x: b.conv2d(x, 16, (3, 5), stride=2, dilation=(2, 1),
                                     padding="VALID", activation="RELU6"))
    op = _only(g, "CONV_2D")
    w, bias = _tensor(g, op, 1), _tensor(g, op, 2)
    assert (w.shape, w.dtype, w.is_constant, w.value) == ((16, 3, 5, 4), "float32", True, None)
    assert (bias.shape, bias.is_constant) == ((16,), True)
    assert op.attr_dict == {"stride": (2, 2), "padding": "VALID", "dilation": (2, 1),
                            "activation": "RELU6", "groups": 1}
    # VALID with effective window 5x5: (8 + 2 - 5) // 2 = 2 both ways.
    assert g.tensors[op.outputs[0]].shape == (1, 2, 2, 16)


def test_grouped_conv_has_a_bias_as_litert_needs():
    g = _build(lambda b, x: b.conv2d(x, 8, 3, groups=2))
    op = _only(g, "CONV_2D")
    assert _tensor(g, op, 1).shape == (8, 3, 3, 2) and _tensor(g, op, 2).shape == (8,)
    assert op.attr("groups") == 2


def test_depthwise_filter_layout():
    g = _build(lambda b, x: b.depthwise_conv2d(x, 3, stride=2, depth_multiplier=3))
    op = _only(g, "DEPTHWISE_CONV_2D")
    assert _tensor(g, op, 1).shape == (1, 3, 3, 12) and _tensor(g, op, 2).shape == (12,)
    assert op.attr("depth_multiplier") == 3 and op.attr("stride") == (2, 2)
    assert g.tensors[op.outputs[0]].shape == (1, 4, 4, 12)


def test_fully_connected_rank2_and_rank3():
    g = _build(lambda b, x: b.fully_connected(b.reshape(x, (1, -1)), 10), (1, 2, 2, 3))
    op = _only(g, "FULLY_CONNECTED")
    assert _tensor(g, op, 1).shape == (10, 12) and op.attr("keep_num_dims") is False
    g = _build(lambda b, x: b.fully_connected(x, 7, activation="RELU"), (1, 5, 12))
    op = _only(g, "FULLY_CONNECTED")
    assert op.attr("keep_num_dims") is True and g.tensors[op.outputs[0]].shape == (1, 5, 7)


def test_pools_default_stride_is_the_window():
    g = _build(lambda b, x: b.max_pool(x, 2))
    op = _only(g, "MAX_POOL_2D")
    assert op.attr_dict == {"stride": (2, 2), "padding": "VALID", "filter": (2, 2),
                            "activation": "NONE"}
    g = _build(lambda b, x: b.avg_pool(x, 3, stride=1, padding="SAME"))
    assert g.tensors[_only(g, "AVERAGE_POOL_2D").outputs[0]].shape == (1, 8, 8, 4)


def test_mean_axes_are_a_constant_int32_input():
    g = _build(lambda b, x: b.mean(x, keep_dims=False))
    op = _only(g, "MEAN")
    axes = _tensor(g, op, 1)
    assert (axes.dtype, axes.shape, axes.value, axes.is_constant) == ("int32", (2,), (1, 2), True)
    assert op.attr("keep_dims") is False and g.tensors[op.outputs[0]].shape == (1, 4)


def test_pad_paddings_shape_4x2():
    for spelling in (((1, 2), (0, 3)), ((0, 0), (1, 2), (0, 3), (0, 0))):
        g = _build(lambda b, x: b.pad(x, spelling))
        pads = _tensor(g, _only(g, "PAD"), 1)
        assert pads.shape == (4, 2) and pads.value == (0, 0, 1, 2, 0, 3, 0, 0)
    g = _build(lambda b, x: b.pad(x, 1))
    assert g.tensors[g.outputs[0]].shape == (1, 10, 10, 4)


def test_split_and_split_v_operands():
    g = _build(lambda b, x: b.split(x, 2))
    op = _only(g, "SPLIT")
    axis = _tensor(g, op, 0)
    assert axis.is_constant and axis.shape == () and axis.value == (3,)
    assert op.attr("num_splits") == 2 and len(op.outputs) == 2
    g = _build(lambda b, x: b.split_v(x, (1, -1), axis=1))
    op = _only(g, "SPLIT_V")
    assert _tensor(g, op, 1).value == (1, 7) and _tensor(g, op, 2).value == (1,)
    assert [g.tensors[t].shape for t in op.outputs] == [(1, 1, 8, 4), (1, 7, 8, 4)]


def test_reshape_transpose_concat_softmax():
    g = _build(lambda b, x: b.softmax(b.transpose(b.reshape(x, (1, 64, -1)), (0, 2, 1)),
                                      beta=0.5))
    assert _tensor(g, _only(g, "RESHAPE"), 1).value == (1, 64, 4)
    assert _tensor(g, _only(g, "TRANSPOSE"), 1).value == (0, 2, 1)
    assert _only(g, "SOFTMAX").attr("beta") == 0.5
    g = _build(lambda b, x: b.concat([x, b.relu6(x)], axis=-1))
    assert _only(g, "CONCATENATION").attr_dict == {"axis": 3, "activation": "NONE"}


def test_swish_is_logistic_then_mul_of_input():
    g = _build(lambda b, x: b.swish(x))
    assert [op.type for op in g.ops] == ["LOGISTIC", "MUL"]
    sig, mul = g.ops
    assert mul.inputs == (g.inputs[0], sig.outputs[0])


@pytest.mark.parametrize("gate,types", [
    ("sigmoid", ["MEAN", "CONV_2D", "CONV_2D", "LOGISTIC", "MUL"]),
    ("hard_sigmoid", ["MEAN", "CONV_2D", "CONV_2D", "ADD", "MUL", "MUL"]),
])
def test_squeeze_excite_ops(gate, types):
    g = _build(lambda b, x: b.squeeze_excite(x, ratio=0.5, gate=gate), (1, 8, 8, 16))
    assert [op.type for op in g.ops] == types
    mean, reduce_, expand = g.ops[:3]
    assert mean.attr("keep_dims") is True
    assert _tensor(g, reduce_, 1).shape == (8, 1, 1, 16) and reduce_.activation == "RELU"
    assert _tensor(g, expand, 1).shape == (16, 1, 1, 8) and expand.activation == "NONE"
    if gate == "hard_sigmoid":
        assert g.ops[3].activation == "RELU6"
    assert g.ops[-1].inputs[0] == g.inputs[0]            # MUL(x, gate)
    assert g.tensors[g.outputs[0]].shape == (1, 8, 8, 16)


def test_relu_fuses_into_the_producer_like_the_converter():
    def net(b, x):
        y = b.relu(b.conv2d(x, 8, 3))             # fused
        z = b.relu6(b.add(y, y))                  # fused into ADD
        t = b.tanh(b.conv2d(z, 8, 1))             # TANH is never fused
        s = b.split(t, 2)
        return [b.relu(s[0]), s[1]]               # SPLIT takes no fused activation
    g = _build(net)
    assert [op.type for op in g.ops] == ["CONV_2D", "ADD", "CONV_2D", "TANH", "SPLIT", "RELU"]
    assert [op.activation for op in g.ops[:3]] == ["RELU", "RELU6", "NONE"]
    b = GraphBuilder(fuse_activations=False)
    b.relu(b.conv2d(b.input((1, 4, 4, 2)), 2, 1))
    assert [op.type for op in b.build().ops] == ["CONV_2D", "RELU"]


def test_no_fusion_when_the_output_has_other_readers():
    def net(b, x):
        y = b.conv2d(x, 4, 1)
        return b.add(b.relu(y), y)
    g = _build(net)
    assert [op.type for op in g.ops] == ["CONV_2D", "RELU", "ADD"]
    g = _build(lambda b, x: [b.conv2d(x, 4, 1), b.relu(b.add(x, x, activation="RELU6"))])
    assert "RELU" in g.op_types()    # the producer already has an activation


def test_dead_ops_are_dropped_and_default_outputs():
    b = GraphBuilder()
    x = b.input((1, 4, 4, 2))
    keep = b.relu6(x)
    b.conv2d(x, 3, 1)                           # reaches no output
    b.output(keep)
    g = b.build()
    assert [op.type for op in g.ops] == ["RELU6"] and len(g.tensors) == 2
    b2 = GraphBuilder()
    x = b2.input((1, 4, 4, 2))
    b2.tanh(x), b2.sigmoid(x)  # unconsumed: both become outputs
    g = b2.build()
    assert [g.tensors[t].name for t in g.outputs] == ["tanh", "sigmoid"]


def test_names_are_unique_and_readable():
    b = GraphBuilder()
    x = b.input((1, 4, 4, 2), name="image")
    y = b.conv2d(b.conv2d(x, 2, 1), 2, 1, name="conv2d")
    y = b.conv2d(y, 2, 1, name="block/conv")
    y = b.hard_swish(b.conv2d(y, 2, 1, name="block/conv"))
    g = b.build()
    names = [t.name for t in g.tensors]
    assert len(set(names)) == len(names)
    assert {"image", "conv2d", "conv2d/filter", "conv2d_1", "conv2d_1/bias", "block/conv",
            "block/conv_1", "hard_swish"} <= set(names)


@pytest.mark.parametrize("call,match", [
    (lambda b, x: b.conv2d(x, 8, 3, groups=3), "groups=3"),
    (lambda b, x: b.conv2d(x, 8, 3, activation="GELU"), "Unknown fused activation"),
    (lambda b, x: b.conv2d(x, 8, 3, padding="same"), "padding"),
    (lambda b, x: b.conv2d(x, 8, 0), "positive"),
    (lambda b, x: b.conv2d(x, 0, 3), "filters must be positive"),
    (lambda b, x: b.conv2d(x, 2.5, 3), "filters must be an int"),
    (lambda b, x: b.fully_connected(x, 0), "units must be positive"),
    (lambda b, x: b.depthwise_conv2d(x, 3, depth_multiplier=0), "depth_multiplier"),
    (lambda b, x: b.conv2d(x, 8, 9, padding="VALID"), "does not fit"),
    (lambda b, x: b.conv2d(b.reshape(x, (1, 64, 4)), 8, 3), "rank-4"),
    (lambda b, x: b.add(x, b.input((1, 3, 8, 4))), "broadcast"),
    (lambda b, x: b.add(x, 99), "not a tensor id"),
    (lambda b, x: b.reshape(x, (3, -1)), "cannot fit"),
    (lambda b, x: b.split(x, 3), "equal parts"),
    (lambda b, x: b.split_v(x, (1, 2)), "add up"),
    (lambda b, x: b.concat([x, b.input((1, 4, 8, 4))]), "matching"),
    (lambda b, x: b.transpose(x, (0, 1, 2)), "permutation"),
    (lambda b, x: b.mean(x, (5,)), "out of range"),
    (lambda b, x: b.pad(x, ((1, -1), (0, 0))), "non-negative"),
    (lambda b, x: b.squeeze_excite(x, gate="swish"), "gate"),
    (lambda b, x: b.input((1, 0, 3)), "positive"),
])
def test_bad_arguments_raise_shape_error(call, match):
    b = GraphBuilder()
    with pytest.raises(ShapeError, match=match):
        call(b, b.input((1, 8, 8, 4)))


_LAYER = st.sampled_from(["conv", "group", "dw", "pool", "se", "swish", "split", "res", "pad"])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_LAYER, st.integers(1, 2), st.sampled_from([1, 3, 5]),
                          st.sampled_from(["SAME", "VALID"])), min_size=1, max_size=8))
def test_random_networks_validate(layers):
    b = GraphBuilder()
    x = b.input((1, 24, 24, 8))
    for kind, stride, k, padding in layers:
        h = b.shape(x)[1]
        if padding == "VALID" and h < k:
            padding = "SAME"
        if kind == "conv":
            x = b.conv2d(x, 8, k, stride=stride, padding=padding, activation="RELU")
        elif kind == "group":
            x = b.conv2d(x, 16, k, groups=4, padding=padding)
        elif kind == "dw":
            x = b.depthwise_conv2d(x, k, stride=stride, padding=padding, activation="RELU6")
        elif kind == "pool":
            x = b.max_pool(x, min(k, h), stride=stride, padding=padding)
        elif kind == "se":
            x = b.squeeze_excite(x)
        elif kind == "swish":
            x = b.swish(x)
        elif kind == "split":
            x = b.concat([b.relu(p) for p in b.split(x, 2)])
        elif kind == "res":
            x = b.relu(b.add(x, b.conv2d(x, b.shape(x)[3], 1)))
        else:
            x = b.pad(x, 1)
    b.output(b.fully_connected(b.mean(x, keep_dims=False), 3))
    g = b.build()
    validate_graph(g)
    assert g.topological_order() == tuple(range(len(g.ops)))
    names = [t.name for t in g.tensors]
    assert len(set(names)) == len(names)


def test_round_trip_through_the_tflite_writer_and_reader():
    from latpred.tflite import read_tflite, write_tflite

    def net(b, x):
        y = b.relu(b.conv2d(x, 8, 3, stride=2))
        y = b.squeeze_excite(b.depthwise_conv2d(y, 3), gate="hard_sigmoid")
        y = b.concat([b.hard_swish(p) for p in b.split_v(b.swish(y), (3, 5))])
        return b.softmax(b.fully_connected(b.reshape(b.mean(b.pad(y, 1)), (1, 8)), 4))
    g = _build(net, (1, 16, 16, 3))
    assert read_tflite(write_tflite(g)) == g
