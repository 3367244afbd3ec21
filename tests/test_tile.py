"""Tile/wave features (Eq. 1-2) and the tile paper's latency model, with hand-computed values."""

import math

import numpy as np
import pandas as pd
import pytest

from latpred.builder import GraphBuilder
from latpred.deduce.kernel import Kernel
from latpred.errors import ConfigError
from latpred.features.tile import (Gemm, analytical_features, conv_gemm, gemm_of, grid_size,
                                   tile_features, tile_stats)
from latpred.features.tile_model import TileLatencyModel, fit_phi, fit_tau, grids
from latpred.device_profile import _tile_shapes
from latpred.target import parse_target


def _graph(build):
    b = GraphBuilder()
    build(b, b.input((1, 56, 56, 64)))
    return b.build()


def test_grid_size_eq1():
    assert grid_size(100, 70, 64, 32) == 2 * 3
    assert grid_size(128, 64, 64, 64) == 2
    assert grid_size(129, 64, 64, 64) == 3       # one more row: a whole extra tile row


def test_conv_gemm_and_memory_terms():
    g = conv_gemm(1, 64, 56, 56, 128, 3, 3, 56, 56)
    assert (g.m, g.n, g.k, g.batch) == (3136, 128, 576, 1)
    assert g.m_in == 64 * 56 * 56 + 128 * 64 * 9 == 274432
    assert g.m_out == 56 * 56 * 128
    grouped = conv_gemm(2, 64, 8, 8, 32, 3, 3, 8, 8, groups=4)
    assert (grouped.m, grouped.n, grouped.k, grouped.batch) == (128, 8, 144, 4)


def test_tile_stats_waves_and_utilisation():
    s = tile_stats(Gemm(3136, 128, 576), 64, 64, 132)
    assert s["grid"] == 49 * 2 and s["waves"] == 1
    assert s["tile_util"] == pytest.approx(1.0)
    assert s["wave_util"] == pytest.approx(98 / 132)
    s = tile_stats(Gemm(100, 70, 8, batch=3), 64, 32, 4)
    assert s["grid"] == 18 and s["waves"] == 5
    assert s["tile_util"] == pytest.approx(3 * 100 * 70 / (18 * 64 * 32))
    assert s["wave_util"] == pytest.approx(18 / 20)


def test_tile_features_per_op_type():
    target = parse_target("h100/gpu/fp16")
    g = _graph(lambda b, x: b.output(b.conv2d(x, 128, 3)))
    f = tile_features(g, Kernel("conv2d", (0,), "gpu"), target)
    assert f["gemm_m"] == 3136 and f["gemm_n"] == 128 and f["gemm_k"] == 576
    assert f["grid_64x64"] == 98 and f["waves_64x64"] == 1
    assert f["grid_128x128"] == math.ceil(3136 / 128) * 1
    # Winograd matmul: 36 GEMMs of [tiles x C] x [C x O], tiles = 14*14
    w = gemm_of(g, Kernel("winograd_matmul", (0,), "gpu", part="matmul"))
    assert (w.m, w.n, w.k, w.batch) == (196, 128, 64, 36)
    assert gemm_of(g, Kernel("winograd_input_transform", (0,), "gpu",
                             part="input_transform")) is None
    # CPU target: no GPU tile shapes, GEMM columns only
    cpu = tile_features(g, Kernel("conv2d", (0,), "cpu"), parse_target("host/cpu/fp32/t1"))
    assert not any(k.startswith("grid_") for k in cpu) and cpu["gemm_k"] == 576


def test_grouped_depthwise_fc_lowering():
    g = _graph(lambda b, x: b.output(b.conv2d(x, 128, 3, groups=4)))
    assert gemm_of(g, Kernel("grouped_conv2d", (0,), "gpu")) == conv_gemm(
        1, 64, 56, 56, 128, 3, 3, 56, 56, groups=4)
    one = gemm_of(g, Kernel("conv2d", (0,), "gpu", part="group1"))
    assert (one.n, one.k, one.batch) == (32, 16 * 9, 1)
    g = _graph(lambda b, x: b.output(b.depthwise_conv2d(x, 3, depth_multiplier=2)))
    d = gemm_of(g, Kernel("dwconv2d", (0,), "gpu"))
    assert (d.m, d.n, d.k, d.batch) == (3136, 2, 9, 64)
    g = _graph(lambda b, x: b.output(b.fully_connected(b.reshape(x, (56, 56 * 64)), 10)))
    fc_index = next(i for i, op in enumerate(g.ops) if op.type == "FULLY_CONNECTED")
    fc = gemm_of(g, Kernel("fc", (fc_index,), "gpu"))
    assert (fc.m, fc.n, fc.k) == (56, 10, 3584)


def test_analytical_features_joins_both_models():
    g = _graph(lambda b, x: b.output(b.conv2d(x, 128, 3)))
    f = analytical_features(g, Kernel("conv2d", (0,), "gpu"), parse_target("h100/gpu/fp16"))
    assert "grid_64x64" in f and "tm_occupancy_groups" in f


def test_tile_shapes_validation():
    assert _tile_shapes([[64, 32]], "x") == ((64, 32),)
    with pytest.raises(ConfigError):
        _tile_shapes([[64, 0]], "x")


def test_fit_tau_recovers_tile_eq3():
    rng = np.random.default_rng(0)
    m, n = rng.integers(8, 5000, 200), rng.integers(8, 1024, 200)
    assert fit_tau(m, n, grids(m, n, 128, 64)) == (128, 64)


def test_fit_phi_recovers_eq2_coefficients():
    rng = np.random.default_rng(1)
    x = rng.uniform(1, 1000, (120, 3))
    phi = np.array([2e-3, 1e-4, 5e-5])
    t = x @ phi + 0.01
    assert fit_phi(x, t) == pytest.approx(np.append(phi, 0.01), rel=1e-4, abs=1e-6)


def _synthetic(n_rows: int, seed: int) -> pd.DataFrame:
    """Two implementations picked by a simple rule, each following Eq. 1-2 exactly."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        c, k, h = (int(rng.integers(1, 33)) * 8, int(rng.integers(1, 33)) * 8,
                   int(rng.choice([7, 14, 28])))
        big = k > 128
        tau = (128, 128) if big else (64, 32)
        gm, gn, gk = h * h, k, c * 9
        g = math.ceil(gm / tau[0]) * math.ceil(gn / tau[1])
        t = g * gk * (1e-6 if big else 3e-6) + h * h * k * 1e-7 + 0.005
        rows.append(dict(N=1, C=c, H=h, W=h, K=k, R=3, S=3, P=h, Q=h, stride=1, is_fp16=1,
                         kernel="big" if big else "small", grid=g, latency_ms=t))
    return pd.DataFrame(rows)


def test_tile_latency_model_end_to_end():
    train, test = _synthetic(300, 0), _synthetic(60, 1)
    m = TileLatencyModel(n_estimators=30, min_rows=5).fit(train)
    assert m.models_["big"].tau == (128, 128) and m.models_["small"].tau == (64, 32)
    exact = m.predict(test, test["kernel"].tolist())
    assert np.allclose(exact, test["latency_ms"], rtol=1e-3)
    assert (m.predict_kernel(test) == test["kernel"]).mean() > 0.9
    rel = np.abs(m.predict(test) - test["latency_ms"]) / test["latency_ms"]
    assert (rel < 0.1).mean() > 0.9


def test_tile_from_name_overrides_eq3_for_persistent_kernels():
    from latpred.features.tile_model import name_tile
    assert name_tile("sm90_xmma_fprop_implicit_gemm_nhwc_tilesize128x16x64_stage1") == (128, 16)
    assert name_tile("cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_nn") == (32, 32)
    assert name_tile("implicit_convolve_sgemm<float, float, 1024, 5, 5>") is None
    df = _synthetic(200, 0)
    df["kernel"] = np.where(df["kernel"] == "big", "k_tilesize128x128x64", "k_tilesize64x32x32")
    df["grid"] = 132.0                    # a persistent kernel: one CTA per SM, whatever the size
    named = TileLatencyModel(n_estimators=10, min_rows=5, tile_from_name=True).fit(df)
    assert named.models_["k_tilesize128x128x64"].tau == (128, 128)
    eq3 = TileLatencyModel(n_estimators=10, min_rows=5).fit(df)
    assert eq3.models_["k_tilesize128x128x64"].tau != (128, 128)
