"""Ground truth from the runtime itself (host CPU, ai-edge-litert 2.3.0).

`runtime_arena`: the kTfLiteArenaRw arena exactly as LiteRT planned it, read back from the
tensors' data pointers. ai-edge-litert exports no C++ symbol that reports it
(`Subgraph::GetMemoryAllocInfo` is not exported), but every arena tensor's `data.raw` is
`arena base + offset` (tflite/arena_planner.cc `ResolveTensorAllocation`), and Python's
`interpreter.tensor(i)()` is a numpy view of exactly that pointer, temporaries included
(`get_tensor_details` lists them). The first tensor the planner places sits at offset 0, and it is a
graph input (alive through the whole run, placed first), so the lowest graph-input address is
the buffer's start; `malloc_usable_size` of that pointer bounds the buffer (the arena is one
`aligned_alloc`, tflite/simple_memory_arena.cc `AlignedAlloc`), which separates arena tensors
from separately allocated ones (persistent-ro shape tensors, dynamic tensors). The arena size
is then max(address + bytes) - base over the arena's tensors: the planner's high-water mark.

`peak_rss`: the peak resident set (VmHWM) of a fresh process that loads, allocates and runs
the model, minus the same for a trivial model (`baseline_rss`).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from latpred.errors import MeasurementError


@dataclass(frozen=True)
class ArenaReading:
    """`arena_bytes`: high-water mark read back; `usable`: malloc's size of the buffer;
    `offsets`: tensor index -> offset for every tensor found in the arena."""

    arena_bytes: int
    usable: int
    offsets: dict[int, int]
    sizes: dict[int, int]


def runtime_arena(model: bytes, kernels: str = "builtin", threads: int = 1) -> ArenaReading:
    """Run `model` once and read back LiteRT's arena (in this process)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if kernels == "builtin"
                else OpResolverType.AUTO)
    interp = Interpreter(model_content=model, num_threads=threads,
                         experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        view = interp.tensor(d["index"])()
        view[...] = np.ones(view.shape, view.dtype)
        del view      # the interpreter refuses to run while views of its buffers are alive
    interp.invoke()
    found: dict[int, tuple[int, int]] = {}
    # Only tensors get_tensor_details can describe: a kernel's unused scratch tensors (the 6
    # FULLY_CONNECTED reserves) have no type or dims, and reading them crashes.
    for i in sorted(d["index"] for d in interp.get_tensor_details()):
        try:
            view = interp.tensor(i)()
        except ValueError:
            continue
        if isinstance(view, np.ndarray) and view.nbytes:   # a 0-d tensor comes back a copy
            found[i] = (view.ctypes.data, view.nbytes)
        del view
    inputs = [found[d["index"]][0] for d in interp.get_input_details() if d["index"] in found]
    if not inputs:
        raise MeasurementError("The model has no graph input in the arena to locate it by.")
    base = min(inputs)
    libc = ctypes.CDLL(None)
    libc.malloc_usable_size.restype = ctypes.c_size_t
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    usable = int(libc.malloc_usable_size(ctypes.c_void_p(base)))
    offsets = {i: a - base for i, (a, n) in found.items() if base <= a < base + usable}
    sizes = {i: found[i][1] for i in offsets}
    extent = max(offsets[i] + sizes[i] for i in offsets)
    if extent > usable:
        raise MeasurementError("A tensor reaches past the arena buffer; the reading is invalid.")
    del interp
    return ArenaReading(extent, usable, offsets, sizes)


_CHILD = r"""
import json, sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType
path, kernels = sys.argv[1], sys.argv[2]
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
before = hwm()
with open(path, 'rb') as f:
    data = f.read()
r = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if kernels == 'builtin'
     else OpResolverType.AUTO)
it = Interpreter(model_content=data, num_threads=1, experimental_op_resolver_type=r)
it.allocate_tensors()
for d in it.get_input_details():
    v = it.tensor(d['index'])()
    v.fill(1)
    del v
it.invoke()
it.invoke()
print(json.dumps({'hwm': hwm(), 'before': before, 'file': len(data)}))
"""


def _child_rss(path: str, kernels: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD, path, kernels], capture_output=True,
                         text=True, timeout=300, env=env)
    if out.returncode != 0:
        raise MeasurementError(f"Measuring {path!r} failed: "
                               f"{(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss(path: str, kernels: str = "xnnpack") -> int:
    """Peak resident bytes of a fresh process that loads, allocates and runs `path` twice."""
    return int(_child_rss(path, kernels)["hwm"])


def baseline_rss(path: str, kernels: str = "xnnpack", repeats: int = 5) -> int:
    """The smallest peak of `repeats` fresh processes running a trivial model at `path`."""
    return min(peak_rss(path, kernels) for _ in range(repeats))


def baseline_graph():
    """The trivial model `baseline_rss` runs: an ADD of a [1, 1, 1, 4] input with itself."""
    from latpred.builder import GraphBuilder

    b = GraphBuilder("trivial")
    x = b.input((1, 1, 1, 4))
    b.output(b.add(x, x))
    return b.build()


def baseline_bytes(target: str = "host/cpu/fp32/t1") -> int:
    """What the baseline model holds beside the fitted overhead (its buffers): measured peaks
    minus `baseline_rss` are relative to it, so fp32 scoring adds it back
    (`host_cpu.OVERHEAD_FIXED` is fitted above it)."""
    from latpred.memory import predict_memory

    p = predict_memory(baseline_graph(), target)
    return p.total - p.overhead - p.transient
