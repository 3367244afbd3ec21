"""XNNPACK's per-operator buffers against sizes traced from the ai-edge-litert 2.3.0 wheel
(malloc interposed, each allocation attributed to its XNNPACK caller; docs/memory.md,
scripts/memdiag): on the first VM (AMD EPYC, FMA3: level "avx2") and on the Intel VM
(AVX-512F). Each test pins its level, so the suite checks both on any CPU."""

import pytest

from latpred.builder import GraphBuilder
from latpred.memory import xnnpack
from latpred.memory.xnnpack_configs import F32_AVX512F, F32_FMA3, LEVELS, f32_config, for_cpu
from latpred.memory.xnnpack_operators import (heuristic_mr, indirection_bytes, packed_weights,
                                              use_nr2)


@pytest.fixture
def fma3():
    with for_cpu("avx2"):
        yield


@pytest.fixture
def avx512():
    with for_cpu("avx512"):
        yield


def _stem(cout: int):
    b = GraphBuilder()
    x = b.input((1, 224, 224, 3))
    b.output(b.conv2d(x, cout, 3, stride=2))
    return b.build()


def test_igemm_indirection_uses_the_heuristic_mr(fma3):
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


def test_large_depthwise_runs_as_grouped_igemm(fma3):
    # traced (proxylessnas_mobile): a 7x7 depthwise over 1152 channels packs 1843200 bytes
    b = GraphBuilder()
    x = b.input((1, 7, 7, 1152))
    b.output(b.depthwise_conv2d(x, 7))
    g = b.build()
    assert packed_weights(g, g.ops[0]) == (49 * 4 + 4) * 8 * 1152 == 1843200


def test_one_by_one_pooling_is_an_elided_clamp(fma3):
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


def _dense(cout: int):
    b = GraphBuilder()
    x = b.input((1, 100))
    b.output(b.fully_connected(x, cout))
    return b.build()


def test_avx512_takes_the_7x32_configs(avx512):
    # traced on the Intel VM: init_f32_igemm_config 1x32 / 7x32, the nr2 config 1x16 / 7x16
    g = _stem(32)
    assert packed_weights(g, g.ops[0]) == (27 * 4 + 4) * 32 == 3584
    assert indirection_bytes(g, g.ops[0]) == 9 * 12544 * 8 == 903168     # 12544 = 7 * 1792
    g = _stem(8)                                   # 8 < nr 32: the nr2 config, nr 16
    assert packed_weights(g, g.ops[0]) == (27 * 4 + 4) * 16 == 1792
    b = GraphBuilder()
    x = b.input((1, 30, 30, 3))
    b.output(b.conv2d(x, 40, 3))                    # 40 outputs -> 64; 900 pixels -> 903 (mr 7)
    g = b.build()
    assert (packed_weights(g, g.ops[0]), indirection_bytes(g, g.ops[0])) == (7168, 65016)
    # proxylessnas's 7x7 depthwise runs as an IGEMM per channel: nr2's 16 lanes, not 8
    b = GraphBuilder()
    x = b.input((1, 7, 7, 1152))
    b.output(b.depthwise_conv2d(x, 7))
    g = b.build()
    assert packed_weights(g, g.ops[0]) == (49 * 4 + 4) * 16 * 1152 == 3686400
    # fully connected: xnn_use_nr2(32, 16, cout) takes nr2 for 40 and 1000 outputs
    assert [packed_weights(g, g.ops[0]) for g in map(_dense, (40, 1000, 12))] == \
        [404 * 48, 404 * 1008, 404 * 16] == [19392, 407232, 6464]


def test_zen1_rounds_input_channels_to_sr():
    # gemm-config.c's xnn_uarch_zen case: 4x16s4 kernels, round_up_po2(cin, kr * sr = 4)
    with for_cpu("zen1"):
        g = _stem(32)                              # 3 input channels -> 4
        assert packed_weights(g, g.ops[0]) == (9 * 4 * 4 + 4) * 32
        g = _stem(8)                               # the nr2 config (4x8, sr 1) -> 3 channels
        assert packed_weights(g, g.ops[0]) == (27 * 4 + 4) * 8


def test_levels_and_the_pin():
    assert LEVELS.keys() >= {"avx2", "avx512", "amx"}
    with for_cpu("amx"):
        assert f32_config() == F32_AVX512F
        with for_cpu("avx2"):
            assert f32_config() == F32_FMA3
        assert f32_config() == F32_AVX512F
    with pytest.raises(ValueError, match="unknown x86 level"):
        with for_cpu("sse9"):
            pass
