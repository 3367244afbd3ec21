"""`latpred dataset merge`: several datasets (spaces) become one training set, nothing lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from latpred.cli import main
from latpred.dataset import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simdata  # noqa: E402

TARGET = "host/cpu/fp32/t1"


def test_merge_keeps_every_row_and_each_sources_noise(tmp_path):
    a = simdata.simulate(tmp_path / "a", n_models=6, seed=0)
    b = simdata.simulate(tmp_path / "b", n_models=5, seed=1)
    a.update_manifest(TARGET, noise={"e2e_retest_mdape": 1.0})
    b.update_manifest(TARGET, noise={"e2e_retest_mdape": 2.0})
    # Same space and index but another seed: different model ids.
    result = CliRunner().invoke(main, ["dataset", "merge", str(a.root), str(b.root),
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    merged = Dataset.open(tmp_path / "m")
    assert len(merged.models(TARGET)) == 11
    assert len(merged.kernels(TARGET)) == len(a.kernels(TARGET)) + len(b.kernels(TARGET))
    entry = merged.manifest["targets"][TARGET]
    assert [p["noise"]["e2e_retest_mdape"] for p in entry["merged_from"]] == [1.0, 2.0]


def test_merge_refuses_the_same_models_twice(tmp_path):
    a = simdata.simulate(tmp_path / "a", n_models=3, seed=0)
    b = simdata.simulate(tmp_path / "b", n_models=3, seed=0)
    result = CliRunner().invoke(main, ["dataset", "merge", str(a.root), str(b.root),
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "in both" in result.output
    assert not (tmp_path / "m" / "manifest.json").exists()


def test_merge_needs_two(tmp_path):
    from latpred.dataset_merge import merge_datasets
    from latpred.errors import DatasetError

    a = simdata.simulate(tmp_path / "a", n_models=2, seed=0)
    with pytest.raises(DatasetError):
        merge_datasets([a.root], tmp_path / "m")
