"""`latpred inspect --memory`: the per-op table names the op that sets the arena's peak."""

import json

from click.testing import CliRunner

from latpred.builder import GraphBuilder
from latpred.cli import main
from latpred.tflite import write_tflite


def _model(tmp_path):
    b = GraphBuilder()
    x = b.input((1, 8, 8, 4))
    y = b.conv2d(x, 4, 3)
    b.output(b.mean(y))
    path = tmp_path / "conv_mean.tflite"
    write_tflite(b.build(), path)
    return path


def test_inspect_memory_json(tmp_path):
    path = _model(tmp_path)
    out = CliRunner().invoke(main, ["inspect", str(path), "--memory", "--memory-kernels",
                                    "builtin", "--json"])
    assert out.exit_code == 0, out.output
    mem = json.loads(out.output)["memory"]
    assert mem["breakdown"]["arena"] == 11264            # tests/test_memory.py, by hand
    assert mem["breakdown"]["model_bytes"] == path.stat().st_size
    assert [op["sets_peak"] for op in mem["ops"]] == [True, False]
    assert mem["peak_op"] == 0


def test_inspect_memory_table_and_bad_target(tmp_path):
    path = _model(tmp_path)
    out = CliRunner().invoke(main, ["inspect", str(path), "--memory"])
    assert out.exit_code == 0, out.output
    assert "Activation memory peaks at op 0" in out.output and "memory per op" in out.output
    bad = CliRunner().invoke(main, ["inspect", str(path), "--memory", "--target",
                                    "pixel4/gpu/fp16"])
    assert bad.exit_code == 2 and "error:" in bad.output
