"""Score `latpred.predict_memory` on the int8 memory set (docs/memory.md, "int8 models").

    python scripts/memory_dataset.py --precision int8 --out datasets/host-cpu-memory-int8 \
        --models out/memory-models-int8 --n-synthetic 40 --n-converter 0 --no-corpus
    python scripts/memory_eval_int8.py datasets/host-cpu-memory-int8 out/memory-models-int8 \
        --cpu-level amx

The second argument is the folder `memory_dataset.py` wrote the int8 files to (since
session 20 the writer gives the same bytes for the same seed on nearly any CPU, so a rerun of the first command
writes them again without measuring what is already in the dataset). Prints the built-in and
XNNPACK arenas against the runtime's and the totals against the measured peak, and writes
the per-model rows to a CSV (`--csv`; default out/memory_int8_score.csv). `--cpu-level` plans
as the measuring CPU did when that is not this one (`xnnpack_configs.LEVELS`:
host-cpu-memory-int8 was measured with AMX, host-cpu-memory-int8-vm4 with AVX-512 VNNI).
Dev-only: LiteRT does not run.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pandas as pd

from latpred.memory import largest_layer, naive_sum, predict_memory
from latpred.memory.host_cpu import eight_bit_fixed
from latpred.memory.xnnpack_configs import LEVELS, for_cpu
from latpred.tflite import read_tflite

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("data")
ap.add_argument("models")
ap.add_argument("--csv", default="out/memory_int8_score.csv")
ap.add_argument("--cpu-level", choices=sorted(LEVELS), default=None)
args = ap.parse_args()
pinned = contextlib.ExitStack()      # kept: the level holds for the whole script
if args.cpu_level:
    pinned.enter_context(for_cpu(args.cpu_level))
d = pd.read_parquet(args.data + "/models.parquet")
models = Path(args.models)
rows = []
for r in d.itertuples():
    src, name = r.model_id.split("/")
    p = models / src / f"{name}.tflite"
    g = read_tflite(p)
    m = predict_memory(g, "host/cpu/int8/t1", model_bytes=p.stat().st_size)
    mb = predict_memory(g, "host/cpu/int8/t1", kernels="builtin", model_bytes=p.stat().st_size)
    rows.append(dict(model=r.model_id, src=src, rss=r.rss_delta, pred=m.total, ab=r.arena_builtin, pab=mb.arena, ax=r.arena_xnnpack, pax=m.arena,
                     packed=m.weights_packed, ws=m.workspace, ind=m.indirection, mbytes=m.model_bytes,
                     naive=naive_sum(g), largest=largest_layer(g)))
x = pd.DataFrame(rows)
x["err"] = (x.pred - x.rss) / x.rss * 100
ok = x[x.rss > 0]
print("n", len(x), "rss ok", len(ok))
print("builtin arena exact:", int((x.ab == x.pab).sum()), "of", int((x.ab >= 0).sum()))
print("xnnpack arena exact:", int((x.ax == x.pax).sum()), "of", int((x.ax >= 0).sum()))
print("total within 5%:", round((ok.err.abs() <= 5).mean() * 100, 1), "%  MdAPE", round(ok.err.abs().median(), 2), " median signed", round(ok.err.median(), 2))
print(ok.groupby("src").err.describe().round(1))
for base in ("naive", "largest"):
    e = ((ok[base] - ok.rss) / ok.rss).abs() * 100
    print(f"{base}: MdAPE {e.median():.1f}% ({e.median() / ok.err.abs().median():.0f}x the "
          f"prediction's), within 5%: {(e <= 5).mean() * 100:.1f}%")
# the int8 fixed term (host_cpu.eight_bit_fixed) fitted on one half, scored on the other
base = ok.pred - eight_bit_fixed()
for name, fit in (("even", ok.index % 2 == 0), ("odd", ok.index % 2 == 1)):
    c = (ok.rss - base)[fit].median()
    e = ((base + c - ok.rss) / ok.rss)[~fit].abs() * 100
    print(f"fitted on the {name} rows ({c:,.0f} B), the others within 5%: "
          f"{(e <= 5).mean() * 100:.1f}%, MdAPE {e.median():.2f}%")
x.to_csv(Path(args.csv), index=False)

# NAS candidates: the float graph rebuilt from each row's arch, on the int8 target (planned as
# the int8 model latpred writes of it; the model buffer estimated from the graph, no file)
import json  # noqa: E402

from latpred.sampler import build_graph  # noqa: E402

e = pd.Series([(predict_memory(build_graph(json.loads(r.arch)), "host/cpu/int8/t1").total -
                r.rss_delta) / r.rss_delta * 100 for r in d.itertuples() if r.rss_delta > 0])
print(f"float graphs on the int8 target: within 5% {(e.abs() <= 5).mean() * 100:.1f}%, "
      f"MdAPE {e.abs().median():.2f}%, median signed {e.median():+.2f}%")
