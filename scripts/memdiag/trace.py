"""Run one .tflite model the way the memory measurement does, under the malloc tracer.

    gcc -shared -fPIC -O2 -o /tmp/mlog.so scripts/memdiag/mlog.c -ldl
    MLOG=/tmp/model.log LD_PRELOAD=/tmp/mlog.so .venv/bin/python scripts/memdiag/trace.py MODEL \
        [--so /tmp/mlog.so] [--kernels xnnpack|builtin]

The steps match `latpred/memory/measure.py` (read the file, `Interpreter(model_content=...)`
at 1 thread, `allocate_tensors`, inputs filled, two `invoke`s); a MARK line goes into the log
after each, so `attribute.py` / `compare.py` can keep what is live after the second run.
Dev-only: nothing in the package imports this.
"""

from __future__ import annotations

import argparse
import ctypes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--so", default="/tmp/mlog.so", help="the built mlog.c (for mlog_mark)")
    ap.add_argument("--kernels", default="xnnpack", choices=("xnnpack", "builtin"))
    args = ap.parse_args()
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    mark = ctypes.CDLL(args.so).mlog_mark
    mark.argtypes = [ctypes.c_char_p]
    with open(args.model, "rb") as f:
        data = f.read()
    mark(b"read")
    resolver = (OpResolverType.AUTO if args.kernels == "xnnpack"
                else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp = Interpreter(model_content=data, num_threads=1,
                         experimental_op_resolver_type=resolver)
    mark(b"interp")
    interp.allocate_tensors()
    mark(b"alloc")
    for d in interp.get_input_details():
        view = interp.tensor(d["index"])()
        view.fill(1)
        del view
    interp.invoke()
    mark(b"invoke1")
    interp.invoke()
    mark(b"invoke2")


if __name__ == "__main__":
    main()
