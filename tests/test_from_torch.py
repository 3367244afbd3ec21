"""latpred.from_torch: the op sequence, attributes and shapes a converter writes for each
PyTorch layer pattern, from torch.export's ATen graph."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from latpred import from_torch
from latpred.errors import LatpredError, UnsupportedOpError

torch.set_num_threads(1)


def ops(g):
    return [op.type for op in g.ops]


def only(g, kind):
    found = [op for op in g.ops if op.type == kind]
    assert len(found) == 1, ops(g)
    return found[0]


def nhwc(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.permute(0, 2, 3, 1).shape) if t.dim() == 4 else tuple(t.shape)


def check_output_shape(m: nn.Module, x: torch.Tensor):
    g = from_torch(m, x)
    with torch.no_grad():
        y = m.eval()(x)
    ys = y if isinstance(y, tuple) else (y,)
    assert [g.tensors[t].shape for t in g.outputs] == [nhwc(v) for v in ys]
    assert [g.tensors[t].shape for t in g.inputs] == [nhwc(x)]
    return g


def test_conv_bn_relu_folds_into_one_conv():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    g = check_output_shape(m, torch.randn(1, 3, 16, 16))
    assert ops(g) == ["CONV_2D"]
    conv = g.ops[0]
    assert conv.activation == "RELU" and conv.attr("padding") == "SAME"
    assert g.tensors[conv.inputs[1]].shape == (8, 3, 3, 3) and conv.inputs[2] >= 0


@pytest.mark.parametrize("size, expected", [(16, ["PAD", "CONV_2D"]), (15, ["CONV_2D"])])
def test_strided_padding_is_same_only_where_tflite_pads_like_torch(size, expected):
    # 3x3 stride 2 pad 1: on an even input SAME pads (0, 1), torch (1, 1): PAD + VALID.
    m = nn.Sequential(nn.Conv2d(4, 8, 3, 2, 1), nn.ReLU6())
    g = check_output_shape(m, torch.randn(1, 4, size, size))
    assert ops(g) == expected
    conv = only(g, "CONV_2D")
    assert conv.activation == "RELU6"
    assert conv.attr("padding") == ("VALID" if len(expected) == 2 else "SAME")
    if len(expected) == 2:
        assert g.tensors[g.ops[0].inputs[1]].value == (0, 0, 1, 1, 1, 1, 0, 0)


def test_asymmetric_and_unusual_padding_is_an_explicit_pad():
    m = nn.Conv2d(4, 4, (3, 5), padding=(2, 1))
    g = check_output_shape(m, torch.randn(1, 4, 10, 10))
    assert ops(g) == ["PAD", "CONV_2D"]
    assert g.tensors[g.ops[0].inputs[1]].value == (0, 0, 2, 2, 1, 1, 0, 0)


def test_depthwise_grouped_dilated_and_multiplier_convolutions():
    x = torch.randn(1, 16, 12, 12)
    g = check_output_shape(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), x)
    dw = only(g, "DEPTHWISE_CONV_2D")
    assert dw.attr("depth_multiplier") == 1 and g.tensors[dw.inputs[1]].shape == (1, 3, 3, 16)
    g = check_output_shape(nn.Conv2d(16, 32, 3, padding=2, dilation=2, groups=16), x)
    dw = only(g, "DEPTHWISE_CONV_2D")
    assert dw.attr("depth_multiplier") == 2 and dw.attr("dilation") == (2, 2)
    assert dw.attr("padding") == "SAME"
    g = check_output_shape(nn.Conv2d(16, 32, 1, groups=4), x)
    conv = only(g, "CONV_2D")
    assert conv.attr("groups") == 4 and g.tensors[conv.inputs[1]].shape == (32, 1, 1, 4)


@pytest.mark.parametrize("act, expected", [
    (nn.Hardswish(), ["CONV_2D", "HARD_SWISH"]),
    (nn.SiLU(), ["CONV_2D", "LOGISTIC", "MUL"]),
    (nn.Sigmoid(), ["CONV_2D", "LOGISTIC"]),
    (nn.Tanh(), ["CONV_2D", "TANH"]),
    (nn.GELU(), ["CONV_2D", "GELU"]),
    (nn.Hardsigmoid(), ["CONV_2D", "MUL"]),      # +3 folded into the bias, RELU6 fused
    (nn.LeakyReLU(0.1), ["CONV_2D", "LEAKY_RELU"]),
    (nn.ReLU6(), ["CONV_2D"]),
])
def test_activations(act, expected):
    m = nn.Sequential(nn.Conv2d(3, 8, 1), act)
    g = check_output_shape(m, torch.randn(1, 3, 8, 8))
    assert ops(g) == expected
    if isinstance(act, nn.Hardsigmoid):
        assert g.ops[0].activation == "RELU6"


class SE(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


def test_squeeze_excite_is_the_converters_sequence():
    g = check_output_shape(SE(16), torch.randn(1, 16, 8, 8))
    # hard-sigmoid's +3 folds into the expand conv's bias and its RELU6 into the conv, as
    # litert-torch writes MobileNetV3's SE
    assert ops(g) == ["MEAN", "CONV_2D", "CONV_2D", "MUL", "MUL"]
    assert g.ops[0].attr("keep_dims") is True and g.ops[1].activation == "RELU"
    assert g.ops[2].activation == "RELU6"
    assert g.tensors[g.ops[0].inputs[1]].value == (1, 2)


class Head(nn.Module):
    def __init__(self, pool: nn.Module, c: int, hw: int):
        super().__init__()
        self.pool, self.drop, self.fc = pool, nn.Dropout(0.5), nn.Linear(c * hw * hw, 10)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(self.pool(x), 1)))


def test_global_pool_flatten_linear():
    g = check_output_shape(Head(nn.AdaptiveAvgPool2d(1), 32, 1), torch.randn(1, 32, 7, 7))
    assert ops(g) == ["MEAN", "FULLY_CONNECTED"]          # the flatten folds into the MEAN
    assert g.ops[0].attr("keep_dims") is False
    assert g.tensors[g.ops[0].outputs[0]].shape == (1, 32)


def test_flatten_of_a_spatial_map_transposes_to_torch_order_first():
    g = check_output_shape(Head(nn.AdaptiveAvgPool2d(7), 8, 7), torch.randn(1, 8, 14, 14))
    assert ops(g) == ["AVERAGE_POOL_2D", "TRANSPOSE", "RESHAPE", "FULLY_CONNECTED"]
    assert g.tensors[g.ops[1].inputs[1]].value == (0, 3, 1, 2)


def channel_shuffle(x, groups=2):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, -1, h, w)


class Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat([a, self.conv(b)], dim=1))


def test_chunk_cat_and_channel_shuffle():
    # as litert-torch 0.10 writes them: chunk as SLICEs, the shuffle's views on torch's order
    g = check_output_shape(Shuffle(), torch.randn(1, 16, 6, 6))
    assert ops(g) == ["SLICE", "SLICE", "CONV_2D", "CONCATENATION", "TRANSPOSE", "RESHAPE",
                      "TRANSPOSE", "RESHAPE", "TRANSPOSE"]
    assert only(g, "CONCATENATION").attr("axis") == 3
    assert g.tensors[g.ops[6].inputs[1]].value == (0, 2, 1, 3, 4)
    assert g.tensors[g.ops[5].outputs[0]].shape == (1, 2, 8, 6, 6)


@pytest.mark.parametrize("pool, expected", [
    (nn.MaxPool2d(3, 2, 1), ["PADV2", "MAX_POOL_2D"]),        # 16: SAME would pad (0, 1)
    (nn.MaxPool2d(2), ["MAX_POOL_2D"]),
    (nn.AvgPool2d(3, 1, 1), ["PAD", "AVERAGE_POOL_2D"]),      # torch counts the zeros
    (nn.AvgPool2d(3, 1, 1, count_include_pad=False), ["AVERAGE_POOL_2D"]),
    (nn.MaxPool2d(3, 2, ceil_mode=True), ["PADV2", "MAX_POOL_2D"]),
])
def test_pools(pool, expected):
    g = check_output_shape(pool, torch.randn(1, 4, 16, 16))
    assert ops(g) == expected


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x)) * 0.5 - x.mean(dim=(2, 3), keepdim=True)


def test_add_mul_by_scalar_and_mean():
    g = check_output_shape(Residual(), torch.randn(1, 8, 9, 9))
    assert ops(g) == ["CONV_2D", "CONV_2D", "ADD", "MUL", "MEAN", "SUB"]
    assert g.ops[2].activation == "RELU"


class LN(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(16), nn.Linear(16, 32)

    def forward(self, x):
        return self.fc(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


LN_CORE = ["RESHAPE", "MEAN", "RESHAPE", "SQUARED_DIFFERENCE", "MEAN", "ADD", "RSQRT", "MUL",
           "SUB", "RESHAPE", "MUL", "RESHAPE", "ADD"]


def test_layer_norm_and_linear_as_litert_torch_writes_them():
    g = check_output_shape(LN(), torch.randn(1, 16, 5, 5))
    # identity gamma and beta are folded away; the FC reads the [1, rows, C] rows
    assert ops(g) == LN_CORE + ["FULLY_CONNECTED", "RESHAPE"]
    fc = only(g, "FULLY_CONNECTED")
    assert fc.attr("keep_num_dims") is True
    assert g.tensors[fc.outputs[0]].shape == (1, 25, 32)


def test_layer_norm_with_gamma_and_beta():
    m = LN()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.uniform_(-1, 1)
    g = check_output_shape(m, torch.randn(1, 16, 5, 5))
    assert ops(g) == LN_CORE + ["MUL", "ADD", "RESHAPE", "FULLY_CONNECTED"]
    assert g.tensors[only(g, "FULLY_CONNECTED").outputs[0]].shape == (1, 5, 5, 32)


def test_constant_add_and_mul_after_a_conv_fold_into_it():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.scale = nn.Conv2d(4, 6, 1, bias=False), nn.Parameter(torch.rand(6, 1, 1))

        def forward(self, x):
            return torch.relu((self.conv(x) + 1.5) * self.scale) - 2.0

    g = check_output_shape(M(), torch.randn(1, 4, 5, 5))
    assert ops(g) == ["CONV_2D", "RELU", "SUB"] or ops(g) == ["CONV_2D", "SUB"]


def test_standalone_batch_norm_is_mul_add():
    m = nn.Sequential(nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1))
    g = check_output_shape(m, torch.randn(1, 4, 6, 6))
    assert ops(g) == ["MUL", "ADD", "CONV_2D"]
    assert g.tensors[g.ops[0].inputs[1]].shape == (4,)


class Cumsum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(3, 4, 1), Cumsum())

    def forward(self, x):
        return self.head(x)


def test_unsupported_op_names_op_and_module_path():
    m = Bad()
    with pytest.raises(UnsupportedOpError, match=r"aten\.cumsum.*head\.1"):
        from_torch(m, torch.randn(1, 3, 4, 4))


def test_inputs_are_required_mode_is_restored_and_runtime_checked():
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).train()
    with pytest.raises(LatpredError, match="example inputs"):
        from_torch(m)
    with pytest.raises(LatpredError, match="target_runtime"):
        from_torch(m, torch.randn(1, 3, 4, 4), target_runtime="onnx")
    g = from_torch(m, torch.randn(1, 3, 4, 4))
    assert m.training and ops(g) == ["CONV_2D"]


def test_exported_program_and_non_image_inputs():
    m = nn.Sequential(nn.Linear(12, 6), nn.Tanh(), nn.Linear(6, 3), nn.Softmax(dim=-1))
    ep = torch.export.export(m.eval(), (torch.randn(2, 12),))
    g = from_torch(ep)
    assert ops(g) == ["FULLY_CONNECTED", "TANH", "FULLY_CONNECTED", "SOFTMAX"]
    assert g.tensors[g.inputs[0]].shape == (2, 12)
