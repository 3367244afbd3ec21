"""int8 on the host CPU: quantized ops the XNNPACK delegate declines are TFLite builtin kernels
(latpred/deduce/xnnpack_int8.py), from a float graph deduced for int8 and from the int8 graph."""

from __future__ import annotations

import dataclasses

from latpred.builder import GraphBuilder
from latpred.deduce import deduce
from latpred.features import FEATURES, kernel_features
from latpred.graph import Graph, Quantization

INT8, FP32 = "host/cpu/int8/t2", "host/cpu/fp32/t2"


def _graph() -> Graph:
    b = GraphBuilder("int8 rules")
    x = b.conv2d(b.input((1, 16, 16, 8)), 16, 3)
    x = b.hard_swish(b.relu6(b.relu(x)))                      # RELU fuses into the conv
    x = b.max_pool(b.avg_pool(x, 2, stride=1), 1, stride=2)   # 1x1 filter, stride 2
    x = b.max_pool(x, 3, stride=2, padding="SAME")             # XNNPACK takes this one
    a, c = b.split_v(x, (4, 12))
    x = b.concat([b.sigmoid(a), b.tanh(c)])
    x = b.mul(x, b.add(x, x))
    x = b.mean(x, keep_dims=False)
    b.output(b.softmax(b.fully_connected(x, 10)))
    return b.build()


EXPECTED = ["conv2d", "builtin_activation", "builtin_activation", "builtin_pool",
            "builtin_pool", "pool", "builtin_split", "activation", "activation", "concat", "elementwise", "elementwise", "mean", "fc", "builtin_softmax"]


def test_declined_int8_ops_are_single_threaded_builtin_kernels():
    g = _graph()
    kernels = deduce(g, INT8)
    assert [k.type for k in kernels] == EXPECTED
    for k in kernels:
        builtin = k.type.startswith("builtin_")
        assert k.multithreaded is not builtin
        assert ("XNNPACK declines it" in k.rule) is builtin
    assert "CheckPoolingParams" in kernels[4].rule and "float tensors only" in kernels[1].rule
    # fp32 keeps XNNPACK's types (the datasets measured so far were grouped that way)
    assert not any(k.type.startswith("builtin_") for k in deduce(g, FP32))


def test_a_builtin_kernel_has_its_base_types_features():
    g = _graph()
    k = deduce(g, INT8)[3]
    f = kernel_features(g, k, INT8)
    assert FEATURES["builtin_pool"] == FEATURES["pool"] and set(FEATURES["pool"]) <= set(f)
    assert f == kernel_features(g, dataclasses.replace(k, type="pool"), INT8)


def test_the_quantized_graph_decides_by_its_tensors_and_scales():
    g = _graph()
    tensors = list(g.tensors)
    for i, t in enumerate(tensors):
        if t.dtype == "float32" and not t.is_constant:
            tensors[i] = dataclasses.replace(t, dtype="int8",
                                             quantization=Quantization((0.1,), (0,)))
    q = dataclasses.replace(g, tensors=tuple(tensors))
    # int8 tensors decide, whatever the target's precision says
    assert [k.type for k in deduce(q, FP32)] == EXPECTED
    # ADD: input scale / output scale must lie in [1/1024, 256) (VisitBinaryNode)
    add = next(i for i, op in enumerate(q.ops) if op.type == "ADD")
    out = q.ops[add].outputs[0]
    tensors[out] = dataclasses.replace(tensors[out], quantization=Quantization((1e-5,), (0,)))
    q2 = dataclasses.replace(q, tensors=tuple(tensors))
    kernels = deduce(q2, INT8)
    assert kernels[add].type == "builtin_elementwise" and "scale" in kernels[add].rule
    # a per-channel quantized activation is declined too
    x = q.ops[0].outputs[0]
    per_channel = Quantization((0.1,) * 16, (0,) * 16, 3)
    tensors[x] = dataclasses.replace(tensors[x], quantization=per_channel)
    kernels = deduce(dataclasses.replace(q, tensors=tuple(tensors)), INT8)
    assert kernels[0].type == "builtin_conv2d" and "per-channel" in kernels[0].rule


def test_a_declined_convolution_keeps_its_pad_apart():
    b = GraphBuilder()
    p = b.pad(b.input((1, 8, 8, 4)), 1)
    y = b.conv2d(p, 4, 3, padding="VALID")
    g = b.build()
    assert [k.type for k in deduce(g, INT8)] == ["conv2d"]          # folded (xnn_subgraph_fusion)
    conv = g.ops[1]
    tanh = dataclasses.replace(conv, attrs=tuple((k, "TANH" if k == "activation" else v)
                                                 for k, v in conv.attrs))
    g2 = dataclasses.replace(g, ops=(g.ops[0], tanh))
    assert y == g2.ops[1].outputs[0]
    assert [k.type for k in deduce(g2, INT8)] == ["pad", "builtin_conv2d"]


def _lookup_graph() -> Graph:
    b = GraphBuilder("int8 lookups")
    x = b.swish(b.conv2d(b.input((1, 16, 16, 8)), 16, 3))             # LOGISTIC, MUL: one
    x = b.squeeze_excite(x)                                           # its gate stays alone
    x = b.squeeze_excite(x, gate="hard_sigmoid")                      # ADD(3), MUL(1/6): one
    y = b.swish(x)
    b.output(b.add(y, b.swish(x)))   # x feeds two chains; each swish output is one value
    return b.build()


def test_an_int8_element_wise_chain_is_one_table_lookup():
    g = _lookup_graph()
    kernels = deduce(g, INT8)
    chains = [tuple(g.ops[i].type for i in k.ops) for k in kernels if len(k.ops) > 1]
    assert chains == [("LOGISTIC", "MUL"), ("ADD", "MUL"), ("LOGISTIC", "MUL"),
                      ("LOGISTIC", "MUL")]
    assert all(k.type == "activation" and k.multithreaded and "table lookup" in k.rule
               for k in kernels if len(k.ops) > 1)
    gates = [k for k in kernels if len(k.ops) == 1 and g.ops[k.main_op].type == "LOGISTIC"]
    assert len(gates) == 1   # the sigmoid gate's MUL takes the features too: no chain
    covered = sorted(i for k in kernels for i in k.ops)
    assert covered == list(range(len(g.ops)))   # every op in exactly one kernel
    # float targets run each op alone (the pass wants 8-bit values)
    assert all(len(k.ops) == 1 for k in deduce(g, FP32))
    # described as the 8-bit sigmoid the training sets measure: the same lookup kernel
    hard = next(k for k in kernels if g.ops[k.main_op].type == "ADD" and len(k.ops) > 1)
    sig = next(k for k in kernels if len(k.ops) > 1)
    f, f_sig = kernel_features(g, hard, INT8), kernel_features(g, sig, INT8)
    assert f["op_code"] == f_sig["op_code"] and f["param_bytes"] == 0
    assert f["bytes_read"] == f["bytes_written"]   # its input, not the scalar too


def test_a_builtin_activation_is_priced_per_element_not_by_its_shape():
    """TFLite's own 8-bit activations loop over the flat size: their columns are the base
    type's without the shape's dims. Measured (the third VM's int8 sets): a Lasso of 30
    synthetic models' builtin activations (at most 160 channels) prices MobileNetV3's 40 zoo
    ones (up to 1x1x1280) within 15% per kernel (4.3%); with the dims as terms, 151%."""
    from pathlib import Path

    import numpy as np

    from latpred.predictors.search import load_search
    from latpred.predictors.training import FEATURE_PREFIX, fit_type, load_tables

    assert not {"input_h", "input_w", "input_c"} & set(FEATURES["builtin_activation"])
    assert set(FEATURES["builtin_activation"]) < set(FEATURES["activation"])
    root = Path(__file__).resolve().parent.parent / "datasets"
    target = "host/cpu/int8/t1"
    k, m = load_tables(root / "host-cpu-int8-synthetic-vm3-combined", target)
    zoo, _ = load_tables(root / "host-cpu-int8-zoo-vm3-combined", target)
    few = k[(k["kernel_type"] == "builtin_activation")
            & k["model_id"].isin(sorted(m["model_id"])[:30])]
    rows = zoo[zoo["kernel_type"] == "builtin_activation"]
    assert len(rows) == 40 and rows["f_input_c"].max() > 4 * few["f_input_c"].max()
    fit = fit_type("builtin_activation", few, load_search("lasso", "latpred"), 0)
    pred = fit.regressor.predict(rows[[FEATURE_PREFIX + c for c in fit.features]].to_numpy(float))
    y = rows["latency_ms"].to_numpy()
    assert np.mean(np.abs(pred - y) / y) < 0.15
