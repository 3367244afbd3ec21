"""XNNPACK's per-operator buffers against sizes traced from the ai-edge-litert 2.3.0 wheel
(malloc interposed, each allocation attributed to its XNNPACK caller; docs/memory.md)."""

from latpred.builder import GraphBuilder
from latpred.memory import xnnpack
from latpred.memory.xnnpack_operators import (heuristic_mr, indirection_bytes, packed_weights,
                                              use_nr2)


def _stem(cout: int):
    b = GraphBuilder()
    x = b.input((1, 224, 224, 3))
    b.output(b.conv2d(x, cout, 3, stride=2))
    return b.build()


def test_igemm_indirection_uses_the_heuristic_mr():
    # traced: 903240 bytes (32 outputs, 5x16 IGEMM) and 903600 (8 outputs, 10x8 nr2 config)
    g = _stem(32)
    assert indirection_bytes(g, g.ops[0]) == 9 * 12545 * 8 == 903240
    g = _stem(8)
    assert indirection_bytes(g, g.ops[0]) == 9 * 12550 * 8 == 903600


def test_narrow_outputs_take_the_nr2_config():
    assert heuristic_mr(12544, (1, 5), 16) == 5 and heuristic_mr(12544, (1, 5, 10), 8) == 10
    assert heuristic_mr(3, (1, 5, 10), 8) == 5 and heuristic_mr(5, (1, 5, 10), 8) == 5
    assert use_nr2(16, 8, 12) and use_nr2(16, 8, 40) and not use_nr2(16, 8, 1000)
    assert not use_nr2(16, 8, 80)


def test_large_depthwise_runs_as_grouped_igemm():
    # traced (proxylessnas_mobile): a 7x7 depthwise over 1152 channels packs 1843200 bytes
    b = GraphBuilder()
    x = b.input((1, 7, 7, 1152))
    b.output(b.depthwise_conv2d(x, 7))
    g = b.build()
    assert packed_weights(g, g.ops[0]) == (49 * 4 + 4) * 8 * 1152 == 1843200


def test_one_by_one_pooling_is_an_elided_clamp():
    # traced (synthetic_cnn-s0-00036): a 1x1 max pool after the stem costs no workspace
    b = GraphBuilder()
    x = b.input((1, 32, 32, 8))
    y = b.conv2d(x, 16, 3)
    p = b.max_pool(y, 1, 1)
    b.output(b.depthwise_conv2d(p, 3, stride=2))
    g = b.build()
    assert indirection_bytes(g, g.ops[1]) == 0
    layout = xnnpack.delegated_input(g)
    size = xnnpack.workspace_bytes(g, layout)
    assert size == 32 * 32 * 16 * 4 + 2 * xnnpack.EXTRA_BYTES
