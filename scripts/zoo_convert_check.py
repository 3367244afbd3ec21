"""Dev-time check of latpred.from_torch on the model zoo, against the zoo itself and litert-torch.

Every zoo Graph becomes a torch module (`latpred.pytorch.to_torch`, seed-0 weights, wrapped to
take and give NCHW tensors as a PyTorch model does); then

(a) `from_torch(module, example)` is compared with the zoo Graph it came from, and
(b) litert-torch converts the same module (channels-last I/O, as scripts/torch_convert_check.py
    does) and the file, read by `read_tflite`, is compared with `from_torch(module)`,

each by op sequence (types; types + attributes + output shapes + input shapes up to leading
size-1 axes), the output shapes of the compute ops (convolutions, FC, pools, MEAN), the graph
outputs, multiply-accumulates (`latpred.zoo.mac_count`), parameters (`latpred.zoo.param_count`,
a weight tensor that several ops read counted once per reader) and the latency a GBDT
predictor trained on DATA predicts (`host/cpu/fp32/t1`, `allow_fallback`). Graphs are compared
through `describe(graph)`, a small JSON-able description holding all of the above but latency.

Two steps, in two environments (the converter never enters .venv), and a third that keeps (b)
in the test suite:

1. convert (in the converter venv of docs/pytorch.md; it imports latpred from this tree):
       CONVENV/bin/python scripts/zoo_convert_check.py convert --out /tmp/zooconv [--models ...]
   writes NAME.tflite and NAME.json (input shape, weight checksum, seconds) per model; models
   already converted are skipped (resumable), a failure is reported and the others go on.
2. compare (in .venv):
       .venv/bin/python scripts/zoo_convert_check.py compare --out /tmp/zooconv [--data DIR]
   prints one block per model and writes summary.json and table.md under --out. Models without
   a converter file get (a) only.
3. fixture (in .venv; the models named must all be converted):
       .venv/bin/python scripts/zoo_convert_check.py fixture --out /tmp/zooconv
   writes FIXTURE (tests/fixtures/from_torch/zoo_litert_torch_0.10.json.gz): per model,
   `describe` of litert-torch's file, the input shape and the weight checksum (with `--models`
   or `--subset`, only those entries are replaced). tests/test_pytorch_zoo_fixture.py compares
   from_torch with it (`versus`, compare's (b)) without the converter.

`--models` takes zoo names or families (`--models regnet mobilenet_v3_small`); the default is
the whole zoo, `--subset` one or two models per family (SUBSET).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # latpred from this tree (the converter venv does not install it)
FIXTURE = ROOT / "tests" / "fixtures" / "from_torch" / "zoo_litert_torch_0.10.json.gz"

# one or two per family: the smallest width where the width changes nothing structural
SUBSET = ["mobilenet_v1_1.0", "mobilenet_v2_1.0", "mobilenet_v3_large", "mobilenet_v3_small",
          "mnasnet_b1_1.0", "mnasnet_a1", "efficientnet_b0", "efficientnet_b1",
          "efficientnet_lite0", "fbnet_c", "proxylessnas_mobile", "proxylessnas_gpu",
          "shufflenet_v2_1.0", "squeezenet1_0", "squeezenet1_1", "resnet18", "resnet10_w0.5",
          "regnet_x_400mf", "regnet_y_400mf", "ghostnet_1.0", "densenet121", "googlenet"]
COMPUTE = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D", "AVERAGE_POOL_2D",
           "MEAN")
KEYS = ("stride", "padding", "dilation", "activation", "depth_multiplier", "keep_dims", "axis",
        "filter", "keep_num_dims")


class NCHW(torch.nn.Module):
    """A `to_torch` module (NHWC in and out) as a PyTorch model: NCHW in, NCHW (4-D) out."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x.permute(0, 2, 3, 1))
        return y.permute(0, 3, 1, 2) if y.dim() == 4 else y


def zoo_module(name: str):
    """(zoo Graph, NCHW module with the graph's seed-0 weights, NCHW input shape)."""
    from latpred.pytorch import to_torch
    from latpred.zoo import build

    graph = build(name)
    n, h, w, c = graph.tensors[graph.inputs[0]].shape
    return graph, NCHW(to_torch(graph, seed=0)).eval(), (n, c, h, w)


def checksum(module: torch.nn.Module) -> float:
    return float(sum(p.double().abs().sum() for p in module.state_dict().values()))


def select(names: list[str] | None, subset: bool) -> list[str]:
    from latpred.zoo import ZOO

    if not names:
        return list(SUBSET if subset else ZOO)
    out = []
    for n in names:
        out += [n] if n in ZOO else [k for k, e in ZOO.items() if e.family == n]
    if not out:
        raise SystemExit(f"no zoo model or family among {names}")
    return out


def convert(out: Path, names: list[str], force: bool) -> None:
    from importlib.metadata import version

    import litert_torch

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (out / f"{name}.json").exists() and not force:
            print(f"{name}: already converted", flush=True)
            continue
        t0 = time.time()
        _, m, (n, c, h, w) = zoo_module(name)
        four_d_out = m(torch.randn(n, c, h, w)).dim() == 4
        wrapped = litert_torch.to_channel_last_io(m, args=[0], outputs=[0] if four_d_out
                                                  else None).eval()
        try:
            edge = litert_torch.convert(wrapped, (torch.randn(n, h, w, c),))
            edge.export(str(out / f"{name}.tflite"))
        except Exception as e:   # report and go on with the other models
            print(f"{name}: litert-torch failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        seconds = time.time() - t0
        (out / f"{name}.json").write_text(json.dumps(
            {"input": [n, c, h, w], "checksum": checksum(m), "seconds": round(seconds, 1),
             "litert_torch": version("litert-torch"), "torch": torch.__version__}))
        print(f"{name}: converted in {seconds:.0f} s", flush=True)


def describe(g) -> dict:
    """What `diff` compares of graph `g`, as JSON: each op in execution order as [type,
    attributes among KEYS, input shapes (None for an absent optional input), output shapes],
    the graph outputs' shapes, `mac_count`, parameters and shared weight tensors.

    "params" is `param_count` with a weight tensor that several ops read counted once per
    reader, "shared" the number of such tensors. from_torch and the zoo never share one;
    litert-torch 0.10.0 does, wrongly: it gives some convolutions with weights of one shape the
    weights of another (see docs/pytorch.md), and `param_count` of its file comes out low."""
    from latpred.zoo import mac_count, param_count

    def shape(t: int):
        return list(g.tensors[t].shape) if t >= 0 else None

    readers = Counter(i for op in g.ops for i in set(op.inputs) if i >= 0)
    weights = [i for i, t in enumerate(g.tensors)
               if t.is_constant and t.value is None and t.shape and t.dtype == "float32"]
    extra = sum(g.tensors[i].size * (readers[i] - 1) for i in weights if readers[i] > 1)
    return {"ops": [[op.type, json.loads(json.dumps({k: v for k, v in op.attrs if k in KEYS})),
                     [shape(i) for i in op.inputs], [shape(o) for o in op.outputs]]
                    for op in g.ops],
            "outputs": [shape(t) for t in g.outputs],
            "macs": mac_count(g), "params": param_count(g) + extra,
            "shared": sum(readers[i] > 1 for i in weights)}


def _compute(d: dict) -> list:
    """(type, output shape, attributes but padding, padding) of each compute op."""
    return [(t, outputs[0], json.dumps({k: v for k, v in attrs.items() if k != "padding"},
                                       sort_keys=True), attrs.get("padding"))
            for t, attrs, _, outputs in d["ops"] if t in COMPUTE]


def _broadcast(op: list) -> list:
    """An op of `describe` with its input shapes' leading size-1 axes dropped: a per-channel
    operand as [C] or [1, 1, 1, C] broadcasts alike (inputs that other ops write are compared
    exactly as those ops' outputs)."""
    def strip(s):
        while s and s[0] == 1:
            s = s[1:]
        return s

    return [op[0], op[1], [None if s is None else strip(s) for s in op[2]], op[3]]


def diff(a: dict, b: dict, a_name: str, b_name: str) -> dict:
    """How graph `a` differs from graph `b`, both as `describe` gives them."""
    ta, tb = [op[0] for op in a["ops"]], [op[0] for op in b["ops"]]
    ca, cb = Counter(ta), Counter(tb)
    ka, kb = _compute(a), _compute(b)
    same = [_broadcast(x) == _broadcast(y) for x, y in zip(a["ops"], b["ops"])]
    return {"ops": [len(ta), len(tb)],
            "same_types": ta == tb,
            # types, attributes, output shapes and input shapes up to leading size-1 axes
            "same_ops": ta == tb and all(same),
            "rank_only": sum(x != y for x, y, s in zip(a["ops"], b["ops"], same) if s),
            "same_compute_shapes": [c[:2] for c in ka] == [c[:2] for c in kb],
            "same_compute_attrs": [c[:3] for c in ka] == [c[:3] for c in kb],
            "padding_differs": sum(x[3] != y[3] for x, y in zip(ka, kb))
            if len(ka) == len(kb) else None,
            "same_outputs": a["outputs"] == b["outputs"],
            "macs": [a["macs"], b["macs"]], "params": [a["params"], b["params"]],
            "shared": [a["shared"], b["shared"]],
            "extra": dict(sorted((ca - cb).items())), "missing": dict(sorted((cb - ca).items())),
            "type_diff": list(difflib.unified_diff(tb, ta, b_name, a_name, n=1,
                                                   lineterm=""))[:80]}


def identical(d: dict) -> bool:
    """Whether a `diff` (or `versus`) found nothing that differs."""
    return (d["same_ops"] and d["same_outputs"] and d["macs"][0] == d["macs"][1] and
            d["params"][0] == d["params"][1] and d.get("same_weights", True))


def versus(ours, module: torch.nn.Module, theirs: dict) -> dict:
    """How `from_torch`'s graph `ours` of `module` differs from `theirs`, litert-torch's file of
    the same module as `describe` gives it plus the module's "checksum" at conversion; (b) of
    compare, and the test against FIXTURE."""
    d = diff(describe(ours), theirs, "from_torch", "litert_torch")
    d["same_weights"] = abs(theirs["checksum"] - checksum(module)) <= \
        1e-6 * max(1.0, abs(theirs["checksum"]))
    return d


def from_torch_zoo(name: str):
    """(zoo Graph, NCHW module, from_torch's graph of it) for zoo model `name`."""
    from latpred import from_torch

    zoo, m, shape = zoo_module(name)
    torch.manual_seed(0)
    return zoo, m, from_torch(m, torch.randn(*shape))


def _word(d: dict, a_name: str) -> str:
    """One line: what differs."""
    if identical(d):
        return "identical"
    parts = []
    if d["same_ops"]:
        parts.append("same ops")
    elif d["same_types"]:
        parts.append("same op types, attributes or shapes differ")
    else:
        plus = ", ".join(f"+{v} {k}" for k, v in d["extra"].items())
        minus = ", ".join(f"-{v} {k}" for k, v in d["missing"].items())
        parts.append(f"{a_name}: " + ", ".join(p for p in (plus, minus) if p)
                     if plus or minus else "same op counts, other order")
    parts.append("compute ops' shapes " + ("equal" if d["same_compute_shapes"] else "DIFFER"))
    if d["same_compute_shapes"] and not d["same_compute_attrs"]:
        parts.append("compute ops' attributes (besides padding) DIFFER")
    if d["padding_differs"]:
        parts.append(f"padding differs at {d['padding_differs']} compute ops")
    if d["macs"][0] != d["macs"][1]:
        parts.append(f"MACs {d['macs'][0]:,} vs {d['macs'][1]:,}")
    if d["params"][0] != d["params"][1]:
        parts.append(f"params {d['params'][0]:,} vs {d['params'][1]:,}")
    if not d["same_outputs"]:
        parts.append("graph outputs' shapes DIFFER")
    if not d.get("same_weights", True):
        parts.append("WEIGHTS DIFFER")
    return "; ".join(parts)


def _notes(d: dict, b_name: str) -> str:
    """Notes on what `identical` lets pass: weight tensors that `b` shares between ops, inputs
    whose shapes differ only in leading size-1 axes."""
    n, r = d["shared"][1] - d["shared"][0], d["rank_only"]
    notes = ([f"{b_name} shares {n} weight tensor{'s' * (n > 1)} between ops"] if n > 0 else []) \
        + ([f"{r} op{'s' * (r > 1)}' inputs differ in leading size-1 axes"] if r else [])
    return f" ({'; '.join(notes)})" if notes else ""


def compare(out: Path, names: list[str], data: str) -> None:
    from latpred.predictors import LatencyModel
    from latpred.tflite import read_tflite
    from latpred.zoo import ZOO

    model = LatencyModel.fit(data, "host/cpu/fp32/t1", family="gbdt", search="none")

    def ms(g) -> float:
        return model.predict(g, allow_fallback=True).total_ms

    rows = []
    for name in names:
        zoo, m, ours = from_torch_zoo(name)
        row = {"name": name, "family": ZOO[name].family,
               "a": diff(describe(ours), describe(zoo), "from_torch", "zoo"),
               "predicted_ms": {}}
        row["predicted_ms"]["zoo"], row["predicted_ms"]["from_torch"] = ms(zoo), ms(ours)
        path, meta = out / f"{name}.tflite", out / f"{name}.json"
        if path.exists() and meta.exists():
            info = json.loads(meta.read_text())
            theirs = read_tflite(path)
            row["b"] = versus(ours, m, describe(theirs) | {"checksum": info["checksum"]})
            row["convert_s"] = info.get("seconds")
            row["predicted_ms"]["litert_torch"] = ms(theirs)
            p = row["predicted_ms"]
            row["b"]["latency_diff_pct"] = 100 * (p["from_torch"] - p["litert_torch"]) / \
                p["litert_torch"]
        rows.append(row)
        p = row["predicted_ms"]
        print(f"{name}: (a) from_torch vs zoo: {_word(row['a'], 'from_torch')}; predicted "
              f"{p['from_torch']:.3f} vs {p['zoo']:.3f} ms", flush=True)
        if "b" in row:
            print(f"    (b) from_torch vs litert-torch: {_word(row['b'], 'from_torch')}"
                  f"{_notes(row['b'], 'litert-torch')}; "
                  f"predicted {p['from_torch']:.3f} vs {p['litert_torch']:.3f} ms "
                  f"({row['b']['latency_diff_pct']:+.2f}%)", flush=True)
            if not row["b"]["same_types"]:
                print("\n".join("      " + d for d in row["b"]["type_diff"][:40]))
        else:
            print("    (b) no converter file", flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    (out / "table.md").write_text(table(rows))
    print(f"wrote {out / 'summary.json'} and {out / 'table.md'}")


def fixture(out: Path, names: list[str], path: Path, merge: bool) -> None:
    """Write `path`: per model, `describe` of litert-torch's file in `out`, with the input shape
    and the weight checksum of the converted module (what `versus` needs). With `merge` (some
    models named), the other models' entries of an existing file are kept."""
    from latpred.tflite import read_tflite

    missing = [n for n in names if not (out / f"{n}.tflite").exists()
               or not (out / f"{n}.json").exists()]
    if missing:
        raise SystemExit(f"not converted in {out}: {' '.join(missing)}")
    doc = load_fixture(path) if merge and path.exists() else {"models": {}}
    versions = set()
    for name in names:
        info = json.loads((out / f"{name}.json").read_text())
        doc["models"][name] = {"input": info["input"], "checksum": info["checksum"],
                               **describe(read_tflite(out / f"{name}.tflite"))}
        versions.add("litert-torch {} (torch {})".format(info.get("litert_torch", "?"),
                                                         info.get("torch", "?")))
        print(f"{name}: {len(doc['models'][name]['ops'])} ops", flush=True)
    versions |= {doc["converter"]} if "converter" in doc else set()
    if len(versions) != 1:
        raise SystemExit(f"converted by more than one converter version: {sorted(versions)}")
    doc = {"converter": versions.pop(),
           "made_by": "scripts/zoo_convert_check.py fixture",
           "models": dict(sorted(doc["models"].items(), key=lambda kv: _order(kv[0])))}
    text = json.dumps(doc, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)
    print(f"wrote {path}: {len(doc['models'])} models, {path.stat().st_size:,} bytes "
          f"({len(text):,} as JSON)")


def _order(name: str) -> int:
    from latpred.zoo import ZOO

    return list(ZOO).index(name)


def load_fixture(path: Path = FIXTURE) -> dict:
    """The fixture `fixture` wrote (gzipped JSON if its name ends in .gz)."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def _counts(d: dict) -> str:
    plus = [f"+{v} {k}" for k, v in d["extra"].items()]
    minus = [f"-{v} {k}" for k, v in d["missing"].items()]
    return ", ".join(plus + minus) or ("none" if d["same_types"] else "order")


def table(rows: list[dict]) -> str:
    """The Markdown table of docs/pytorch.md ("The zoo through litert-torch")."""
    lines = ["| model | ops zoo / from_torch / litert-torch | from_torch vs litert-torch | "
             "from_torch vs zoo: ops | MFLOPs, params (all three) | predicted ms zoo / "
             "from_torch / litert-torch | diff vs litert-torch, vs zoo |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b, p = r["a"], r.get("b"), r["predicted_ms"]
        ops = f"{a['ops'][1]} / {a['ops'][0]} / {b['ops'][1] if b else '-'}"
        same = (lambda d: d["macs"][0] == d["macs"][1] and d["params"][0] == d["params"][1])
        totals = (f"equal: {2 * a['macs'][1] / 1e6:,.0f}, {a['params'][1]:,}"
                  if same(a) and (b is None or same(b)) else "DIFFER (see summary.json)")
        vs_b = _word(b, "from_torch") + _notes(b, "litert-torch") if b else "not converted"
        lt = f"{p['litert_torch']:.3f}" if b else "-"
        da = 100 * (p["from_torch"] - p["zoo"]) / p["zoo"]
        db = f"{b['latency_diff_pct']:+.2f}%" if b else "-"
        lines.append(f"| {r['name']} | {ops} | {vs_b} | {_counts(a)} | {totals} | "
                     f"{p['zoo']:.3f} / {p['from_torch']:.3f} / {lt} | {db}, {da:+.2f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("convert", "compare", "fixture"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", nargs="*", help="zoo names or families (default: all)")
    ap.add_argument("--subset", action="store_true", help="one or two models per family")
    ap.add_argument("--force", action="store_true", help="convert again what was converted")
    ap.add_argument("--data", default=str(ROOT / "datasets" / "host-cpu-synthetic-sequential"))
    ap.add_argument("--fixture", type=Path, default=FIXTURE, help="fixture: the file to write")
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = select(args.models, args.subset)
    if args.step == "convert":
        convert(args.out, names, args.force)
    elif args.step == "compare":
        compare(args.out, names, args.data)
    else:
        fixture(args.out, names, args.fixture, merge=bool(args.models or args.subset))


if __name__ == "__main__":
    main()
