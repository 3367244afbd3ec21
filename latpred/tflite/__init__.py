"""Read and write .tflite models: `read_tflite(path_or_bytes) -> Graph`, `write_tflite(graph)`.

The reader and writer load on first use (PEP 562): they need LiteRT's flatbuffer schema
(`ai_edge_litert`), while the package's other modules (quantization rules, weights) do not, and
the int8 deduction imports those on machines without LiteRT (the CUDA device machine).
"""

__all__ = ["read_tflite", "write_tflite"]


def __getattr__(name: str):
    if name == "read_tflite":
        from latpred.tflite.reader import read_tflite
        return read_tflite
    if name == "write_tflite":
        from latpred.tflite.writer import write_tflite
        return write_tflite
    raise AttributeError(f"module 'latpred.tflite' has no attribute {name!r}")
