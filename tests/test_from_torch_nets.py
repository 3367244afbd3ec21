"""Reference PyTorch CNNs written as torchvision writes them (torchvision cannot be installed
beside the CPU torch of .venv), checked against torchvision's published parameter counts, and
their from_torch graphs checked against the torch modules: parameters after batch-norm folding,
multiply-accumulates against the published figures, output shapes, op types.

Other from_torch tests and scripts/torch_convert_check.py import the nets from here.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

torch.set_num_threads(1)


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = divisor if min_value is None else min_value
    new = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvBNAct(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
                 act=nn.ReLU6, dilation: int = 1, bn=nn.BatchNorm2d):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2 * dilation, dilation, groups,
                            bias=False), bn(cout)]
        if act is not None:
            layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.Hardswish,
                                                       nn.SiLU) else act())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, cin: int, squeeze: int, act=nn.ReLU, scale=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(cin, squeeze, 1), nn.Conv2d(squeeze, cin, 1)
        self.activation, self.scale_activation = act(), scale()

    def forward(self, x):
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


# -- MobileNetV2 ------------------------------------------------------------------------------
class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: float):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res = stride == 1 and inp == oup
        layers = [ConvBNAct(inp, hidden, 1)] if expand_ratio != 1 else []
        layers += [ConvBNAct(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0):
        super().__init__()
        settings = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                    [6, 160, 3, 2], [6, 320, 1, 1]]
        cin = make_divisible(32 * width_mult)
        last = make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNAct(3, cin, stride=2)]
        for t, c, n, s in settings:
            out = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, out, s if i == 0 else 1, t))
                cin = out
        features.append(ConvBNAct(cin, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# -- MobileNetV3-Small -------------------------------------------------------------------------
_V3_SMALL = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
             (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
             (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
             (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
             (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
             (96, 5, 576, 96, True, "HS", 1)]


class V3Block(nn.Module):
    def __init__(self, cin, k, exp, out, se, act, stride, bn):
        super().__init__()
        act = nn.Hardswish if act == "HS" else nn.ReLU
        self.use_res = stride == 1 and cin == out
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act, bn=bn))
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=act, bn=bn))
        if se:
            layers.append(SqueezeExcitation(exp, make_divisible(exp // 4), scale=nn.Hardsigmoid))
        layers.append(ConvBNAct(exp, out, 1, act=None, bn=bn))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        bn = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [ConvBNAct(3, 16, 3, 2, act=nn.Hardswish, bn=bn)]
        layers += [V3Block(*cfg, bn=bn) for cfg in _V3_SMALL]
        layers.append(ConvBNAct(96, 576, 1, act=nn.Hardswish, bn=bn))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(inplace=True),
                                        nn.Dropout(0.2, inplace=True),
                                        nn.Linear(1024, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- ResNet-18 ---------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i, c in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stages.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2),
                                        BasicBlock(c, c, 1)))
            cin = c
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# -- EfficientNet-B0 ---------------------------------------------------------------------------
_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
       (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]


class MBConv(nn.Module):
    def __init__(self, expand: int, k: int, stride: int, cin: int, cout: int):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        exp = make_divisible(cin * expand)
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=nn.SiLU))
        layers += [ConvBNAct(exp, exp, k, stride, groups=exp, act=nn.SiLU),
                   SqueezeExcitation(exp, max(1, cin // 4), act=partial(nn.SiLU, inplace=True)),
                   ConvBNAct(exp, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class EfficientNetB0(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [ConvBNAct(3, 32, 3, 2, act=nn.SiLU)]
        for expand, k, stride, cin, cout, n in _B0:
            stage = [MBConv(expand, k, stride if i == 0 else 1, cin if i == 0 else cout, cout)
                     for i in range(n)]
            layers.append(nn.Sequential(*stage))
        layers.append(ConvBNAct(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True),
                                        nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- ShuffleNetV2 x1.0 -------------------------------------------------------------------------
def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    return torch.transpose(x, 1, 2).contiguous().view(b, -1, h, w)


class ShuffleBlock(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int):
        super().__init__()
        self.stride, bf = stride, oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp),
                nn.Conv2d(inp, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf),
            nn.ReLU(inplace=True), nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False),
            nn.BatchNorm2d(bf), nn.Conv2d(bf, bf, 1, bias=False), nn.BatchNorm2d(bf),
            nn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, channels=(24, 116, 232, 464, 1024)):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, channels[0], 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(channels[0]), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = channels[0], []
        for repeats, c in zip((4, 8, 4), channels[1:4]):
            stages.append(nn.Sequential(ShuffleBlock(cin, c, 2),
                                        *[ShuffleBlock(c, c, 1) for _ in range(repeats - 1)]))
            cin = c
        self.stage2, self.stage3, self.stage4 = stages
        self.conv5 = nn.Sequential(nn.Conv2d(cin, channels[4], 1, bias=False),
                                   nn.BatchNorm2d(channels[4]), nn.ReLU(inplace=True))
        self.fc = nn.Linear(channels[4], num_classes)

    def forward(self, x):
        x = self.stage4(self.stage3(self.stage2(self.maxpool(self.conv1(x)))))
        return self.fc(self.conv5(x).mean([2, 3]))


# -- a small ConvNeXt ------------------------------------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(dim, dim, 7, padding=3, groups=dim),
                                   Permute((0, 2, 3, 1)), nn.LayerNorm(dim, eps=1e-6),
                                   nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                   Permute((0, 3, 1, 2)))
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)

    def forward(self, x):
        return self.layer_scale * self.block(x) + x


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = list(dims)

    def forward(self, x):
        return torch.permute(x, self.dims)


class TinyConvNeXt(nn.Module):
    def __init__(self, num_classes: int = 10, dims=(32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        self.stage1 = CNBlock(dims[0])
        self.down = nn.Sequential(LayerNorm2d(dims[0], eps=1e-6), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = CNBlock(dims[1])
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(LayerNorm2d(dims[1], eps=1e-6), nn.Flatten(1),
                                  nn.Linear(dims[1], num_classes))

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.avgpool(x))


# torchvision's published parameter counts (torchvision.models docs, weights tables).
PUBLISHED = {"mobilenet_v2": (MobileNetV2, 3_504_872), "mobilenet_v3_small":
             (MobileNetV3Small, 2_542_856), "resnet18": (ResNet18, 11_689_512),
             "efficientnet_b0": (EfficientNetB0, 5_288_548),
             "shufflenet_v2_x1_0": (ShuffleNetV2, 2_278_604)}


def randomize_bn(m: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial batch-norm statistics and affine parameters, so that folding is tested."""
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            c = mod.num_features
            mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
            mod.weight.data.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
            mod.bias.data.copy_(torch.randn(c, generator=g) * 0.1)
    return m.eval()


def folded_params(m: nn.Module) -> int:
    """sum(p.numel()) after folding every batch norm into the bias-less conv before it: the
    BN's 2C parameters become the conv's C-element bias."""
    bn = sum(mod.num_features for mod in m.modules() if isinstance(mod, nn.BatchNorm2d))
    return sum(p.numel() for p in m.parameters()) - bn


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_reference_nets_have_torchvisions_parameter_counts(name):
    cls, published = PUBLISHED[name]
    assert sum(p.numel() for p in cls().parameters()) == published


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_from_torch_parameters_macs_and_output_at_224(name):
    from latpred import from_torch
    from latpred.zoo.common import mac_count, param_count

    m = PUBLISHED[name][0]().eval()
    x = torch.randn(1, 3, 224, 224)
    g = from_torch(m, x)
    assert param_count(g) == folded_params(m)
    assert [g.tensors[t].shape for t in g.outputs] == [(1, 1000)]
    macs = {"mobilenet_v2": 300.8e6, "resnet18": 1.8136e9}   # MobileNetV2 paper; torchvision
    if name in macs:
        assert mac_count(g) == pytest.approx(macs[name], rel=5e-3)
    types = set(g.op_types())
    assert "FULLY_CONNECTED" in types and "MEAN" in types
    assert not types & {"RELU", "RELU6"}        # all fused into their producers


def test_tiny_convnext_parameters_and_shape():
    from latpred import from_torch
    from latpred.zoo.common import param_count

    m = TinyConvNeXt().eval()
    g = from_torch(m, torch.randn(1, 3, 64, 64))
    # each block's layer_scale (C) folds into the FULLY_CONNECTED before it, and the layer
    # norms' identity gamma (ones) and beta (zeros) fold away, as litert-torch does
    scales = sum(b.layer_scale.numel() for b in (m.stage1, m.stage2))
    norms = sum(mod.weight.numel() + mod.bias.numel() for mod in m.modules()
                if isinstance(mod, nn.LayerNorm))
    assert param_count(g) == sum(p.numel() for p in m.parameters()) - scales - norms
    assert [g.tensors[t].shape for t in g.outputs] == [(1, 10)]
    assert g.op_types().get("GELU") == 2 and g.op_types().get("RSQRT") == 5
