"""latpred: predict the inference latency of neural architectures on mobile and edge devices.

The public API. Heavy submodules are imported on first use so that `import latpred` stays cheap
for a NAS loop that only needs a few of them.
"""

from latpred.errors import DelegateRefusedError, LatpredError
from latpred.graph import Graph, Op, Quantization, Tensor

__version__ = "0.1.0"

_LAZY = {
    "read_tflite": ("latpred.tflite", "read_tflite"),
    "write_tflite": ("latpred.tflite", "write_tflite"),
    "GraphBuilder": ("latpred.builder", "GraphBuilder"),
    "parse_target": ("latpred.target", "parse_target"),
    "Target": ("latpred.target", "Target"),
    "deduce": ("latpred.deduce", None),        # the package, callable as deduce(graph, target)
    "Kernel": ("latpred.deduce.kernel", "Kernel"),
    "op_features": ("latpred.features", "op_features"),
    "LatencyModel": ("latpred.predictors", "LatencyModel"),
    "Prediction": ("latpred.predictors.model", "Prediction"),
    "Dataset": ("latpred.dataset", "Dataset"),
    "predict_memory": ("latpred.memory", "predict_memory"),
    "from_torch": ("latpred.pytorch.export", "from_torch"),
}

__all__ = ["DelegateRefusedError", "LatpredError", "Graph", "Op", "Quantization", "Tensor", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        found = importlib.import_module(module)
        return found if attr is None else getattr(found, attr)
    raise AttributeError(f"module 'latpred' has no attribute {name!r}")
