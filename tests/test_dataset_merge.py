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


# -- combine: campaigns of the same models -------------------------------------------------------
def _campaigns(tmp_path, factors):
    """The same simulated models, measured once per factor (each campaign's labels scaled)."""
    out = []
    for i, f in enumerate(factors):
        ds = simdata.simulate(tmp_path / f"c{i}", n_models=6, seed=0)
        models, kernels = ds.models(), ds.kernels()
        ds.replace_table("models", models.assign(latency_ms=models["latency_ms"] * f))
        ds.replace_table("kernels", kernels.assign(latency_ms=kernels["latency_ms"] * f))
        ds.update_manifest(TARGET, noise={"e2e_retest_mdape": float(i)})
        out.append(ds)
    return out


def test_combine_takes_the_median_and_a_split_half_noise(tmp_path):
    import json

    import numpy as np

    runs = _campaigns(tmp_path, [1.00, 1.10, 0.96, 1.02])
    result = CliRunner().invoke(main, ["dataset", "combine", *[str(r.root) for r in runs],
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    combined = Dataset.open(tmp_path / "m")
    base = runs[0].models(TARGET).set_index("model_id")["latency_ms"]
    got = combined.models(TARGET).set_index("model_id")
    # median of (1.00, 1.10, 0.96, 1.02) = 1.01; every campaign's label kept beside it
    assert np.allclose(got["latency_ms"], base[got.index] * 1.01)
    assert (got["n_campaigns"] == 4).all()
    assert np.allclose(json.loads(got["campaign_labels_ms"].iloc[0])[1],
                       base[got.index[0]] * 1.10, rtol=1e-5)
    kb = runs[0].kernels(TARGET).set_index(["model_id", "kernel_index"])["latency_ms"]
    kg = combined.kernels(TARGET).set_index(["model_id", "kernel_index"])["latency_ms"]
    assert np.allclose(kg, kb[kg.index] * 1.01, rtol=1e-6)
    # split half: median(1.00, 0.96) = 0.98 against median(1.10, 1.02) = 1.06
    noise = combined.manifest["targets"][TARGET]["noise"]
    assert noise["e2e_retest_mdape"] == pytest.approx(100 * 0.08 / 1.02, abs=1e-3)
    assert noise["retest"] == "split_half_campaigns" and noise["campaigns"] == 4
    sources = combined.manifest["targets"][TARGET]["combined_from"]
    assert [s["noise"]["e2e_retest_mdape"] for s in sources] == [0.0, 1.0, 2.0, 3.0]


def test_combine_refuses_campaigns_of_other_models_and_a_single_one(tmp_path):
    a = simdata.simulate(tmp_path / "a", n_models=3, seed=0)
    b = simdata.simulate(tmp_path / "b", n_models=3, seed=1)
    result = CliRunner().invoke(main, ["dataset", "combine", str(a.root), str(b.root),
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "share no measured model" in result.output
    assert not (tmp_path / "m" / "manifest.json").exists()
    result = CliRunner().invoke(main, ["dataset", "combine", str(a.root),
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "at least two" in result.output


def test_a_new_campaign_joins_an_old_combination_as_its_campaigns(tmp_path):
    """combine(combine(c0, c1), c2, c3) is combine(c0, c1, c2, c3): the old median is not
    taken as one more campaign, each campaign it kept is."""
    import json

    import numpy as np

    runs = _campaigns(tmp_path, [1.00, 1.10, 0.96, 1.02])
    cli = CliRunner()
    assert cli.invoke(main, ["dataset", "combine", str(runs[0].root), str(runs[1].root),
                             "--out", str(tmp_path / "old")]).exit_code == 0
    result = cli.invoke(main, ["dataset", "combine", str(tmp_path / "old"), str(runs[2].root),
                               str(runs[3].root), "--out", str(tmp_path / "new")])
    assert result.exit_code == 0, result.output
    assert "median of 4 campaigns" in result.output
    assert cli.invoke(main, ["dataset", "combine", *[str(r.root) for r in runs],
                             "--out", str(tmp_path / "all")]).exit_code == 0
    new, direct = Dataset.open(tmp_path / "new"), Dataset.open(tmp_path / "all")
    for table, keys in (("models", ["model_id"]), ("kernels", ["model_id", "kernel_index"])):
        a, b = (getattr(d, table)(TARGET).sort_values(keys).reset_index(drop=True)
                for d in (new, direct))
        assert np.allclose(a["latency_ms"], b["latency_ms"], atol=1e-6)  # kept to 1 ns
        assert (a["n_campaigns"] == 4).all()
        assert ([json.loads(s) for s in a["campaign_labels_ms"]]
                == [json.loads(s) for s in b["campaign_labels_ms"]])
    entry, ref = (d.manifest["targets"][TARGET] for d in (new, direct))
    assert entry["noise"] == pytest.approx(ref["noise"], abs=0.01)
    assert [s["noise"]["e2e_retest_mdape"] for s in entry["combined_from"]] == [0, 1, 2, 3]


def test_combine_refuses_campaigns_of_different_cpus(tmp_path):
    runs = _campaigns(tmp_path, [1.00, 0.70])
    runs[0].update_manifest(TARGET, cpu_id="AuthenticAMD family 25 model 1 stepping 1")
    runs[1].update_manifest(TARGET, cpu_id="AuthenticAMD family 25 model 17 stepping 1")
    result = CliRunner().invoke(main, ["dataset", "combine", str(runs[0].root),
                                       str(runs[1].root), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "different devices" in result.output
    assert not (tmp_path / "m" / "manifest.json").exists()


def test_combine_keeps_each_campaigns_drift_and_refuses_a_later_correction(tmp_path):
    from latpred.errors import DatasetError
    from latpred.profile.drift import drift_correct

    runs = _campaigns(tmp_path, [1.00, 1.04])
    for i, ds in enumerate(runs):
        series = [{"t": 0.0, "ms": 3.7, "models_done": 0, "phase": "start"},
                  {"t": 1e10, "ms": 3.7 + 0.1 * i, "models_done": 6, "phase": "end"}]
        ds.update_manifest(TARGET, drift={"series": series, "range_pct": 2.7 * i})
    result = CliRunner().invoke(main, ["dataset", "combine", *[str(r.root) for r in runs],
                                       "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    entry = Dataset.open(tmp_path / "m").manifest["targets"][TARGET]
    # The first campaign's series would describe the median wrongly: only per-campaign ranges.
    assert "drift" not in entry
    assert [s["drift_range_pct"] for s in entry["combined_from"]] == [0.0, 2.7]
    with pytest.raises(DatasetError, match="before combining"):
        drift_correct(tmp_path / "m", tmp_path / "dc", (TARGET,), 3.7)
