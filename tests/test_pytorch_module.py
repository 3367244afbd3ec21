"""latpred.pytorch: Graph -> torch module (CPU): shapes, numerics against LiteRT, re-batching."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from latpred import sampler, zoo  # noqa: E402
from latpred.builder import GraphBuilder  # noqa: E402
from latpred.pytorch import UnsupportedOpError, graph_batch, to_torch, with_batch  # noqa: E402

SPACE = "search_space/synthetic_cnn.yaml"


def _run_torch(graph, exact=True, seed=0):
    m = to_torch(graph, exact=exact, seed=seed).eval()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in m.input_shapes()]
    with torch.no_grad():
        y = m(*[torch.from_numpy(x) for x in xs])
    return xs, (y if isinstance(y, tuple) else (y,))


def _run_litert(graph, xs):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    from latpred.tflite import write_tflite

    it = interp.Interpreter(model_content=write_tflite(graph, seed=0))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _rel_err(a, b):
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-9))


def _graphs():
    archs = sampler.sample(SPACE, 6, seed=1)
    return [sampler.build_graph(a) for a in archs] + \
        [zoo.build(n) for n in ("mobilenet_v3_small", "shufflenet_v2_0.5", "squeezenet1_1")]


@pytest.mark.parametrize("index", range(9))
def test_numerics_match_litert(index):
    graph = _graphs()[index]
    xs, ys = _run_torch(graph)
    for t, y in zip(graph.outputs, ys):
        assert tuple(y.shape) == graph.tensors[t].shape
    for ref, y in zip(_run_litert(graph, xs), ys):
        assert _rel_err(ref, y.numpy()) < 1e-4


def _every_op_graph():
    b = GraphBuilder("all-ops", fuse_activations=False)
    x = b.input((1, 16, 16, 8))
    c = b.conv2d(x, 16, 3, stride=2, activation="RELU6")
    g = b.conv2d(c, 16, 3, groups=4, activation="RELU")
    d = b.depthwise_conv2d(g, 5, stride=1, depth_multiplier=2)
    p = b.max_pool(d, 3, stride=1, padding="SAME")
    a = b.avg_pool(p, 3, stride=2, padding="SAME")
    s1, s2 = b.split(a, 2, axis=-1)
    s3, s4 = b.split_v(s2, (4, 12), axis=-1)
    e = b.concat([b.add(s1, b.hard_swish(s1)), b.sub(b.relu(s3), b.tanh(s3)),
                  b.div(b.mul(s4, s4), b.add(b.sigmoid(s4), b.relu6(s4)))], axis=-1)
    e = b.pad(e, ((0, 0), (1, 0), (0, 1), (0, 0)))
    h = b.shape(e)
    r = b.reshape(e, (1, h[1] * h[2], h[3]))
    t = b.transpose(r, (0, 2, 1))
    m = b.mean(b.squeeze_excite(e), axes=(1, 2), keep_dims=False)
    f = b.fully_connected(m, 10, activation="RELU")
    b.output(b.softmax(f), t)
    return b.build()


def test_every_builder_op_runs_and_matches_litert():
    graph = _every_op_graph()
    xs, ys = _run_torch(graph)
    refs = _run_litert(graph, xs)
    for t, y in zip(graph.outputs, ys):
        assert tuple(y.shape) == graph.tensors[t].shape
    assert max(_rel_err(r, y.numpy()) for r, y in zip(refs, ys)) < 1e-4


def test_symmetric_padding_keeps_shapes():
    graph = _every_op_graph()
    _, ys = _run_torch(graph, exact=False, seed=None)
    for t, y in zip(graph.outputs, ys):
        assert tuple(y.shape) == graph.tensors[t].shape


@pytest.mark.parametrize("name", ["shufflenet_v2_0.5", "mobilenet_v2_0.35"])
def test_rebatched_graph_and_module(name):
    graph = zoo.build(name)
    g4 = with_batch(graph, 4)
    assert graph_batch(g4) == 4 and with_batch(graph, 1) is graph
    for t in g4.outputs:
        assert g4.tensors[t].shape[0] == 4
    m = to_torch(graph, batch=4, seed=None).eval()
    with torch.no_grad():
        y = m(*[torch.randn(s) for s in m.input_shapes()])
    assert tuple(y.shape) == g4.tensors[g4.outputs[0]].shape


def test_unsupported_op_is_reported():
    from latpred.graph import Graph, Op, Tensor

    g = Graph((Tensor("x", (1, 4)), Tensor("y", (1, 4))), (Op.make("CUSTOM:foo", (0,), (1,)),),
              (0,), (1,))
    with pytest.raises(UnsupportedOpError, match="CUSTOM:foo"):
        to_torch(g)
