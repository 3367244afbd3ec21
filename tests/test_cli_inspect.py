"""`latpred inspect`: tables, JSON, kernels for a target, metadata, and bad input -> exit 2."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from latpred.builder import GraphBuilder
from latpred.cli import main
from latpred.tflite import write_tflite

FIXTURES = Path(__file__).parent / "fixtures"


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_json_lists_every_operation_with_flops_and_params():
    result = run("inspect", str(FIXTURES / "small_cnn.tflite"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    ops = report["operations"]
    assert [op["index"] for op in ops] == list(range(len(ops)))
    conv = next(op for op in ops if op["type"] == "CONV_2D")
    assert conv["flops"] > 0 and conv["params"] > 0
    assert report["totals"]["operations"] == len(ops)
    assert report["totals"]["flops"] == sum(op["flops"] for op in ops)


def test_flops_and_params_of_a_known_convolution(tmp_path):
    b = GraphBuilder()
    x = b.input((1, 8, 8, 4))
    b.output(b.conv2d(x, 16, 3))
    path = tmp_path / "conv.tflite"
    write_tflite(b.build(), path)
    report = json.loads(run("inspect", str(path), "--json").output)
    (conv,) = report["operations"]
    assert conv["params"] == 16 * 3 * 3 * 4 + 16          # weights + bias
    # 8x8x16 outputs, each 3*3*4 multiply-adds (2 FLOPs) plus one bias add
    assert conv["flops"] == 8 * 8 * 16 * (3 * 3 * 4 * 2 + 1)
    assert conv["inputs"] == [[1, 8, 8, 4]] and conv["outputs"] == [[1, 8, 8, 16]]


def test_table_and_kernels_for_a_gpu_target():
    result = run("inspect", str(FIXTURES / "mbv2_block.tflite"), "--target", "galaxys10/gpu/fp16")
    assert result.exit_code == 0, result.output
    assert "kernels on galaxys10/gpu/fp16" in result.output
    assert "runs entirely on the GPU" in result.output


def test_kernels_in_json_name_their_rule():
    result = run("inspect", str(FIXTURES / "mbv2_block.tflite"), "--target", "pixel4/gpu/fp16",
                 "--json")
    report = json.loads(result.output)
    assert report["kernels"] and all(k["rule"] for k in report["kernels"])
    covered = sorted(i for k in report["kernels"] for i in {int(o.split(":")[0]) for o in k["ops"]})
    assert set(covered) == set(range(len(report["operations"])))


def test_metadata_without_the_optional_package_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tflite_support(name, *args, **kwargs):
        if name.startswith("tflite_support"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tflite_support)
    result = run("inspect", str(FIXTURES / "small_cnn.tflite"), "--metadata")
    assert result.exit_code == 0, result.output
    assert "pip install 'latpred[metadata]'" in result.output


@pytest.mark.parametrize("args, message", [
    (("inspect", "/no/such/model.tflite"), "does not exist"),
    (("inspect", __file__), "not a TFLite model"),
    (("inspect", str(FIXTURES / "small_cnn.tflite"), "--target", "nosuchphone/gpu/fp16"), "pixel4"),
    # a converter file the GPU delegate refuses (its Keras Reshape gets its shape at run time)
    (("inspect", str(FIXTURES / "corpus" / "fx_efficientnet_tiny_96.tflite"), "--target",
      "pixel4/gpu/fp16"), "free batch size"),
    (("inspect", str(FIXTURES / "corpus" / "fx_efficientnet_tiny_96.tflite"), "--memory",
      "--target", "h100/gpu/fp16"), "free batch size"),
])
def test_bad_input_is_one_sentence_and_exit_code_2(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_converter_dynamic_batch_needs_no_flag():
    result = run("inspect", str(FIXTURES / "small_cnn_dynamic.tflite"), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["totals"]["inputs"] == [[1, 32, 32, 3]]


def test_dynamic_spatial_input_is_one_sentence_then_works_with_input_shape():
    path = str(FIXTURES / "small_cnn_dynamic_hw.tflite")
    refused = run("inspect", path)
    assert refused.exit_code == 2
    assert refused.output.count("\n") == 1 and "--input-shape" in refused.output
    assert "Traceback" not in refused.output
    for spec in ("1x96x96x3", "serving_default_image:0=1x96x96x3"):
        result = run("inspect", path, "--json", "--input-shape", spec)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["totals"]["inputs"] == [[1, 96, 96, 3]]
    bad = run("inspect", path, "--input-shape", "1x96")
    assert bad.exit_code == 2 and "does not fit" in bad.output
