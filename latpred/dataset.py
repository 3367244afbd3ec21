"""Measured datasets: a directory with `manifest.json`, `models.parquet` and `kernels.parquet`.

The format is fixed in docs/interfaces.md. Each table is either one parquet file or a directory
of parts (`models.parquet/part-000001.parquet`, ...). An append writes its rows to a hidden
temporary file and renames it into place, so a process killed mid-append loses at most the rows
it was writing and never leaves a half-written part where readers look. Whole-table rewrites
(`compact`, or turning a compacted file back into a directory of parts) build the new version next
to the old one as `<table>.new` and swap it in; `Dataset.open` finishes or rolls back a swap that
a kill interrupted (so do not open a dataset while another process compacts it).

Rows are keyed ((model_id, target) for models, plus kernel_index for kernels) and the last
appended row of a key wins when reading, so a run that re-measures a model after a kill between
its kernel rows and its model row never yields duplicates. One process writes a dataset at a
time; readers may read while it appends. Parts may carry different `f_` feature columns:
`kernels()` unites them (NaN where a part lacks one), while pyarrow's own directory reader would
keep only the first part's columns.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from latpred import atomic_files as atomic
from latpred.errors import DatasetError

FORMAT_VERSION = 1
STATUSES = ("ok", "failed", "timeout")

_STATS = {"status": "str", "latency_ms": "float", "latency_iqr_ms": "float",
          "latency_min_ms": "float", "n_runs": "int"}
MODEL_COLUMNS: dict[str, str] = {
    "model_id": "str", "space": "str", "seed": "int", "arch": "str", "file_hash": "str",
    "target": "str", **_STATS, "error": "str",
}
KERNEL_COLUMNS: dict[str, str] = {
    "model_id": "str", "target": "str", "kernel_index": "int", "kernel_type": "str", "ops": "str",
    "config_hash": "str", **_STATS,
}
_KEYS = {"models": ("model_id", "target"), "kernels": ("model_id", "target", "kernel_index")}
_COLUMNS = {"models": MODEL_COLUMNS, "kernels": KERNEL_COLUMNS}
FEATURE_PREFIX = "f_"  # kernel feature columns: float, NaN where a feature does not apply

_ARROW = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
_PART = re.compile(r"^part-(\d{6,})\.parquet$")

# Target entries of the manifest: known keys and their JSON types (more keys are allowed).
_TARGET_KEYS: dict[str, tuple[type, ...]] = {
    "runtime": (str,), "runtime_version": (str,), "machine": (str,), "cpu_model": (str,),
    "cpu_id": (str,),
    "threads": (int,), "precision": (str,), "date": (str,), "warmup": (int,), "repeats": (int,),
    "noise": (dict,),
}
_NOISE_KEYS: dict[str, tuple[type, ...]] = {
    "e2e_retest_mdape": (float, int, type(None)), "kernel_retest_mdape": (float, int, type(None)),
    "e2e_retest_p90": (float, int, type(None)), "kernel_retest_p90": (float, int, type(None)),
    "n_retest": (int,),
}


@dataclass(frozen=True)
class LatencyStats:
    """The figures a measured kernel configuration shares with every identical one."""

    status: str
    latency_ms: float
    latency_iqr_ms: float
    latency_min_ms: float
    n_runs: int


@dataclass(frozen=True)
class Dataset:
    """A dataset directory. A handle only: every method reads or writes the files it needs."""

    root: Path

    # -- opening -------------------------------------------------------------------------------
    @staticmethod
    def create(root: str | os.PathLike, name: str) -> "Dataset":
        """Make a new, empty dataset directory; refuses to overwrite an existing dataset."""
        path = Path(root)
        if (path / "manifest.json").exists():
            raise DatasetError(f"A dataset already exists at {path}; open it instead.")
        if path.exists() and not path.is_dir():
            raise DatasetError(f"{path} exists and is not a directory.")
        path.mkdir(parents=True, exist_ok=True)
        manifest = {"format_version": FORMAT_VERSION, "name": name,
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "targets": {}}
        _write_manifest(path / "manifest.json", manifest)
        return Dataset(path)

    @staticmethod
    def open(root: str | os.PathLike) -> "Dataset":
        """Open an existing dataset, repairing an interrupted swap and validating every file."""
        path = Path(root)
        if not (path / "manifest.json").is_file():
            raise DatasetError(f"No dataset at {path}: manifest.json is missing.")
        ds = Dataset(path)
        _validate_manifest(ds.manifest, path / "manifest.json")
        for table in _COLUMNS:
            atomic.recover(ds._table_path(table))
            for part in ds._parts(table):
                try:
                    schema = pq.read_schema(part)
                except (OSError, pa.ArrowException) as err:
                    raise DatasetError(f"Cannot read {part}: {err}.") from err
                _validate_schema(schema, table, part)
        return ds

    # -- manifest ------------------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as a fresh dict (editing it changes nothing on disk)."""
        try:
            return json.loads((self.root / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DatasetError(f"Cannot read {self.root / 'manifest.json'}: {err}.") from err

    def update_manifest(self, target: str | None = None, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into the entry of `target` (or the top level) and write atomically.

        A `noise` dict is merged key by key, so the noise floor can be filled in at the end of a
        run without repeating the rest. Returns the new manifest.
        """
        manifest = self.manifest
        if target is None:
            manifest.update(fields)
        else:
            entry = manifest.setdefault("targets", {}).setdefault(target, {})
            for key, value in fields.items():
                if key == "noise" and isinstance(value, dict):
                    entry.setdefault("noise", {}).update(value)
                else:
                    entry[key] = value
        _validate_manifest(manifest, self.root / "manifest.json")
        _write_manifest(self.root / "manifest.json", manifest)
        return manifest

    # -- appending -----------------------------------------------------------------------------
    def append_models(self, df: pd.DataFrame) -> None:
        """Append model rows (columns of MODEL_COLUMNS, extra columns kept) as one new part."""
        self._append("models", df)

    def append_kernels(self, df: pd.DataFrame) -> None:
        """Append kernel rows (KERNEL_COLUMNS plus `f_<feature>` float columns) as one part."""
        self._append("kernels", df)

    def _append(self, table: str, df: pd.DataFrame) -> None:
        if len(df) == 0:
            return
        arrow = _to_arrow(df, table)
        directory = self._table_path(table)
        atomic.recover(directory)
        if directory.is_file():
            atomic.file_to_parts(directory)
        directory.mkdir(exist_ok=True)
        atomic.remove_temporaries(directory)
        numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _PART.match(p.name))]
        final = directory / f"part-{max(numbers, default=0) + 1:06d}.parquet"
        atomic.write_atomic(final, lambda tmp: _write_parquet(arrow, tmp))

    # -- reading -------------------------------------------------------------------------------
    def models(self, target: str | None = None) -> pd.DataFrame:
        """All model rows (one per model and target), optionally of one target only."""
        return self._read("models", target)

    def kernels(self, target: str | None = None) -> pd.DataFrame:
        """All kernel rows (one per model, kernel and target), optionally of one target only."""
        return self._read("kernels", target)

    def measured_ids(self, target: str) -> set[str]:
        """Models that have a row for `target`, whatever its status: a resumed run skips them.

        A model counts as measured once its model row is written, so a profiler appends a
        model's kernel rows first and its model row last.
        """
        return set(self.models(target)["model_id"])

    def config_cache(self, target: str) -> dict[str, LatencyStats]:
        """config_hash -> figures already measured for `target`, so each config is measured once.

        Where a configuration has several rows, an "ok" one is preferred over a failure, and a
        later row over an earlier one.
        """
        k = self.kernels(target)
        if k.empty:
            return {}
        k = k.assign(_ok=(k["status"] == "ok"), _order=range(len(k)))
        k = k.sort_values(["_ok", "_order"]).drop_duplicates("config_hash", keep="last")
        return {row.config_hash: LatencyStats(row.status, float(row.latency_ms),
                                              float(row.latency_iqr_ms),
                                              float(row.latency_min_ms), int(row.n_runs))
                for row in k.itertuples(index=False)}

    # -- side files (e.g. the retests of an interleaved campaign, `retest.json`) ---------------
    def read_json(self, name: str) -> Any:
        """The JSON side file `name` in the dataset directory, or None when there is none."""
        path = self.root / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DatasetError(f"Cannot read {path}: {err}.") from err

    def write_json(self, name: str, data: Any) -> None:
        """Write the JSON side file `name` atomically."""
        atomic.write_atomic(self.root / name, lambda tmp: tmp.write_text(json.dumps(data) + "\n"))

    def targets(self) -> list[str]:
        """Targets the manifest describes."""
        return list(self.manifest.get("targets", {}))

    def _read(self, table: str, target: str | None) -> pd.DataFrame:
        frames = []
        for part in self._parts(table):
            try:
                arrow = pq.read_table(part)
            except (OSError, pa.ArrowException) as err:
                raise DatasetError(f"Cannot read {part}: {err}.") from err
            _validate_schema(arrow.schema, table, part)
            frames.append(arrow.to_pandas())
        if not frames:
            return _empty(table)
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        df = df.drop_duplicates(list(_KEYS[table]), keep="last")
        if target is not None:
            df = df[df["target"] == target]
        return df.reset_index(drop=True)

    # -- maintenance ---------------------------------------------------------------------------
    def replace_table(self, table: str, df: pd.DataFrame) -> None:
        """Rewrite `table` ("models" or "kernels") as exactly `df`, atomically: a migration
        (e.g. kernel rows realigned to a new deduction rule) that appending cannot express."""
        arrow = _to_arrow(df, table)
        path = self._table_path(table)
        new = path.with_name(path.name + ".new")
        atomic.write_atomic(new, lambda tmp: _write_parquet(arrow, tmp))
        atomic.swap_in(path, new)

    def compact(self) -> None:
        """Rewrite each table as one parquet file (duplicates and temporary files dropped)."""
        for table in _COLUMNS:
            path = self._table_path(table)
            if not path.is_dir():
                continue
            arrow = _to_arrow(self._read(table, None), table)
            new = path.with_name(path.name + ".new")
            atomic.write_atomic(new, lambda tmp: _write_parquet(arrow, tmp))
            atomic.swap_in(path, new)

    # -- paths ---------------------------------------------------------------------------------
    def _table_path(self, table: str) -> Path:
        return self.root / f"{table}.parquet"

    def _parts(self, table: str) -> list[Path]:
        """The files of a table in append order; temporaries and foreign files are skipped."""
        path = self._table_path(table)
        if path.is_file():
            return [path]
        if not path.is_dir():
            return []
        parts = [(int(m.group(1)), p) for p in path.iterdir() if (m := _PART.match(p.name))]
        return [p for _, p in sorted(parts)]


# -- schema ------------------------------------------------------------------------------------
def _kind(dtype: pa.DataType) -> str | None:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "str"
    if pa.types.is_integer(dtype):
        return "int"
    if pa.types.is_floating(dtype):
        return "float"
    if pa.types.is_boolean(dtype):
        return "bool"
    return None


def _validate_schema(schema: pa.Schema, table: str, where: Path) -> None:
    """Raise DatasetError naming the first missing column or column of the wrong type."""
    for name, kind in _COLUMNS[table].items():
        if name not in schema.names:
            raise DatasetError(f"{where} lacks the required column {name!r}.")
        got = _kind(schema.field(name).type)
        if got != kind:
            raise DatasetError(f"Column {name!r} of {where} should hold {kind} values, "
                               f"not {schema.field(name).type}.")
    for field in schema:
        if field.name.startswith(FEATURE_PREFIX) and _kind(field.type) not in ("float", "int"):
            raise DatasetError(f"Feature column {field.name!r} of {where} should be numeric, "
                               f"not {field.type}.")


def _to_arrow(df: pd.DataFrame, table: str) -> pa.Table:
    """Rows as an arrow table with the canonical types, or DatasetError saying what is wrong."""
    required = _COLUMNS[table]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DatasetError(f"Rows appended to {table} lack the column(s) {', '.join(missing)}.")
    arrays, fields = [], []
    for name in df.columns:
        if not isinstance(name, str):
            raise DatasetError(f"Column names of {table} must be strings, not {name!r}.")
        kind = required.get(name, "float" if name.startswith(FEATURE_PREFIX) else None)
        arrays.append(_column(df[name], name, kind, table))
        fields.append(pa.field(name, arrays[-1].type))
    bad = set(df["status"]) - set(STATUSES)
    if bad:
        raise DatasetError(f"Column 'status' of {table} holds {sorted(map(str, bad))}; "
                           f"allowed: {', '.join(STATUSES)}.")
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _column(series: pd.Series, name: str, kind: str | None, table: str) -> pa.Array:
    values = series.tolist()
    if kind is None:  # an extra column: kept with whatever type arrow infers (NaN: null, so
        try:              # that rows of parts without the column can be compacted with others)
            return pa.array(values, from_pandas=True)
        except pa.ArrowException as err:
            raise DatasetError(f"Column {name!r} of {table} cannot be stored: {err}.") from err
    if kind == "str":
        if name == "error":  # "no error" may come as None or NaN
            values = ["" if v is None or v != v else v for v in values]
        if not all(isinstance(v, str) for v in values):
            raise DatasetError(f"Column {name!r} of {table} must hold strings only.")
    if kind == "int":  # arrow would truncate 1.5 silently; whole floats (1.0) are fine
        if not all(_is_whole(v) for v in values):
            raise DatasetError(f"Column {name!r} of {table} must hold whole numbers only.")
        values = [int(v) for v in values]
    try:
        array = pa.array(values, type=_ARROW[kind], from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError) as err:
        raise DatasetError(f"Column {name!r} of {table} must hold {kind} values: {err}.") from err
    return array


def _is_whole(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return isinstance(v, float) and v.is_integer()


def _empty(table: str) -> pd.DataFrame:
    schema = pa.schema([pa.field(n, _ARROW[k]) for n, k in _COLUMNS[table].items()])
    return schema.empty_table().to_pandas()


def _validate_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict):
        raise DatasetError(f"{where} must hold a JSON object.")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{where} has format_version {manifest.get('format_version')!r}; "
                           f"this latpred reads version {FORMAT_VERSION}.")
    for key in ("name", "created"):
        if not isinstance(manifest.get(key), str):
            raise DatasetError(f"{where} needs a string {key!r}.")
    targets = manifest.get("targets")
    if not isinstance(targets, dict):
        raise DatasetError(f"{where} needs a 'targets' object.")
    for target, entry in targets.items():
        if not isinstance(entry, dict):
            raise DatasetError(f"Target {target!r} in {where} must be an object.")
        _check_types(entry, _TARGET_KEYS, f"target {target!r} in {where}")
        if "noise" in entry:
            _check_types(entry["noise"], _NOISE_KEYS, f"the noise of target {target!r} in {where}")


def _write_manifest(path: Path, manifest: dict) -> None:
    atomic.write_atomic(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=2) + "\n"))


def _check_types(entry: dict, known: dict[str, tuple[type, ...]], what: str) -> None:
    for key, types in known.items():
        value = entry.get(key)
        if key in entry and (not isinstance(value, types) or isinstance(value, bool)):
            names = "/".join(t.__name__ for t in types)
            raise DatasetError(f"{key!r} of {what} should be {names}, not {value!r}.")


def _write_parquet(arrow: pa.Table, path: Path) -> None:
    # zstd at level 9 halves the shipped datasets against parquet's default snappy (the
    # repository must stay small enough to travel to the device machine) and reads as fast.
    pq.write_table(arrow, path, compression="zstd", compression_level=9)
