"""What a traced model holds after its second run, grouped by the TFLite / XNNPACK functions
that allocated it (largest groups first).

    .venv/bin/python scripts/memdiag/attribute.py /tmp/model.log [--depth 3] [--top 40]

Dev-only (see README.md).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tracelog import live_at, symbols  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--depth", type=int, default=3, help="callers per group")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    allocs = live_at(args.log)
    names = symbols(a for x in allocs for a in x.callers[:args.depth])
    groups: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for x in allocs:
        key = (x.stage,) + tuple(names.get(a, a)[:60] for a in x.callers[:args.depth])
        groups[key][0] += x.nbytes
        groups[key][1] += 1
    print(f"live after the second run (made after reading the file): "
          f"{sum(g[0] for g in groups.values()):,} bytes")
    for key, (nbytes, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{nbytes:>12,} {count:>5}  " + " <- ".join(key))


if __name__ == "__main__":
    main()
