"""The .tflite written from a from_torch graph with the module's own (folded) weights runs in
LiteRT and computes what torch computes, reads back as the same graph, and deduces."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ai_edge_litert.interpreter import Interpreter
from torch import nn

from latpred.pytorch.export import export_with_weights, to_tflite
from latpred.tflite import read_tflite

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_from_torch as small  # noqa: E402
import test_from_torch_nets as nets  # noqa: E402

torch.set_num_threads(1)

CASES = {   # name: (module maker, input channels, input size)
    "mobilenet_v2_0.35": (lambda: nets.MobileNetV2(100, 0.35), 3, 96),
    "mobilenet_v3_small": (lambda: nets.MobileNetV3Small(100), 3, 64),
    "resnet18_w16": (lambda: nets.ResNet18(100, width=16), 3, 64),
    "efficientnet_b0": (lambda: nets.EfficientNetB0(100), 3, 64),
    "shufflenet_v2_x0.5": (lambda: nets.ShuffleNetV2(100, (24, 48, 96, 192, 1024)), 3, 64),
    "tiny_convnext": (lambda: nets.TinyConvNeXt(10), 3, 64),
    "squeeze_excite": (lambda: small.SE(16), 16, 12),
    "shuffle_block": (lambda: small.Shuffle(), 16, 10),
    "layer_norm": (lambda: small.LN(), 16, 7),
    "layer_norm_affine": (lambda: _affine(small.LN()), 16, 7),
    "residual": (lambda: small.Residual(), 8, 9),
    "pools": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.MaxPool2d(3, 2, 1),
                                    nn.AvgPool2d(3, 1, 1), nn.Hardswish(),
                                    nn.MaxPool2d(3, 2, ceil_mode=True)), 3, 33),
    "spatial_flatten": (lambda: small.Head(nn.AdaptiveAvgPool2d(4), 3, 4), 3, 16),
    "standalone_bn": (lambda: nn.Sequential(nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, 2, 1),
                                            nn.Hardsigmoid()), 4, 8),
    # no bias and no batch norm to fold one in: LiteRT's CONV_2D needs a bias (a zero one)
    "no_bias": (lambda: nn.Sequential(nn.Conv2d(4, 8, 3, 1, 1, bias=False), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False)), 4, 8),
}


def _affine(m: nn.Module) -> nn.Module:
    """Trained-looking layer norms: gamma and beta that are not the identity."""
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-1, 1)
    return m


def run_litert(data: bytes, x: np.ndarray) -> list[np.ndarray]:
    interp = Interpreter(model_content=data)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_litert_computes_what_torch_computes(name):
    make, c, size = CASES[name]
    torch.manual_seed(0)
    m = nets.randomize_bn(make())
    x = torch.randn(1, c, size, size)
    data = to_tflite(m, x)
    with torch.no_grad():
        want = m(x)
    want = want.permute(0, 2, 3, 1) if want.dim() == 4 else want
    (got,) = run_litert(data, x.permute(0, 2, 3, 1).contiguous().numpy())
    scale = float(want.abs().max()) + 1e-6
    assert got.shape == tuple(want.shape)
    assert np.abs(got - want.numpy()).max() / scale < 1e-3


def test_written_file_reads_back_as_the_graph_and_deduces(tmp_path):
    from latpred.deduce import deduce
    from latpred.target import parse_target

    m = nets.randomize_bn(nets.MobileNetV3Small(100))
    x = torch.randn(1, 3, 64, 64)
    graph, data = export_with_weights(m, x)
    path = tmp_path / "m.tflite"
    to_tflite(m, x, path=str(path))
    back = read_tflite(path)
    assert [op.type for op in back.ops] == [op.type for op in graph.ops]
    assert [t.shape for t in back.tensors] == [t.shape for t in graph.tensors]
    assert all(graph.tensors[i].is_constant for i in data)
    for target in ("host/cpu/fp32/t1", "pixel4/gpu/fp16", "pixel4/cpu/fp32/1L"):
        assert deduce(graph, parse_target(target))
