"""Depthwise convolutions XNNPACK runs as a grouped IGEMM (`dwconv2d_igemm`) against LiteRT
itself: its profiler names each convolution's XNNPACK operator "Convolution (NHWC, F32|QC8)
DWConv" or "... IGEMM", in fp32 and in int8. Only the operator names are compared (one profiled
run per model), not times."""

from __future__ import annotations

import pytest

from latpred.builder import GraphBuilder
from latpred.deduce import deduce
from latpred.tflite import read_tflite, write_tflite

pytest.importorskip("ai_edge_litert")

# (kernel, depth multiplier, stride, dilation); the tap counts around XNNPACK's largest
# depthwise microkernel (25 taps), a depth multiplier of 2 (a group writes two channels) and
# a dilated 7x7
_DEPTHWISE = [(3, 1, 1, 1), (5, 1, 2, 1), ((1, 25), 1, 1, 1), ((1, 26), 1, 1, 1),
              ((2, 13), 1, 1, 1), ((9, 1), 1, 1, 1), (7, 1, 1, 1), (7, 1, 1, 2), (3, 2, 1, 1),
              ((3, 9), 1, 2, 1)]


def _graph():
    b = GraphBuilder("dwconv microkernel or igemm")
    x = b.input((1, 20, 20, 8))
    for kernel, multiplier, stride, dilation in _DEPTHWISE:
        x = b.depthwise_conv2d(x, kernel, stride=stride, depth_multiplier=multiplier,
                               dilation=dilation)
    c = b.shape(x)[-1]
    for kernel in (5, 7):   # CONV_2D with one channel per group (Keras 3's depthwise)
        x = b.conv2d(x, c, kernel, groups=c)
    b.output(x)
    return b.build()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_dwconv2d_igemm_is_what_xnnpack_runs_as_igemm(precision):
    from latpred.profile.litert_profiler import profile_ops

    graph = _graph()
    data = write_tflite(graph, precision=precision, seed=0)
    profile = profile_ops(data, runs=1, warmup=0)
    convs = [op for op in profile.ops if op.name.startswith("Convolution (NHWC")]
    assert len(convs) == len(graph.ops) == len(profile.ops)   # one operator per op, in order
    igemm = [op.name.endswith(" IGEMM") for op in convs]
    assert all(op.name.endswith((" IGEMM", " DWConv")) for op in convs)
    assert ("QC8" if precision == "int8" else "F32") in convs[0].name
    for g in (graph, read_tflite(data)):   # the float graph for the target, and the file
        kernels = deduce(g, f"host/cpu/{precision}/t1")
        assert [k.type == "dwconv2d_igemm" for k in kernels] == igemm
        assert {k.type for k in kernels} == {"dwconv2d", "dwconv2d_igemm"}
    # taps <= 25 with one channel per group: DWConv; 26 and more, or a multiplier of 2: IGEMM
    assert igemm == [False, False, False, True, True, False, True, True, True, True, False,
                     True]
