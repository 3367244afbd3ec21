"""The real-world zoo: published figures, converter-style graphs, LiteRT, deduction, CLI.

The whole zoo written and run under LiteRT is a slow test: `LATPRED_SLOW=1 pytest -m slow
tests/test_zoo.py` (about 30 s on 2 cores).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

from latpred.cli import main
from latpred.deduce import deduce
from latpred.graph_checks import validate_graph
from latpred.tflite import read_tflite, write_tflite
from latpred.zoo import ZOO, UnknownModelError, build, get, mac_count, param_count
from latpred.zoo.common import make_divisible

NAMES = sorted(ZOO)
PUBLISHED = [n for n in NAMES if ZOO[n].params is not None]
WITH_MACS = [n for n in NAMES if ZOO[n].macs is not None]
REQUIRED_FAMILIES = {"mobilenet_v1", "mobilenet_v2", "mobilenet_v3", "mnasnet", "efficientnet",
                     "shufflenet_v2", "squeezenet", "resnet", "ghostnet", "fbnet", "proxylessnas",
                     "regnet", "densenet"}


@pytest.fixture(scope="module")
def graphs():
    return {n: build(n) for n in NAMES}


def test_registry_covers_the_brief():
    assert len(PUBLISHED) >= 30
    assert REQUIRED_FAMILIES <= {e.family for e in ZOO.values()}
    assert {"resnet18", "resnet34", "mobilenet_v3_large", "mobilenet_v3_small",
            "efficientnet_b0", "efficientnet_b1"} <= set(NAMES)
    assert sum(e.family == "mobilenet_v1" for e in ZOO.values()) >= 3
    assert sum(e.family == "mobilenet_v2" for e in ZOO.values()) >= 3
    for e in ZOO.values():
        assert e.params is None or e.source, e.name          # every figure is cited
        assert e.params is not None or e.note, e.name        # or its absence explained
        assert e.tolerance == 0.02 or e.note, e.name         # wider tolerance needs a reason


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameters_match_published(name):
    e = ZOO[name]
    assert e.reference_params() == pytest.approx(e.params, rel=e.tolerance)


@pytest.mark.parametrize("name", WITH_MACS)
def test_macs_match_published(name, graphs):
    e = ZOO[name]
    assert mac_count(graphs[name]) == pytest.approx(e.macs, rel=e.tolerance)


def test_under_18m_parameters_except_resnet34(graphs):
    big = {n for n, g in graphs.items() if param_count(g) > 18e6}
    assert big == {"resnet34"}


@pytest.mark.parametrize("name", NAMES)
def test_graph_is_valid_and_converter_shaped(name, graphs):
    g = graphs[name]
    validate_graph(g)
    x = g.tensors[g.inputs[0]]
    assert x.shape[0] == 1 and x.shape[3] == 3 and x.shape[1] in (224, 240)
    assert [g.tensors[t].shape for t in g.outputs] == [(1, 1000)]
    types = [op.type for op in g.ops]
    assert types[-1] == "SOFTMAX"
    # ReLU/ReLU6 are fused into their producer, never standalone after a conv.
    producers = {t: op for op in g.ops for t in op.outputs}
    for op in g.ops:
        if op.type in ("RELU", "RELU6"):
            assert producers[op.inputs[0]].type not in ("CONV_2D", "DEPTHWISE_CONV_2D")


def test_family_specific_ops(graphs):
    assert {"RESHAPE", "TRANSPOSE", "SPLIT"} <= set(graphs["shufflenet_v2_1.0"].op_types())
    assert "HARD_SWISH" in graphs["mobilenet_v3_large"].op_types()
    assert "LOGISTIC" in graphs["efficientnet_b0"].op_types()        # swish = LOGISTIC + MUL
    assert "HARD_SWISH" not in graphs["efficientnet_lite0"].op_types()
    grouped = [op for op in graphs["regnet_x_400mf"].ops if op.attr("groups", 1) > 1]
    assert grouped and all(op.type == "CONV_2D" for op in grouped)
    assert graphs["mobilenet_v1_1.0"].op_types().get("DEPTHWISE_CONV_2D") == 13


def test_knobs_change_the_graph():
    base = param_count(build("resnet18"))
    assert param_count(build("resnet18", width=0.5)) < base
    assert param_count(build("resnet18", layers=34)) > base
    g = build("mobilenet_v2_1.0", resolution=160)
    assert g.tensors[g.inputs[0]].shape == (1, 160, 160, 3)
    assert len(build("mobilenet_v2_1.0", depth=2.0).ops) > len(build("mobilenet_v2_1.0").ops)
    assert mac_count(build("efficientnet_b0", width=1.2)) > mac_count(build("efficientnet_b0"))


def test_make_divisible_rounds_like_torchvision():
    assert make_divisible(32 * 0.35) == 16
    assert make_divisible(1280 * 1.4) == 1792
    assert make_divisible(18, 4) == 20       # GhostNet SE: nearest multiple, ties up
    assert make_divisible(9.0) == 16         # never more than 10% below the request


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownModelError, match="mobilenet_v2_1.0"):
        get("mobilenetv2_1.0")


@pytest.mark.parametrize("name,precision", [("mobilenet_v1_0.25", "fp32"),
                                            ("shufflenet_v2_0.5", "fp32"),
                                            ("mobilenet_v3_small", "int8")])
def test_litert_runs_written_model(name, precision, tmp_path):
    _run_litert(name, precision, tmp_path)


@pytest.mark.parametrize("target", ["pixel4/gpu/fp16", "host/cpu/fp32/t1"])
def test_deduce_covers_every_op(target, graphs):
    for name, g in graphs.items():
        kernels = deduce(g, target)
        covered = sorted(i for k in kernels for i in k.ops)
        assert sorted(set(covered)) == list(range(len(g.ops))), name


def test_cli_list_and_export(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["zoo", "list"])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert len(lines) == len(ZOO) + 1 and "MFLOPs" in lines[0]
    row = next(line for line in lines if line.startswith("mobilenet_v2_1.0 "))
    assert f"{param_count(build('mobilenet_v2_1.0')):,d}" in row
    out = tmp_path / "m.tflite"
    r = runner.invoke(main, ["zoo", "export", "squeezenet1_1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert len(read_tflite(out.read_bytes()).ops) == len(build("squeezenet1_1").ops)
    r = runner.invoke(main, ["zoo", "export", "resnet-18", "--out", str(out)])
    assert r.exit_code == 2 and "resnet18" in r.output


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LATPRED_SLOW"), reason="set LATPRED_SLOW=1")
@pytest.mark.parametrize("name", NAMES)
def test_litert_runs_every_zoo_model(name, tmp_path):
    _run_litert(name, "fp32", tmp_path)


def _run_litert(name: str, precision: str, tmp_path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    path = tmp_path / f"{name}.tflite"
    write_tflite(build(name), path, precision=precision)
    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    data = np.random.default_rng(0).random(inp["shape"], dtype=np.float32)
    if precision == "int8":
        scale, zero = inp["quantization"]
        data = np.clip(np.round(data / scale + zero), -128, 127).astype(inp["dtype"])
    it.set_tensor(inp["index"], data)
    it.invoke()
    y = it.get_tensor(out["index"])
    assert y.shape == (1, 1000)
    if precision == "fp32":
        assert y.sum() == pytest.approx(1.0, rel=1e-3)


def test_zoo_arch_rebuilds_the_same_graph_through_the_sampler(tmp_path):
    import json

    from latpred.sampler import build_graph
    from latpred.zoo import arch, build, write_models

    assert build_graph(arch("mobilenet_v2_0.35")) == build("mobilenet_v2_0.35")
    (path,) = write_models(tmp_path, ["squeezenet1_1"])
    meta = json.loads((tmp_path / "squeezenet1_1.json").read_text())
    assert meta["model_id"] == "squeezenet1_1" and path.endswith("squeezenet1_1.tflite")
    assert build_graph(meta) == build("squeezenet1_1")
