"""The linear family's physics design: cost terms from named columns, and what they buy."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from latpred.predictors import PercentGBDT, PositiveLasso
from latpred.predictors.lasso_terms import design_matrix

DW = ("input_h", "input_w", "input_c", "output_h", "output_w", "stride_h", "stride_w",
      "kernel_h", "kernel_w", "filters", "flops", "bytes_read", "bytes_written",
      "depth_multiplier")


def depthwise(n: int = 800, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Depthwise kernels whose latency is a product law: 7x7 costs 10x more per FLOP than 3x3.

    y = 2 us + flops * c(k) with c(3) = 3e-11, c(5) = 3.3e-11, c(7) = 3e-10 ms per FLOP and
    1% noise: what XNNPACK's one-thread depthwise kernels look like on host-cpu-synthetic.
    """
    rng = np.random.default_rng(seed)
    k = rng.choice([3, 5, 7], n)
    s = rng.choice([1, 2], n)
    h = rng.choice([7, 14, 28, 56, 112], n)
    c = rng.choice([16, 24, 32, 64, 96, 160, 320], n)
    ho = h // s
    flops = 2.0 * ho * ho * c * k * k
    nbytes = 4.0 * h * h * c
    df = pd.DataFrame({"input_h": h, "input_w": h, "input_c": c, "output_h": ho, "output_w": ho,
                       "stride_h": s, "stride_w": s, "kernel_h": k, "kernel_w": k, "filters": c,
                       "flops": flops, "bytes_read": nbytes, "bytes_written": nbytes / s ** 2,
                       "depth_multiplier": 1}, columns=list(DW)).astype(float)
    per_flop = np.select([k == 3, k == 5], [3e-11, 3.3e-11], 3e-10)
    y = (2e-3 + flops * per_flop) * rng.lognormal(0, 0.01, n)
    return df, y


def mape(est, X, y) -> float:
    return float(np.mean(np.abs(est.predict(X) - y) / y))


def test_physics_design_adds_flops_per_window_and_stride():
    df, _ = depthwise(50)
    X = df.to_numpy()
    D = design_matrix(X, DW, "physics")
    assert np.array_equal(D[:, :len(DW)], X)  # the raw columns come first, unchanged
    names = list(DW) + ["pixels"] + [f"flops@k{w}s{s}" for w in (1, 9, 25, 49) for s in (1, 2)]
    seven_s1 = (df.kernel_h == 7) & (df.stride_h == 1)
    col = D[:, names.index("flops@k49s1")]
    assert np.array_equal(col, np.where(seven_s1, df.flops, 0.0))
    # every kernel's FLOPs land in exactly one window/stride column
    split = D[:, len(DW) + 1:len(DW) + 9]
    assert np.allclose(split.sum(axis=1), df.flops)
    assert np.array_equal(D[:, len(DW)], df.output_h * df.output_w)


def test_raw_design_and_unnamed_columns_are_left_as_they_are():
    df, _ = depthwise(20)
    X = df.to_numpy()
    assert np.array_equal(design_matrix(X, DW, "raw"), X)
    assert np.array_equal(design_matrix(X, None, "physics"), X)
    with pytest.raises(ValueError, match="design"):
        design_matrix(X, DW, "cubic")


def test_lasso_recovers_a_product_law_that_raw_columns_cannot_express():
    df, y = depthwise()
    physics = PositiveLasso(alpha=1e-6).fit(df[:600], y[:600])
    raw = PositiveLasso(alpha=1e-6, design="raw").fit(df[:600], y[:600])
    X = df.to_numpy()
    assert mape(physics, X[600:], y[600:]) < 0.03
    assert mape(raw, X[600:], y[600:]) > 0.15


def test_names_and_design_travel_with_the_weights():
    df, y = depthwise()
    est = PositiveLasso(alpha=1e-6).fit(df.to_numpy(), y, feature_names=DW)
    data, params = est.export()
    back = PositiveLasso.restore(data, json.loads(json.dumps(params)))
    X = df.to_numpy()
    assert back.design == "physics" and back.n_features_in_ == len(DW)
    assert np.allclose(back.predict(X), est.predict(X))
    # weights written before designs existed (no design, no names) restore as the raw model
    raw = PositiveLasso(alpha=1e-6, design="raw").fit(X, y)
    old = json.loads(raw.export()[0])
    del old["design"], old["names"]
    back = PositiveLasso.restore(json.dumps(old).encode(), {"alpha": 1e-6})
    assert back.design == "raw" and np.allclose(back.predict(X), raw.predict(X))


def test_gbdt_ratio_base_uses_the_physics_terms():
    df, y = depthwise()
    gbdt = PercentGBDT(n_estimators=50, base="lasso", base_alpha=1e-6).fit(df[:600], y[:600])
    assert gbdt.base_.names_ == list(DW)
    X = df.to_numpy()
    assert mape(gbdt, X[600:], y[600:]) < 0.05
    data, params = gbdt.export()
    back = PercentGBDT.restore(data, json.loads(json.dumps(params)))
    assert np.allclose(back.predict(X), gbdt.predict(X))


ACT = ("input_h", "input_w", "input_c", "input_size", "flops", "bytes_read", "bytes_written",
       "op_code")


def activations(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """RELU (code 19), LOGISTIC (14) and GELU (150) of the same shapes, whose cost per element
    is 0.09, 0.38 and 0.44 ns as XNNPACK's on the host CPU: only op_code separates them."""
    rng = np.random.default_rng(seed)
    code = rng.choice([19, 14, 150], n)
    h = rng.choice([7, 14, 28, 56, 112], n)
    c = rng.choice([16, 32, 64, 128, 256], n)
    size = (h * h * c).astype(float)
    df = pd.DataFrame({"input_h": h, "input_w": h, "input_c": c, "input_size": size,
                       "flops": size, "bytes_read": 4 * size, "bytes_written": 4 * size,
                       "op_code": code}, columns=list(ACT)).astype(float)
    per_element = np.select([code == 19, code == 14], [0.09e-6, 0.38e-6], 0.44e-6)
    y = (1e-3 + size * per_element) * rng.lognormal(0, 0.01, n)
    return df, y


def test_op_code_becomes_per_op_terms_not_a_cost():
    from latpred.predictors.lasso_terms import _build, op_codes_of

    X, _ = activations(30)
    names, M = list(ACT), X.to_numpy()
    codes = op_codes_of(M, names)
    assert codes == (14, 19, 150)
    cols = _build(M, names, "physics", codes)
    assert "op_code" not in cols and "op_code" in _build(M, names, "raw", codes)
    np.testing.assert_array_equal(cols["@LOGISTIC"], (X["op_code"] == 14).to_numpy())
    np.testing.assert_array_equal(cols["bytes@RELU"], (X["op_code"] == 19) * 8 * X["input_size"])
    # The fitted model keeps its ops, so a reloaded one expands a matrix alike.
    est = PositiveLasso(alpha=1e-6).fit(X, np.ones(len(X)))
    again = PositiveLasso.restore(*est.export())
    assert again.op_codes_ == codes
    np.testing.assert_allclose(again.predict(M), est.predict(M))


@pytest.mark.parametrize("family", ["lasso", "gbdt"])
def test_mixed_activations_are_learned_per_op(family):
    X, y = activations()
    Xt, yt = activations(300, seed=1)
    est = (PositiveLasso(alpha=1e-6) if family == "lasso"
           else PercentGBDT(base="lasso", base_alpha=1e-6))
    est.fit(X, y)
    mape = np.mean(np.abs(est.predict(Xt) / yt - 1))
    # Without op_code the best one can do is one cost per element for all three: ~50% MAPE.
    assert mape < 0.05


def test_datasets_measured_before_op_code_get_it_from_their_ops_column():
    from latpred.predictors.training import with_op_code

    old = pd.DataFrame({"ops": ["LOGISTIC", "CONV_2D+PAD", "CUSTOM:Foo"], "f_flops": [1.0] * 3})
    assert with_op_code(old)["f_op_code"].tolist() == [14.0, 3.0, -1.0]
    new = old.assign(f_op_code=[19.0, np.nan, 150.0])
    assert with_op_code(new)["f_op_code"].tolist() == [19.0, 3.0, 150.0]


CONV = ("input_h", "input_w", "input_c", "output_h", "output_w", "stride_h", "stride_w",
        "kernel_h", "kernel_w", "filters", "flops", "bytes_read", "bytes_written", "param_bytes")


def convolutions(n: int, cin: np.ndarray, itemsize: float, seed: int = 0
                 ) -> tuple[pd.DataFrame, np.ndarray]:
    """3x3 convolutions whose latency is that of a GEMM packing input channels in blocks of 8
    (an int8 XNNPACK IGEMM): y = 5 us + 2 * pixels * filters * 9 * roundup(cin, 8) * 2e-12 ms;
    weights of `itemsize` bytes an element."""
    rng = np.random.default_rng(seed)
    h = rng.choice([14, 28, 56, 112], n)
    f = rng.choice([16, 32, 64, 96], n)
    flops = 2.0 * h * h * f * 9 * cin
    df = pd.DataFrame({"input_h": h, "input_w": h, "input_c": cin, "output_h": h,
                       "output_w": h, "stride_h": 1, "stride_w": 1, "kernel_h": 3,
                       "kernel_w": 3, "filters": f, "flops": flops,
                       "bytes_read": itemsize * h * h * cin, "bytes_written": itemsize * h * h * f,
                       "param_bytes": itemsize * f * (9 * cin + 1)}, columns=list(CONV))
    padded = flops / cin * np.ceil(cin / 8) * 8
    return df.astype(float), (5e-3 + padded * 2e-12) * rng.lognormal(0, 0.01, n)


def test_quantized_convolutions_get_packed_reduction_terms():
    from latpred.predictors.lasso_terms import _build, packs_reduction

    cin = np.random.default_rng(1).choice([3, 12, 16, 32, 40], 300)
    X, y = convolutions(300, cin, itemsize=1.0)
    M = X.to_numpy()
    assert packs_reduction(M, CONV)
    assert not packs_reduction(convolutions(50, cin[:50], 4.0)[0].to_numpy(), CONV)  # fp32
    assert not packs_reduction(M, CONV + ("depth_multiplier",))
    cols = _build(M, list(CONV), "physics", (), packed=True)
    np.testing.assert_allclose(cols["flops@kpad8"], X.flops / cin * np.ceil(cin / 8) * 8)
    assert "flops@kpad8" not in _build(M, list(CONV), "physics", (), packed=False)
    est = PositiveLasso(alpha=1e-6).fit(X, y)
    assert est.packed_ and mape(est, X, y) < 0.03
    again = PositiveLasso.restore(*est.export())
    assert again.packed_ and np.allclose(again.predict(X), est.predict(X))
    data, params = est.export()     # weights written before these terms have none
    old = {k: v for k, v in json.loads(data).items() if k != "packed"}
    with pytest.raises(ValueError, match="design"):
        PositiveLasso.restore(json.dumps(old).encode(), params)


def test_packed_terms_price_a_zoos_stems_from_a_nas_spaces_rows():
    """Measured int8 convolutions (second VM): fitted on 30 synthetic models, whose only
    3-channel convolutions are 3x3 stride-2 stems, the zoo's 7x7 3-channel stems (ResNet) and
    its 3x3 stride-2 convolutions of full channel blocks. Without the packed-reduction terms:
    66% and 15% (alpha 1e-4); with them 20% and 9%."""
    from pathlib import Path

    from latpred.predictors.training import FEATURE_PREFIX

    root = Path(__file__).resolve().parents[1] / "datasets"
    names = list(CONV)

    def rows(name: str, first: int | None = None):
        k = pd.read_parquet(root / name / "kernels.parquet")
        k = k[(k.kernel_type == "conv2d") & (k.status == "ok") & (k.latency_ms > 0)]
        if first:
            k = k[k.model_id.isin(sorted(k.model_id.unique())[:first])]
        return k[[FEATURE_PREFIX + n for n in names]].to_numpy(float), k.latency_ms.to_numpy(), k

    X, y, _ = rows("host-cpu-int8-synthetic-vm2", 30)
    T, t_y, t = rows("host-cpu-int8-zoo-vm2")
    est = PositiveLasso(alpha=1e-4).fit(X, y, names)
    assert est.packed_
    ape = np.abs(est.predict(T) - t_y) / t_y
    blocks = (t.f_input_c % 8 == 0).to_numpy()
    stems7 = (t.f_kernel_h == 7).to_numpy() & ~blocks
    full_3x3_s2 = (t.f_kernel_h == 3).to_numpy() & (t.f_stride_h == 2).to_numpy() & blocks
    assert stems7.sum() >= 5 and full_3x3_s2.sum() >= 10
    assert ape[stems7].mean() < 0.35 and ape[full_3x3_s2].mean() < 0.12
