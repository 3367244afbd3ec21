"""Resident memory (VmHWM, VmRSS) and glibc's heap figures (mallinfo2) after each step of
the measuring process, as JSON: where a model's peak comes from, without the tracer.

    .venv/bin/python scripts/memdiag/stages.py MODEL [--kernels xnnpack|builtin]

Dev-only (see README.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                .split()]


def snapshot(libc) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    m = libc.mallinfo2()
    out.update(heap=m.arena, in_use=m.uordblks, free=m.fordblks, mmapped=m.hblkhd,
               n_mmapped=m.hblks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--kernels", default="xnnpack", choices=("xnnpack", "builtin"))
    args = ap.parse_args()
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    steps = {"start": snapshot(libc)}
    with open(args.model, "rb") as f:
        data = f.read()
    steps["read"] = snapshot(libc)
    resolver = (OpResolverType.AUTO if args.kernels == "xnnpack"
                else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp = Interpreter(model_content=data, num_threads=1,
                         experimental_op_resolver_type=resolver)
    steps["interp"] = snapshot(libc)
    interp.allocate_tensors()
    steps["alloc"] = snapshot(libc)
    for d in interp.get_input_details():
        view = interp.tensor(d["index"])()
        view.fill(1)
        del view
    interp.invoke()
    steps["invoke1"] = snapshot(libc)
    interp.invoke()
    steps["invoke2"] = snapshot(libc)
    print(json.dumps(steps))


if __name__ == "__main__":
    main()
