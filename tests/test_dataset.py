"""The dataset store: format, validation, atomic appends, resume, compaction."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from latpred.dataset import KERNEL_COLUMNS, MODEL_COLUMNS, Dataset, LatencyStats
from latpred.errors import DatasetError

T1, T2 = "host/cpu/fp32/t1", "host/cpu/int8/t1"


def model_rows(ids, target=T1, latency=1.0, status="ok") -> pd.DataFrame:
    return pd.DataFrame({
        "model_id": list(ids), "space": "synthetic_cnn", "seed": [i for i, _ in enumerate(ids)],
        "arch": ['{"blocks": []}'] * len(ids), "file_hash": ["ab" * 32] * len(ids),
        "target": target, "status": status, "error": "", "latency_ms": latency,
        "latency_iqr_ms": 0.1, "latency_min_ms": latency * 0.9, "n_runs": 20,
    })


def kernel_rows(model_id, n, target=T1, features=("f_flops",), hashes=None, latency=0.5,
                status="ok") -> pd.DataFrame:
    df = pd.DataFrame({
        "model_id": model_id, "target": target, "kernel_index": range(n),
        "kernel_type": "conv2d", "ops": "CONV_2D+RELU",
        "config_hash": hashes or [f"{model_id}-{i}" for i in range(n)], "status": status,
        "latency_ms": latency, "latency_iqr_ms": 0.01, "latency_min_ms": latency, "n_runs": 20,
    })
    for j, f in enumerate(features):
        df[f] = [float(i + j) for i in range(n)]
    return df


@pytest.fixture
def ds(tmp_path) -> Dataset:
    return Dataset.create(tmp_path / "d", "test")


def test_create_writes_manifest_and_open_reads_it(ds):
    manifest = json.loads((ds.root / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["name"] == "test"
    assert manifest["targets"] == {}
    opened = Dataset.open(ds.root)
    assert opened.manifest == manifest
    assert opened.models().empty and list(opened.models().columns) == list(MODEL_COLUMNS)
    assert list(opened.kernels().columns) == list(KERNEL_COLUMNS)


def test_create_refuses_existing_and_open_refuses_missing(ds, tmp_path):
    with pytest.raises(DatasetError, match="already exists"):
        Dataset.create(ds.root, "again")
    with pytest.raises(DatasetError, match="manifest.json is missing"):
        Dataset.open(tmp_path / "nowhere")


def test_append_and_read_back_with_types_and_target_filter(ds):
    ds.append_models(model_rows(["a", "b"]))
    ds.append_models(model_rows(["a"], target=T2, latency=0.5))
    models = Dataset.open(ds.root).models()
    assert len(models) == 3
    assert models["n_runs"].dtype == "int64" and models["latency_ms"].dtype == "float64"
    assert set(ds.models(T2)["model_id"]) == {"a"}
    assert ds.models(T1)["latency_ms"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in (ds.root / "models.parquet").iterdir()) == [
        "part-000001.parquet", "part-000002.parquet"]


def test_feature_columns_differ_between_parts(ds):
    ds.append_kernels(kernel_rows("a", 2, features=("f_flops",)))
    ds.append_kernels(kernel_rows("b", 3, features=("f_flops", "f_groups")))
    k = ds.kernels()
    assert len(k) == 5
    assert k[k.model_id == "a"]["f_groups"].isna().all()
    assert k[k.model_id == "b"]["f_groups"].tolist() == [1.0, 2.0, 3.0]


def test_failed_models_keep_nan_latency(ds):
    rows = model_rows(["x"], status="timeout", latency=float("nan"))
    rows["error"] = [None]
    rows["n_runs"] = 0
    ds.append_models(rows)
    got = ds.models().iloc[0]
    assert got["status"] == "timeout" and got["error"] == "" and math.isnan(got["latency_ms"])


@pytest.mark.parametrize("change, message", [
    (lambda df: df.drop(columns="latency_ms"), "latency_ms"),
    (lambda df: df.assign(status="weird"), "status"),
    (lambda df: df.assign(n_runs=1.5), "n_runs"),
    (lambda df: df.assign(n_runs=float("nan")), "n_runs"),
    (lambda df: df.assign(model_id=3), "model_id"),
    (lambda df: df.assign(latency_ms="fast"), "latency_ms"),
])
def test_bad_rows_are_refused_with_the_column_named(ds, change, message):
    with pytest.raises(DatasetError, match=message):
        ds.append_models(change(model_rows(["a"])))
    assert ds.models().empty


def test_open_names_the_bad_column_and_file(ds):
    (ds.root / "kernels.parquet").mkdir()
    table = pa.Table.from_pandas(kernel_rows("a", 2).drop(columns="config_hash"))
    pq.write_table(table, ds.root / "kernels.parquet" / "part-000001.parquet")
    with pytest.raises(DatasetError, match=r"part-000001.parquet lacks the required column "
                                           r"'config_hash'"):
        Dataset.open(ds.root)
    bad = kernel_rows("a", 2).assign(kernel_index=["0", "1"])
    pq.write_table(pa.Table.from_pandas(bad), ds.root / "kernels.parquet" / "part-000001.parquet")
    with pytest.raises(DatasetError, match="'kernel_index'.*int"):
        Dataset.open(ds.root)


def test_corrupt_part_is_reported(ds):
    ds.append_models(model_rows(["a"]))
    (ds.root / "models.parquet" / "part-000002.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match="Cannot read .*part-000002.parquet"):
        Dataset.open(ds.root)
    with pytest.raises(DatasetError, match="Cannot read .*part-000002.parquet"):
        ds.models()


def test_bad_manifest_is_refused(ds):
    (ds.root / "manifest.json").write_text("{not json")
    with pytest.raises(DatasetError, match="Cannot read"):
        Dataset.open(ds.root)
    (ds.root / "manifest.json").write_text(json.dumps({"format_version": 7}))
    with pytest.raises(DatasetError, match="format_version"):
        Dataset.open(ds.root)


def test_update_manifest_merges_noise_and_validates(ds):
    ds.update_manifest(T1, runtime="litert", threads=1, repeats=20,
                       noise={"e2e_retest_mdape": None, "n_retest": 0})
    ds.update_manifest(T1, noise={"e2e_retest_mdape": 1.5, "n_retest": 50})
    entry = Dataset.open(ds.root).manifest["targets"][T1]
    assert entry["runtime"] == "litert" and entry["threads"] == 1
    assert entry["noise"] == {"e2e_retest_mdape": 1.5, "n_retest": 50}
    with pytest.raises(DatasetError, match="'threads'"):
        ds.update_manifest(T1, threads="one")
    assert ds.manifest["targets"][T1]["threads"] == 1  # the bad update wrote nothing
    assert ds.targets() == [T1]


def test_stray_temporary_part_is_ignored_and_cleaned(ds):
    ds.append_models(model_rows(["a"]))
    stray = ds.root / "models.parquet" / ".part-000002.parquet.1234abcd.tmp"
    stray.write_bytes(b"PAR1 half written")
    (ds.root / "models.parquet" / "notes.txt").write_text("not a part")
    assert Dataset.open(ds.root).models()["model_id"].tolist() == ["a"]
    ds.append_models(model_rows(["b"]))
    assert not stray.exists()
    assert ds.models()["model_id"].tolist() == ["a", "b"]


def _killed_append(root: Path, ids: list[str]) -> None:
    """Append in a child process that dies (no cleanup, like kill -9) right before the rename."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_dataset import model_rows
        from latpred.dataset import Dataset
        os.replace = lambda *a, **k: os._exit(9)
        Dataset.open({str(root)!r}).append_models(model_rows({ids!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()


def test_append_after_kill_neither_loses_nor_duplicates(ds):
    ds.append_models(model_rows(["a", "b"]))
    _killed_append(ds.root, ["c", "d"])
    temporaries = [p for p in (ds.root / "models.parquet").iterdir() if p.name.endswith(".tmp")]
    assert len(temporaries) == 1  # the half-done part is there but invisible
    resumed = Dataset.open(ds.root)
    done = resumed.measured_ids(T1)
    assert done == {"a", "b"}
    todo = [m for m in ["a", "b", "c", "d"] if m not in done]
    resumed.append_models(model_rows(todo))
    assert sorted(resumed.models()["model_id"]) == ["a", "b", "c", "d"]


def test_rows_measured_twice_after_a_kill_are_not_duplicated(ds):
    # A kill after a model's kernel rows but before its model row: the resumed run measures the
    # model again and appends its kernels a second time.
    ds.append_kernels(kernel_rows("a", 3, latency=0.5))
    assert "a" not in ds.measured_ids(T1)
    ds.append_kernels(kernel_rows("a", 3, latency=0.7))
    ds.append_models(model_rows(["a"]))
    k = ds.kernels(T1)
    assert len(k) == 3 and (k["latency_ms"] == 0.7).all()


def test_config_cache_prefers_ok_then_latest(ds):
    ds.append_kernels(kernel_rows("a", 2, hashes=["h1", "h2"], latency=1.0))
    ds.append_kernels(kernel_rows("b", 2, hashes=["h1", "h2"], latency=2.0))
    ds.append_kernels(kernel_rows("c", 1, hashes=["h1"], latency=float("nan"), status="failed"))
    ds.append_kernels(kernel_rows("d", 1, hashes=["h3"], target=T2, latency=3.0))
    cache = ds.config_cache(T1)
    assert set(cache) == {"h1", "h2"}
    assert cache["h1"] == LatencyStats("ok", 2.0, 0.01, 2.0, 20)
    assert ds.config_cache(T2)["h3"].latency_ms == 3.0
    assert ds.config_cache("other/cpu/fp32") == {}


def test_compact_merges_parts_and_appends_continue(ds):
    for i in range(3):
        ds.append_models(model_rows([f"m{i}"]))
        ds.append_kernels(kernel_rows(f"m{i}", 2))
    ds.append_kernels(kernel_rows("m0", 2, latency=9.0))  # a re-measurement: last one wins
    before_m, before_k = ds.models(), ds.kernels()
    ds.compact()
    assert (ds.root / "models.parquet").is_file() and (ds.root / "kernels.parquet").is_file()
    assert sorted(p.name for p in ds.root.iterdir()) == [
        "kernels.parquet", "manifest.json", "models.parquet"]
    reopened = Dataset.open(ds.root)
    pd.testing.assert_frame_equal(reopened.models(), before_m)
    pd.testing.assert_frame_equal(reopened.kernels(), before_k)
    assert len(before_k) == 6 and (before_k[before_k.model_id == "m0"].latency_ms == 9.0).all()
    assert pq.read_table(ds.root / "kernels.parquet").num_rows == 6
    reopened.append_models(model_rows(["m3"]))
    assert (ds.root / "models.parquet").is_dir()
    assert reopened.models()["model_id"].tolist() == ["m0", "m1", "m2", "m3"]


def test_open_finishes_a_swap_killed_between_renames(ds):
    ds.append_models(model_rows(["a"]))
    ds.compact()
    # Killed inside _swap_in after moving the old version away: only `.new` and `.old` remain.
    table = ds.root / "models.parquet"
    os.rename(table, table.with_name("models.parquet.old"))
    pq.write_table(pa.Table.from_pandas(model_rows(["a", "b"])),
                   table.with_name("models.parquet.new"))
    assert Dataset.open(ds.root).models()["model_id"].tolist() == ["a", "b"]
    assert sorted(p.name for p in ds.root.iterdir()) == ["manifest.json", "models.parquet"]


def test_open_rolls_back_a_swap_killed_before_it_started(ds):
    ds.append_models(model_rows(["a"]))
    half = ds.root / "models.parquet.new"
    half.mkdir()
    (half / "part-000000.parquet").write_bytes(b"trunc")
    assert Dataset.open(ds.root).models()["model_id"].tolist() == ["a"]
    assert not half.exists()


def test_replace_table_drops_rows_an_append_would_keep(ds):
    # A model re-deduced into fewer kernels: appending its 2 new rows would leave the old 3rd.
    ds.append_kernels(kernel_rows("m0", 3))
    ds.append_kernels(kernel_rows("m1", 2))
    kept = ds.kernels()
    new = pd.concat([kept[kept.model_id == "m1"], kernel_rows("m0", 2, latency=0.7)],
                    ignore_index=True)
    ds.replace_table("kernels", new)
    again = Dataset.open(ds.root).kernels()
    assert sorted(again.groupby("model_id").size().items()) == [("m0", 2), ("m1", 2)]
    assert (again[again.model_id == "m0"].latency_ms == 0.7).all()
    with pytest.raises(DatasetError):
        ds.replace_table("kernels", new.drop(columns=["latency_ms"]))
    assert len(Dataset.open(ds.root).kernels()) == 4   # a refused table leaves the old one
