"""`latpred profile` on files from TensorFlow's converter: no flag for a dynamic batch, and
`--input-shape` for dynamic height and width (the file's weights measured at the given shape)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from latpred.cli import main
from latpred.dataset import Dataset
from latpred.tflite import read_tflite
from latpred.tflite.dynamic import with_input_shapes

FIXTURES = Path(__file__).parent / "fixtures"
TARGET = "host/cpu/fp32/t1"


def _profile(out: Path, models: Path, *extra: str):
    return CliRunner().invoke(main, ["profile", "--target", TARGET, "--out", str(out),
                                     "--retest", "0", "--batch-size", "2", "--no-realtime",
                                     *extra, str(models)])


def test_with_input_shapes_fixes_only_the_inputs():
    data = (FIXTURES / "small_cnn_dynamic_hw.tflite").read_bytes()
    patched = with_input_shapes(data, (1, 48, 48, 3))
    assert len(patched) == len(data)
    g = read_tflite(patched)   # no input_shapes needed any more
    assert g.tensors[g.inputs[0]].shape == (1, 48, 48, 3)
    assert g.tensors[g.ops[0].outputs[0]].shape == (1, 48, 48, 8)


def test_profile_converter_files(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(FIXTURES / "corpus" / "fx_mobilenet_v3_small_0.35_96.tflite", models)
    result = _profile(tmp_path / "ds", models)
    assert result.exit_code == 0, result.output
    rows = Dataset.open(tmp_path / "ds").models(TARGET)
    assert list(rows["status"]) == ["ok"] and rows["latency_ms"].iloc[0] > 0


def test_profile_dynamic_spatial_needs_and_uses_input_shape(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(FIXTURES / "small_cnn_dynamic_hw.tflite", models)
    refused = _profile(tmp_path / "refused", models)
    assert refused.exit_code == 0   # an unreadable model is a failed row, the run goes on
    failed = Dataset.open(tmp_path / "refused").models(TARGET)
    assert list(failed["status"]) == ["failed"] and "--input-shape" in failed["error"].iloc[0]
    small = _profile(tmp_path / "small", models, "--input-shape", "1x32x32x3")
    large = _profile(tmp_path / "large", models, "--input-shape", "1x128x128x3")
    assert small.exit_code == 0 and large.exit_code == 0, small.output + large.output
    ms = [Dataset.open(tmp_path / d).models(TARGET)["latency_ms"].iloc[0] for d in ("small", "large")]
    assert ms[1] > 4 * ms[0]   # 16x the pixels: the shape really reached the runtime
    kernels = Dataset.open(tmp_path / "large").kernels(TARGET)
    assert isinstance(kernels, pd.DataFrame) and (kernels["status"] == "ok").all()
