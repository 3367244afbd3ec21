"""from_torch against what a real converter wrote: litert-torch 0.10.0 (torch 2.13.0, in its own
venv; scripts/torch_convert_check.py) converted the reference nets with channels-last I/O, and
tests/fixtures/from_torch/litert_torch_0.10.json keeps each file's op sequence (type,
attributes, output shapes), FLOPs and parameters as latpred reads them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from latpred import from_torch
from latpred.inspect_model import op_rows, totals

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_from_torch as small  # noqa: E402
import test_from_torch_nets as nets  # noqa: E402

torch.set_num_threads(1)
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "from_torch" /
                      "litert_torch_0.10.json").read_text())
NETS = {
    "mobilenet_v2": (lambda: nets.MobileNetV2(), (1, 3, 224, 224)),
    "mobilenet_v3_small": (lambda: nets.MobileNetV3Small(), (1, 3, 224, 224)),
    "resnet18": (lambda: nets.ResNet18(), (1, 3, 224, 224)),
    "efficientnet_b0": (lambda: nets.EfficientNetB0(), (1, 3, 224, 224)),
    "shufflenet_v2_x1_0": (lambda: nets.ShuffleNetV2(), (1, 3, 224, 224)),
    "tiny_convnext": (lambda: nets.TinyConvNeXt(), (1, 3, 64, 64)),
    "shuffle_block": (lambda: small.Shuffle(), (1, 16, 10, 10)),
    "layer_norm": (lambda: small.LN(), (1, 16, 7, 7)),
    "residual": (lambda: small.Residual(), (1, 8, 9, 9)),
    "stride2_even": (lambda: torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, 2, 1),
                                                 torch.nn.ReLU6()), (1, 4, 16, 16)),
    "maxpool_pad": (lambda: torch.nn.MaxPool2d(3, 2, 1), (1, 4, 16, 16)),
    "spatial_flatten": (lambda: small.Head(torch.nn.AdaptiveAvgPool2d(4), 3, 4),
                        (1, 3, 16, 16)),
}
# "residual" subtracts x.mean((2, 3), keepdim=True): litert-torch drops keep_dims there (the
# NHWC broadcast still works), so only its op types are compared.
SAME = [n for n in NETS if n != "residual"]
KEYS = ("stride", "padding", "dilation", "activation", "depth_multiplier", "keep_dims", "axis",
        "filter", "keep_num_dims")


def summary(name: str) -> tuple[list, dict]:
    make, shape = NETS[name]
    torch.manual_seed(0)
    g = from_torch(nets.randomize_bn(make()), torch.randn(*shape))
    ops = [[op.type, json.loads(json.dumps({k: v for k, v in op.attrs if k in KEYS})),
            [list(g.tensors[o].shape) for o in op.outputs]] for op in g.ops]
    return ops, totals(g, op_rows(g))


@pytest.mark.parametrize("name", SAME)
def test_op_sequence_flops_and_parameters_equal_litert_torch(name):
    ours, t = summary(name)
    theirs = FIXTURE[name]
    assert [o[0] for o in ours] == [o[0] for o in theirs["ops"]]
    for (kind, attrs, shapes), (_, their_attrs, their_shapes) in zip(ours, theirs["ops"]):
        assert shapes == their_shapes, kind
        assert attrs == {k: v for k, v in their_attrs.items() if k in attrs}, kind
    assert (t["flops"], t["params"]) == (theirs["flops"], theirs["params"])


def test_keepdim_mean_op_types_equal_litert_torch():
    ours, _ = summary("residual")
    assert [o[0] for o in ours] == [o[0] for o in FIXTURE["residual"]["ops"]]
