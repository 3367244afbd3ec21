"""A split whose neighbours are in torch's order stays there (litert-torch's min-cut layout
partitioner), checked against the ops litert-torch 0.10.0 wrote for the same module: the
zoo's ShuffleNets through `to_torch` run their channel shuffle and split on NHWC tensors."""

from __future__ import annotations

import torch
from torch import nn

from latpred import from_torch

torch.set_num_threads(1)


class NHWCShuffle(nn.Module):
    """A ShuffleNet unit written on NHWC tensors (as `latpred.pytorch.to_torch` runs the zoo):
    the channel shuffle and the split act on the last axis, the conv on a permuted view."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 1)
        self.branch = nn.Conv2d(c // 2, c // 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x).permute(0, 2, 3, 1)
        n, h, w, c = y.shape
        y = y.reshape(n, h, w, 2, c // 2).transpose(3, 4).reshape(n, h, w, c)
        a, b = y.split(c // 2, dim=3)
        b = self.branch(b.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return torch.cat((a, b), dim=3).permute(0, 3, 1, 2)


# what litert-torch 0.10.0 wrote (to_channel_last_io on input and output), read by read_tflite
LITERT_TORCH = [("CONV_2D", (1, 8, 8, 16)), ("RESHAPE", (1, 8, 8, 2, 8)),
                ("TRANSPOSE", (1, 8, 8, 8, 2)), ("RESHAPE", (1, 8, 8, 16)),
                ("SLICE", (1, 8, 8, 8)), ("SLICE", (1, 8, 8, 8)), ("CONV_2D", (1, 8, 8, 8)),
                ("CONCATENATION", (1, 8, 8, 16))]


def test_split_in_torch_order_when_its_neighbours_are():
    torch.manual_seed(0)
    g = from_torch(NHWCShuffle(), torch.randn(1, 3, 8, 8))
    assert [(op.type, g.tensors[op.outputs[0]].shape) for op in g.ops] == LITERT_TORCH
    assert g.ops[-1].attr("axis") == 3
