"""What LiteRT's GPU accelerator on the H100 would not run, against what latpred refuses.

Every model of the measured GPU datasets either ran or failed, and latpred must refuse exactly
the ones that failed (`latpred.deduce.gpu`): the delegate not applied to a graph with run-time
shapes (compile status 3), ops left for the CPU with the GPU alone (status 504), and the crash
on grouped convolutions split into groups of more than 4 input channels (SIGILL).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from latpred.deduce import deduce
from latpred.errors import DelegateRefusedError
from latpred.sampler import load_space
from latpred.sampler.build import build_graph
from latpred.sampler.draw import sample_one
from latpred.tflite import read_tflite, write_tflite
from latpred.zoo import build

ROOT = Path(__file__).resolve().parents[1]


def refusal(graph, target: str) -> str:
    try:
        deduce(graph, target)
    except DelegateRefusedError as e:
        return str(e)
    return ""


def test_the_zoo_models_that_did_not_compile_are_refused():
    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-zoo" / "models.parquet")
    for r in runs.itertuples():
        why = refusal(build(r.model_id), r.target)
        assert bool(why) == (r.status == "failed"), (r.model_id, why, r.error)
        if why:
            assert "left for the CPU" in why
    assert (runs.status == "failed").sum() == 4      # the four ShuffleNetV2


def test_the_synthetic_models_that_crashed_are_refused():
    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-synthetic" / "models.parquet")
    crashed = 0
    for r in runs.itertuples():
        why = refusal(build_graph(json.loads(r.arch)), r.target)
        assert bool(why) == (r.status == "failed"), (r.model_id, why, r.error)
        if why:
            assert "SIGILL" in r.error and "crashes" in why
            crashed += 1
    assert crashed == 33


@pytest.mark.parametrize("seed", [0, 1])
def test_the_converter_models_that_did_not_compile_are_refused(seed):
    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-memory" / "models.parquet")
    runs = runs[runs.model.str.startswith(f"converter_cnn-s{seed}-")]
    space = load_space(ROOT / "search_space" / "converter_cnn.yaml")
    assert len(runs) > 0
    for r in runs.itertuples():
        index = int(r.model.rsplit("-", 1)[1])
        weights_seed = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        data = write_tflite(build_graph(sample_one(space, seed, index)), None, "fp32",
                            seed=weights_seed)   # as `write_samples` wrote the file measured
        assert hashlib.sha256(data).hexdigest() == r.sha256, r.model
        why = refusal(read_tflite(data), f"h100/gpu/{r.precision}")
        assert bool(why) == bool(r.error), (r.model, why, r.error)
        if why:
            assert "status 3" in r.error and "free batch size" in why


def test_the_grouped_probes_that_crashed_are_refused():
    """Run 4 of datasets/h100-gpu-memory: 24 split grouped convolutions with 5 to 8 input
    channels a group, each alone in a process, all died with SIGILL (exit code -4); the 690
    with 1 to 4 compiled."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_memory_campaign as campaign

    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-memory" / "models.parquet")
    runs = runs[runs.source == "group_probe"].set_index("model")
    graphs = dict(campaign.probe_graphs_groups() + campaign.probe_graphs_crash())
    assert len(runs) == len(graphs) == 714
    for name, graph in sorted(graphs.items())[::3]:
        why = refusal(graph, "h100/gpu/fp16")
        assert bool(why) == (runs.loc[name, "error"] == "exit code -4"), (name, why)


def test_the_first_op_shaped_at_run_time():
    from latpred.builder import GraphBuilder
    from latpred.deduce.prepare import first_run_time_shape

    b = GraphBuilder("static")
    x = b.input((1, 8, 8, 16))
    b.output(b.reshape(b.mean(x), (1, 1, 1, 16)))      # a stored new shape
    assert first_run_time_shape(b.build()) is None
    b = GraphBuilder("dynamic")
    x = b.input((1, 8, 8, 16))
    b.output(b.dynamic_reshape(b.mean(x, keep_dims=False), (1, 1, 1, 16)))
    g = b.build()
    stop = first_run_time_shape(g)
    assert g.ops[stop].type == "RESHAPE" and stop == len(g.ops) - 1
    for target in ("pixel4/gpu/fp16", "h100/gpu/fp32"):
        assert "free batch size" in refusal(g, target)
    assert refusal(g, "host/cpu/fp32/t1") == ""              # XNNPACK allows dynamic tensors


def test_convolutions_without_a_bias_are_refused_where_litert_did_not_run_them(tmp_path):
    # run 7's probes without a bias: LiteRT's GPU accelerator did not compile the 1x1
    # CONV_2Ds (status 3) and ran the fully-connected layers; TFLite's CPU kernel refuses such
    # a CONV_2D at Prepare; PyTorch runs it
    import sys

    from click.testing import CliRunner

    from latpred.cli import main
    from latpred.errors import UnsupportedModelError

    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_memory_campaign as campaign

    probes = dict(campaign.probe_graphs_winograd())
    runs = pd.read_parquet(ROOT / "datasets" / "h100-gpu-memory" / "models.parquet")
    runs = runs[runs.model.str.contains("nb_")]
    assert len(runs) == 16 and (runs.error != "").sum() == 8
    for r in runs.itertuples():
        said = refusal(probes[r.model], f"h100/gpu/{r.precision}")
        assert bool(said) == (r.error != ""), r.model
        assert not said or "no bias tensor" in said
    conv = probes["smallnb_2_64_10"]
    with pytest.raises(UnsupportedModelError, match="conv.cc Prepare"):
        deduce(conv, "host/cpu/fp32/t1")
    assert deduce(conv, "h100/cuda/fp16")
    # a DEPTHWISE_CONV_2D with two inputs runs, on a builtin kernel latpred has not measured
    dw = build("mobilenet_v2_1.0")
    k = next(i for i, op in enumerate(dw.ops) if op.type == "DEPTHWISE_CONV_2D")
    ops = list(dw.ops)
    ops[k] = type(ops[k])(ops[k].type, ops[k].inputs[:2], ops[k].outputs, ops[k].attrs)
    dw = type(dw)(dw.tensors, tuple(ops), dw.inputs, dw.outputs, dw.name)
    with pytest.raises(UnsupportedModelError, match="builtin kernel"):
        deduce(dw, "host/cpu/fp32/t1")
    path = tmp_path / "nobias.tflite"
    write_tflite(conv, path)
    res = CliRunner().invoke(main, ["inspect", str(path), "--target", "host/cpu/fp32/t1"])
    assert res.exit_code == 2 and "no bias tensor" in res.output
    assert "Traceback" not in res.output
