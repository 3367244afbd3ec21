"""LatencyModel.predict / predict_many on torch modules, ExportedPrograms and .pt2 files, and
`latpred predict model.pt2` on the command line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from latpred import from_torch
from latpred.cli import main
from latpred.errors import LatpredError
from latpred.predictors import LatencyModel
from latpred.predictors.search import SearchSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simdata  # noqa: E402
import test_from_torch_nets as nets  # noqa: E402

torch.set_num_threads(1)
TARGET = "host/cpu/fp32/t1"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    ds = simdata.simulate(tmp_path_factory.mktemp("sim") / "ds", n_models=30, seed=5)
    spec = SearchSpec("gbdt", "t", method="none", fixed={"base": "lasso"})
    return LatencyModel.fit(ds, TARGET, family="gbdt", search=spec)


def test_predict_module_equals_predicting_its_graph(model):
    m, x = nets.MobileNetV2(10, 0.35).eval(), torch.randn(1, 3, 64, 64)
    g = from_torch(m, x)
    a = model.predict(m, example_inputs=x, allow_fallback=True)
    b = model.predict(g, allow_fallback=True)
    assert a.total_ms == pytest.approx(b.total_ms) and a.total_ms > 0
    ep = torch.export.export(m, (x,))
    many = model.predict_many([m, ep, g], example_inputs=x, allow_fallback=True)
    assert np.allclose([p.total_ms for p in many], b.total_ms)


def test_module_without_example_inputs_is_a_clear_error(model):
    with pytest.raises(LatpredError, match="needs example_inputs="):
        model.predict(nets.ResNet18(10, width=8), allow_fallback=True)
    with pytest.raises(LatpredError, match="Cannot predict a int"):
        model.predict(3)


def test_cli_predicts_a_pt2_file(model, tmp_path):
    m, x = nets.ShuffleNetV2(10, (24, 48, 96, 192, 256)).eval(), torch.randn(1, 3, 64, 64)
    path = tmp_path / "shuffle.pt2"
    torch.export.save(torch.export.export(m, (x,)), str(path))
    model.save(tmp_path / "p")
    res = CliRunner().invoke(main, ["predict", "--predictor", str(tmp_path / "p"),
                                    "--allow-fallback", str(path)])
    assert res.exit_code == 0, res.output
    want = model.predict(from_torch(m, x), allow_fallback=True).total_ms
    assert f"{want:.3f}" in res.output
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    res = CliRunner().invoke(main, ["predict", "--predictor", str(tmp_path / "p"), str(bad)])
    assert res.exit_code == 2 and "not a torch.export program" in res.output
