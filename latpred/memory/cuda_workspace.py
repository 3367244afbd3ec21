"""What the H100's libraries take through PyTorch's caching allocator besides tensors.

- `process_start()`: the allocator of a process that has run one matmul (what
  `scripts/cuda_memory_campaign.py` makes before any model, measured on the device): the
  cuBLAS workspace (32 MiB on sm90, aten/src/ATen/cuda/CublasHandlePool.cpp
  `getChosenWorkspaceSize`, allocated through the caching allocator per handle and stream and
  kept) in a segment of its own, and the cuBLASLt workspace (1 MiB, `getCUDABlasLtWorkspace`)
  in a 2 MiB small-pool segment, beside 5,632 free bytes the warm-up's tensors left: measured
  segments [33554432: allocated] and [5632 free, 1048576 allocated, 1042944 free].
- `conv_workspace(graph, op, elem)`: the bytes cuDNN's chosen engine takes per convolution call
  (aten/src/ATen/native/cudnn/Conv_v8.cpp allocates `workspace_size` through the caching
  allocator and frees it after the call; the engine is cuDNN 9.19's heuristic choice with
  `cudnn.benchmark = False`, not knowable without the library): the size measured on the H100
  for a known configuration (`measured()`, the table shipped as package data in
  `data/h100_workspaces.json.gz`), else the learned estimate (`estimate`:
  LightGBM on the configuration, trained on every measured one; held out by model it halves
  the error of assuming no workspace, see docs/memory.md).
- `mean_scratch(graph, op, elem)`: MEAN's global-reduction buffer and semaphores, computed
  by the port of PyTorch's ReduceConfig in `cuda_reduce` (exact on every MEAN measured).
"""

from __future__ import annotations

import gzip
import json
import math
from functools import cache
from importlib.resources import files

import numpy as np

from latpred.graph import Graph, Op
from latpred.memory.cuda_alloc import CachingAllocator
from latpred.windows import pair, window_padding

# Measured on the H100 (torch 2.11.0+cu130): segments after the warm-up, in address order
# of the device (the small segment sat above the large one).
PROCESS_START = (
    (False, ((33554432, True),)),
    (True, ((5632, False), (1048576, True), (1042944, False))),
)


def process_start() -> CachingAllocator:
    alloc = CachingAllocator()
    for small, blocks in PROCESS_START:
        alloc.add_segment(list(blocks), small, addr=(1 << 50) if small else 0)
    return alloc


def conv_key(graph: Graph, op: Op, elem: int) -> tuple:
    """The configuration cuDNN sees: precision, input NCHW, output channels, window, stride,
    dilation, groups, symmetric padding."""
    n, h, w, c = graph.tensors[op.inputs[0]].shape
    wt = graph.tensors[op.inputs[1]].shape
    if op.type == "DEPTHWISE_CONV_2D":
        cout, kh, kw, groups = wt[3], wt[1], wt[2], c
    else:
        cout, kh, kw = wt[0], wt[1], wt[2]
        groups = max(1, c // wt[3])
    stride = pair(op.attr("stride", 1), "stride")
    dil = pair(op.attr("dilation", 1), "dilation")
    sym, asym = window_padding((h, w), (kh, kw), stride, dil, op.attr("padding", "VALID"))
    if asym is not None and None in sym:
        l, r, t, b = asym
        h, w, sym = h + t + b, w + l + r, (0, 0)
    return (elem, n, c, h, w, cout, kh, kw, *stride, *dil, groups, *sym)


# The measured table: written by scripts/cuda_memory_assemble.py (`dump_table`), shipped in
# the package (pyproject.toml's package-data), read once (`shipped_table`).
TABLE = "data/h100_workspaces.json.gz"


def dump_table(path, conv: dict, model: str, header: dict) -> None:
    """Write `conv` ({conv_key tuple: bytes}), the estimator `model` (LightGBM text) and
    `header` (what made it) as gzipped JSON, keys as lists of ints in sorted order; the
    gzip header carries no name or time, so equal tables give equal bytes."""
    doc = {"header": header,
           "conv": [[list(k), int(conv[k])] for k in sorted(conv)],
           "model": model}
    data = json.dumps(doc, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))


def load_table(data: bytes) -> dict:
    """{"header": dict, "conv": {conv_key tuple: bytes}, "model": str} from `dump_table`'s
    bytes."""
    doc = json.loads(gzip.decompress(data))
    return {"header": doc["header"],
            "conv": {tuple(k): v for k, v in doc["conv"]},
            "model": doc["model"]}


@cache
def shipped_table() -> dict:
    """The table measured on the H100 (see its "header"), loaded on first use."""
    return load_table(files("latpred.memory").joinpath(TABLE).read_bytes())


def measured() -> dict:
    """{conv_key: workspace bytes} measured on the H100 (do not modify)."""
    return shipped_table()["conv"]


def conv_workspace(graph: Graph, op: Op, elem: int) -> int:
    """The workspace of one convolution call, kept per (type, input and filter shapes,
    attributes, element bytes): a model's convolutions repeat, and `simulate` asks op by op."""
    seen = (op.type, graph.tensors[op.inputs[0]].shape, graph.tensors[op.inputs[1]].shape,
            op.attrs, elem)
    ws = _WORKSPACES.get(seen)
    if ws is None:
        if len(_WORKSPACES) > 1 << 16:
            _WORKSPACES.clear()
        ws = _WORKSPACES[seen] = workspaces([(graph, op)], elem)[0]
    return ws


_WORKSPACES: dict[tuple, int] = {}


def workspaces(convolutions, elem: int) -> list[int]:
    """The workspace of each (graph, convolution op): measured where the table has its
    configuration, else estimated, those in one estimator call (one call costs ~0.1 ms
    however few rows it has)."""
    keys = [conv_key(graph, op, elem) for graph, op in convolutions]
    table = measured()
    out = list(map(table.get, keys))
    missing = [j for j, ws in enumerate(out) if ws is None]
    if missing:
        for j, ws in zip(missing, estimates([keys[j] for j in missing])):
            out[j] = ws
    return out


def mean_scratch(graph: Graph, op: Op, elem: int) -> tuple[int, ...]:
    from latpred.memory.cuda_reduce import reduce_scratch

    axes = tuple(int(a) for a in (graph.tensors[op.inputs[1]].value or ()))
    return reduce_scratch(graph.tensors[op.inputs[0]].shape, axes, elem)


def features(keys: list[tuple]) -> np.ndarray:
    """The estimator's inputs, a row per key: the key's fields, per-group channels, output
    height, depthwise and grouped flags, log2 of the input bytes."""
    k = np.array(keys, np.int64).reshape(len(keys), 15)
    elem, n, c, h, w, co, kh, kw, sh, sw, dh, dw, g, ph, pw = k.T
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    in_bytes = np.maximum(1, n * c * h * w * elem).tolist()
    return np.column_stack([elem, n, c, h, w, co, kh, sh, g, c // g, co // g, oh,
                            (g == c) & (g > 1), g > 1,
                            list(map(math.log2, in_bytes))]).astype(np.float64)


def _input_bytes(key: tuple) -> int:
    elem, n, c, h, w = key[:5]
    return elem * n * c * h * w


def fit_estimator(keys, values, n_estimators: int = 200):
    """A LightGBM regressor of log2(1 + workspace / input bytes) on `features` (the workspace
    of cuDNN's engines scales with the input: ratios cluster at small integers)."""
    import lightgbm as lgb

    X = features(keys)
    y = np.log2(1 + np.array(values, float) / np.array([_input_bytes(k) for k in keys], float))
    model = lgb.LGBMRegressor(n_estimators=n_estimators, learning_rate=0.05, num_leaves=31,
                              min_child_samples=10, verbose=-1, random_state=0)
    return model.fit(X, y).booster_


@cache
def _shipped():
    import lightgbm as lgb

    return lgb.Booster(model_str=shipped_table()["model"])


def estimate(key: tuple, booster=None) -> int:
    """The workspace of a configuration the table lacks: `booster` (default: the one
    `scripts/cuda_memory_assemble.py` fitted on every measured configuration)."""
    return estimates([key], booster)[0]


def estimates(keys: list[tuple], booster=None) -> list[int]:
    """`estimate` of each key, in one call of the estimator (one call costs ~0.1 ms however
    few rows it has: a NAS batch meets hundreds of new configurations)."""
    b = booster if booster is not None else _shipped()
    logs = b.predict(features(keys)).tolist()
    return [max(0, int(round((2.0 ** v - 1.0) * _input_bytes(k)))) for k, v in zip(keys, logs)]
