"""Compare a traced model's live buffers with `latpred.predict_memory`'s breakdown.

    .venv/bin/python scripts/memdiag/compare.py MODEL.tflite /tmp/model.log

Buffers are classed by the first function in their call chain (offsets into the LiteRT
library, named by addr2line) that says what they are: `xnn_get_pointer_to_write_weights`
packed weights, `xnn_plan_memory` the shared workspace, `reshape_igemm` / `reshape_dwconv` /
`reshape_*_pooling2d*` indirection buffers (and average pooling's divisors),
`ResizableAlignedBuffer::Resize` the TFLite arena (allocated with alignment slack). Trace with
MLOG_BT=1 so every allocation has its chain (otherwise only those of 16 KiB or more);
anything else the library holds is "other" (operator objects, runtime arrays: the fitted
overhead). Dev-only (see README.md).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from tracelog import live_at, symbols  # noqa: E402

CLASSES = (("xnn_get_pointer_to_write_weights", "packed"), ("xnn_plan_memory", "workspace"),
           ("reshape_igemm", "indirection"),
           ("reshape_dwconv", "indirection"), ("reshape_max_pooling2d", "indirection"),
           ("reshape_average_pooling2d", "indirection"),
           ("ResizableAlignedBuffer::Resize", "arena"))


def measured(log: str) -> dict[str, list[int]]:
    """Live bytes per class, each allocation's size listed."""
    allocs = [x for x in live_at(log) if x.callers]
    names = symbols(a for x in allocs for a in x.callers)
    out: dict[str, list[int]] = collections.defaultdict(list)
    for x in allocs:
        out[classify([names.get(a, "") for a in x.callers])].append(x.nbytes)
    return out


def classify(chain: list[str]) -> str:
    for name in chain:
        for pattern, cls in CLASSES:
            if pattern in name:
                return cls
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("log")
    ap.add_argument("--target", default="host/cpu/fp32/t1")
    args = ap.parse_args()
    from latpred.memory import predict_memory
    from latpred.tflite import read_tflite

    got = measured(args.log)
    p = predict_memory(read_tflite(args.model), args.target)
    rows = (("packed", p.weights_packed), ("workspace", p.workspace),
            ("indirection", p.indirection), ("arena", p.arena), ("other", None))
    for cls, predicted in rows:
        m = sum(got.get(cls, []))
        pred = f"predicted {predicted:>12,}  diff {predicted - m:+,}" if predicted is not None \
            else f"({len(got.get(cls, []))} allocations, not predicted one by one)"
        print(f"{cls:>11}: traced {m:>12,}  {pred}")
    print("packed weights, traced:   ", sorted(got.get("packed", [])))
    print("packed weights, predicted:", sorted(r.packed_weights for r in p.ops
                                               if r.packed_weights))


if __name__ == "__main__":
    main()
