"""Save and load a LatencyModel as a directory that cannot run code when loaded.

    predictor.json      format version, target, family, whether the conv-like types use the
                        analytical features, feature schema per kernel type, overhead,
                        training metrics, and name + sha256 of every artifact
    <kernel_type><suffix>   one artifact per kernel type in its family's safe format:
                        JSON weights (lasso), skops with checked types (rf), LightGBM text
                        model (gbdt), safetensors (mlp); an adapted type (`latpred adapt`)
                        is JSON embedding its source artifact, base64 with its own sha256
    <kernel_type>.launch.lgb.txt   a type with the launch-pattern stage (predictors/launch.py,
                        CUDA grouped convolutions): its pattern classifier, a LightGBM text
                        model, listed under the type's "launch" entry with classes and sha256
    residual.lgb.txt    the end-to-end residual stage where one was kept
                        (predictors/residual.py): a LightGBM text model, under "residual"

Loading parses predictor.json as JSON, refuses another format version or another target,
refuses an artifact whose name is not a plain file name of this directory, and checks each
artifact's sha256 before handing its bytes to the family's `restore`. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from latpred.errors import PredictorError
from latpred.predictors.launch import ARTIFACT_SUFFIX as LAUNCH_SUFFIX
from latpred.predictors.launch import LaunchClassifier, LaunchStaged
from latpred.predictors.overhead import OverheadModel
from latpred.predictors.residual import ARTIFACT as RESIDUAL_ARTIFACT
from latpred.predictors.residual import ResidualStage
from latpred.predictors.search import FAMILIES
from latpred.predictors.training import TypeFit

FORMAT_VERSION = 1
MANIFEST = "predictor.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


def save_model(model: Any, directory: str | os.PathLike) -> Path:
    """Write `model` (a LatencyModel) to `directory`, creating it; returns the directory."""
    import latpred

    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise PredictorError(f"{root} exists and is not a directory.")
    root.mkdir(parents=True, exist_ok=True)
    kernel_types = {t: _write_fit(root, fit, fit.kernel_type) for t, fit in model.types.items()}
    doc = {
        "format_version": FORMAT_VERSION, "latpred_version": latpred.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": model.target, "family": model.family,
        "analytical_features": bool(model.analytical_features), "kernel_types": kernel_types,
        "fallback": _write_fit(root, model.fallback, "_fallback") if model.fallback else None,
        "overhead": model.overhead.to_json(), "training": dict(model.training),
        "residual": _write_residual(root, model.residual),
    }
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default))
    os.replace(tmp, root / MANIFEST)  # the manifest appears last, whole, so a reader never
    return root                         # sees a predictor with missing artifacts


def _write_fit(root: Path, fit: TypeFit, stem: str) -> dict[str, Any]:
    reg, classifier = fit.regressor, None
    if isinstance(reg, LaunchStaged):   # the regressor's artifact, then the classifier's
        reg, classifier = reg.regressor, reg.classifier
    data, params = reg.export()
    name = stem + type(reg).artifact_suffix
    if not _SAFE_NAME.match(name):
        raise PredictorError(f"Kernel type {stem!r} cannot name a file.")
    (root / name).write_bytes(data)
    entry = {"family": type(reg).family, "features": list(fit.features),
             "artifact": name, "sha256": hashlib.sha256(data).hexdigest(), "params": params,
             "metrics": fit.metrics}
    if classifier is not None:
        data, params = classifier.export()
        name = stem + LAUNCH_SUFFIX
        (root / name).write_bytes(data)
        entry["launch"] = {"artifact": name, "sha256": hashlib.sha256(data).hexdigest(),
                           **params}
    return entry


def _write_residual(root: Path, stage: ResidualStage | None) -> dict[str, Any] | None:
    if stage is None:
        return None
    data, params = stage.export()
    (root / RESIDUAL_ARTIFACT).write_bytes(data)
    return {"artifact": RESIDUAL_ARTIFACT, "sha256": hashlib.sha256(data).hexdigest(), **params}


def _read_residual(root: Path, entry: dict[str, Any] | None) -> ResidualStage | None:
    if entry is None:   # none kept, or saved before the stage existed
        return None
    path, data = _read_artifact(root, "residual", entry)
    try:
        return ResidualStage.restore(data, entry)
    except Exception as err:  # a foreign file's failure to parse is the file's fault
        raise PredictorError(f"The artifact {path} is not a valid residual stage "
                             f"({type(err).__name__}); refusing it.") from None


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):  # numpy scalars in metrics or best_params
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def load_model(directory: str | os.PathLike, target: str | None = None):
    """Load a saved LatencyModel; `target`, when given, must be the predictor's target."""
    from latpred.predictors.model import LatencyModel

    root = Path(directory)
    doc = _read_manifest(root)
    if target is not None and str(target) != doc["target"]:
        raise PredictorError(f"The predictor at {root} is for target {doc['target']}, "
                             f"not {target}.")
    try:
        types = {t: _read_fit(root, t, e) for t, e in doc["kernel_types"].items()}
        fallback = _read_fit(root, "_fallback", doc["fallback"]) if doc.get("fallback") else None
        overhead = OverheadModel.from_json(doc["overhead"])
        residual = _read_residual(root, doc.get("residual"))
    except (KeyError, TypeError, ValueError) as err:
        raise PredictorError(f"{root / MANIFEST} is malformed ({err}); retrain the "
                             "predictor.") from None
    # predictors saved before the option existed lack the key: they were trained without it
    analytical = doc.get("analytical_features", False)
    if not isinstance(analytical, bool):
        raise PredictorError(f"{root / MANIFEST} has a non-boolean 'analytical_features'.")
    return LatencyModel(doc["target"], doc["family"], types, overhead, fallback,
                        doc.get("training", {}), analytical, residual)


def _read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not path.is_file():
        raise PredictorError(f"No predictor at {root}: {MANIFEST} is missing.")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PredictorError(f"Cannot read {path}: {err}.") from None
    if not isinstance(doc, dict) or "format_version" not in doc:
        raise PredictorError(f"{path} is not a latpred predictor manifest.")
    if doc["format_version"] != FORMAT_VERSION:
        raise PredictorError(f"The predictor at {root} has format version "
                             f"{doc['format_version']}; this latpred reads version "
                             f"{FORMAT_VERSION}, so retrain it.")
    for key, kind in (("target", str), ("family", str), ("kernel_types", dict),
                      ("overhead", dict)):
        if not isinstance(doc.get(key), kind):
            raise PredictorError(f"{path} lacks a valid {key!r} entry.")
    return doc


def _families() -> dict[str, Any]:
    """The trainable families and the adapted wrappers (`latpred adapt`), by artifact family."""
    from latpred.predictors.adapt.wrappers import WRAPPERS

    return {**FAMILIES, **WRAPPERS}


def _check_name(ktype: str, entry: dict[str, Any]) -> str:
    name = entry["artifact"]
    if not isinstance(name, str) or not _SAFE_NAME.match(name):
        raise PredictorError(f"The artifact name {name!r} of kernel type {ktype} is not a plain "
                             "file name; the predictor has been tampered with.")
    return name


def _read_artifact(root: Path, ktype: str, entry: dict[str, Any]) -> tuple[Path, bytes]:
    """The bytes of an artifact named in `entry`, checked against its recorded sha256."""
    path = root / _check_name(ktype, entry)
    try:
        data = path.read_bytes()
    except OSError:
        raise PredictorError(f"The artifact {path} of kernel type {ktype} is missing.") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise PredictorError(f"The artifact {path} does not match the sha256 recorded in "
                             f"{MANIFEST}; it was modified after training, refusing to load it.")
    return path, data


def _read_fit(root: Path, ktype: str, entry: dict[str, Any]) -> TypeFit:
    _check_name(ktype, entry)
    family = entry["family"]
    families = _families()
    if family not in families:
        raise PredictorError(f"Kernel type {ktype} names an unknown family {family!r}.")
    path, data = _read_artifact(root, ktype, entry)
    try:
        reg = families[family].restore(data, dict(entry["params"]))
    except Exception as err:  # any failure to parse a foreign file is the user's file's fault
        raise PredictorError(f"The artifact {path} of kernel type {ktype} is not a valid "
                             f"{family} model ({type(err).__name__}); refusing it.") from None
    features = tuple(entry["features"])
    launch = entry.get("launch")
    if launch is not None:   # the launch-pattern stage: the regressor also reads its columns
        path_c, data_c = _read_artifact(root, ktype, launch)
        try:
            classifier = LaunchClassifier.restore(data_c, launch)
        except Exception as err:
            raise PredictorError(f"The artifact {path_c} of kernel type {ktype} is not a valid "
                                 f"launch classifier ({type(err).__name__}); refusing it.") \
                from None
        if classifier.features != features or \
                reg.n_features_in_ != len(features) + len(classifier.classes):
            raise PredictorError(f"The artifacts {path} and {path_c} do not fit the "
                                 f"{len(features)} features {MANIFEST} lists.")
        return TypeFit(ktype, features, LaunchStaged(reg, classifier),
                       dict(entry.get("metrics", {})))
    if len(features) != reg.n_features_in_:
        raise PredictorError(f"The artifact {path} expects {reg.n_features_in_} features but "
                             f"{MANIFEST} lists {len(features)}.")
    return TypeFit(ktype, features, reg, dict(entry.get("metrics", {})))
