"""Errors a user can cause. Each carries one clear sentence; the CLI prints it and exits 2."""


class LatpredError(Exception):
    """Base class of every error latpred raises on bad user input."""


class ModelFormatError(LatpredError):
    """A .tflite file that cannot be read: missing, truncated, not a TFLite flatbuffer."""


class UnsupportedModelError(LatpredError):
    """A readable model latpred cannot handle: control flow, dynamic shapes, several subgraphs."""


class DelegateRefusedError(UnsupportedModelError):
    """A model the target's GPU delegate refuses as a whole, so the runtime cannot run it there
    (shapes known only at run time; for LiteRT's GPU accelerator alone, ops it cannot take)."""


class ShapeError(LatpredError):
    """Shapes that do not fit an operation."""


class UnsupportedOpError(LatpredError):
    """An operation a stage has no rule for; never silently ignored."""


class TargetError(LatpredError):
    """An unknown or malformed target string, device, processor, precision or core set."""


class ConfigError(LatpredError):
    """A malformed device profile, search space or hyperparameter file."""


class DatasetError(LatpredError):
    """A dataset directory that is missing, malformed or inconsistent."""


class PredictorError(LatpredError):
    """A saved predictor that is missing, tampered with, stale or for another target."""


class MeasurementError(LatpredError):
    """A runtime that cannot measure what was asked (missing accelerator, failed model)."""
