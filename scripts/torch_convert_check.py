"""Dev-time check of latpred.from_torch against a real PyTorch-to-TFLite converter.

Two steps, in two environments (the converter never enters .venv):

1. convert (in a converter venv with torch==2.13.0 and litert-torch; see docs/pytorch.md):
       CONVENV/bin/python scripts/torch_convert_check.py convert --out /tmp/conv
   converts the reference nets of tests/test_from_torch_nets.py with litert-torch (inputs made
   channels-last with litert_torch.to_channel_last_io, as a deployment does) and writes
   NAME.tflite, NAME.pt (state dict) and NAME.json (input shape) per net.
2. compare (in .venv):
       .venv/bin/python scripts/torch_convert_check.py compare --out /tmp/conv [--data DIR]
   rebuilds each net with the saved weights, runs from_torch, reads the converter's file with
   read_tflite and compares op sequences (a diff), output shapes, FLOPs, parameters and the
   latency a predictor trained on DIR (default datasets/host-cpu-synthetic-sequential, GBDT)
   predicts for both; prints one row per net and writes summary.json.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(1, str(ROOT))   # the tests import latpred (lazily: no extra packages)

NETS = {   # name: (maker over the tests' nets and small-module modules, NCHW input shape)
    "mobilenet_v2": (lambda n, s: n.MobileNetV2(), (1, 3, 224, 224)),
    "mobilenet_v3_small": (lambda n, s: n.MobileNetV3Small(), (1, 3, 224, 224)),
    "resnet18": (lambda n, s: n.ResNet18(), (1, 3, 224, 224)),
    "efficientnet_b0": (lambda n, s: n.EfficientNetB0(), (1, 3, 224, 224)),
    "shufflenet_v2_x1_0": (lambda n, s: n.ShuffleNetV2(), (1, 3, 224, 224)),
    "tiny_convnext": (lambda n, s: n.TinyConvNeXt(), (1, 3, 64, 64)),
    "mobilenet_v2_0.35_96": (lambda n, s: n.MobileNetV2(1000, 0.35), (1, 3, 96, 96)),
    "squeeze_excite": (lambda n, s: s.SE(16), (1, 16, 12, 12)),
    "shuffle_block": (lambda n, s: s.Shuffle(), (1, 16, 10, 10)),
    "layer_norm": (lambda n, s: s.LN(), (1, 16, 7, 7)),
    "residual": (lambda n, s: s.Residual(), (1, 8, 9, 9)),
    "stride2_even": (lambda n, s: torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, 2, 1),
                                                      torch.nn.ReLU6()), (1, 4, 16, 16)),
    "maxpool_pad": (lambda n, s: torch.nn.MaxPool2d(3, 2, 1), (1, 4, 16, 16)),
    "spatial_flatten": (lambda n, s: s.Head(torch.nn.AdaptiveAvgPool2d(4), 3, 4),
                        (1, 3, 16, 16)),
}


def build(name: str) -> torch.nn.Module:
    import test_from_torch as small
    import test_from_torch_nets as nets

    torch.manual_seed(0)
    return nets.randomize_bn(NETS[name][0](nets, small))


def convert(out: Path, names: list[str]) -> None:
    import litert_torch

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        m = build(name)
        n, c, h, w = NETS[name][1]
        torch.save(m.state_dict(), out / f"{name}.pt")
        four_d_out = m(torch.randn(n, c, h, w)).dim() == 4
        wrapped = litert_torch.to_channel_last_io(m, args=[0], outputs=[0] if four_d_out
                                                  else None).eval()
        try:
            edge = litert_torch.convert(wrapped, (torch.randn(n, h, w, c),))
            edge.export(str(out / f"{name}.tflite"))
        except Exception as e:   # report and go on with the other nets
            print(f"{name}: litert-torch failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        (out / f"{name}.json").write_text(json.dumps({"input": [n, c, h, w]}))
        print(f"{name}: converted", flush=True)


def _summary(graph) -> dict:
    from latpred.inspect_model import op_rows, totals

    t = totals(graph, op_rows(graph))
    return {"ops": [op.type for op in graph.ops], "flops": t["flops"], "params": t["params"],
            "outputs": t["outputs"], "inputs": t["inputs"]}


def compare(out: Path, names: list[str], data: str) -> None:
    from latpred import from_torch
    from latpred.predictors import LatencyModel
    from latpred.tflite import read_tflite

    model = LatencyModel.fit(data, "host/cpu/fp32/t1", family="gbdt", search="none")
    rows = []
    for name in names:
        path = out / f"{name}.tflite"
        if not path.exists():
            print(f"{name}: no converter file")
            continue
        m = build(name)
        m.load_state_dict(torch.load(out / f"{name}.pt", weights_only=True))
        shape = json.loads((out / f"{name}.json").read_text())["input"]
        ours, theirs = from_torch(m, torch.randn(*shape)), read_tflite(path)
        a, b = _summary(ours), _summary(theirs)
        pa = model.predict(ours, allow_fallback=True).total_ms
        pb = model.predict(theirs, allow_fallback=True).total_ms
        diff = [d for d in difflib.unified_diff(b["ops"], a["ops"], "converter", "from_torch",
                                                n=1, lineterm="")]
        row = {"name": name, "ops": [len(a["ops"]), len(b["ops"])],
               "same_op_sequence": a["ops"] == b["ops"], "flops": [a["flops"], b["flops"]],
               "params": [a["params"], b["params"]], "outputs": [a["outputs"], b["outputs"]],
               "predicted_ms": [pa, pb], "latency_diff_pct": 100 * (pa - pb) / pb,
               "op_diff": diff[:60]}
        rows.append(row)
        print(f"{name}: ops {len(a['ops'])} vs {len(b['ops'])} (same sequence: "
              f"{row['same_op_sequence']}), FLOPs {a['flops']:,} vs {b['flops']:,}, params "
              f"{a['params']:,} vs {b['params']:,}, outputs {a['outputs']} vs {b['outputs']}, "
              f"predicted {pa:.3f} vs {pb:.3f} ms ({row['latency_diff_pct']:+.2f}%)", flush=True)
        if diff:
            print("\n".join("    " + d for d in diff[:40]))
    (out / "summary.json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("convert", "compare"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--nets", nargs="*", default=list(NETS))
    ap.add_argument("--data", default=str(ROOT / "datasets" / "host-cpu-synthetic-sequential"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.step == "convert":
        convert(args.out, args.nets)
    else:
        compare(args.out, args.nets, args.data)


if __name__ == "__main__":
    main()
