"""scripts/tile_select.py: what an implementation's kernel names imply for a geometry."""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import tile_select as ts  # noqa: E402

XMMA = ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize64x32x64_stage5"
        "_warpsize2x1x1_g1_tensor16x8x8_kernel")
CUTLASS = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align1>"
           "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align1::Params)")
TRANSPOSE = "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>"


def test_sequence_info_reads_the_gemm_kernels_tile_and_the_helpers():
    seq = json.dumps([TRANSPOSE, XMMA, "void splitKreduce_kernel<float>()"])
    assert ts.sequence_info(seq) == (64.0, 32.0, 64.0, 3.0, 1.0, 1.0)
    assert ts.sequence_info(json.dumps([CUTLASS]))[:3] == (128.0, 128.0, 32.0)
    assert all(np.isnan(ts.sequence_info("_rare")))


def test_implementation_columns_quantize_the_gemm_by_the_named_tile():
    geo = pd.DataFrame({"N": [1, 32], "P": [7, 56], "Q": [7, 56], "K": [64, 100],
                        "C": [32, 64], "R": [3, 1], "S": [3, 1]})
    impls = np.array([json.dumps([XMMA])] * 2, dtype=object)
    launch = pd.DataFrame({"registers": [128.0], "block": [128.0], "shared_memory": [65536.0]},
                          index=[impls[0]])
    out = ts.implementation_columns(geo[[]], geo, impls, pd.Index([impls[0]]), launch, sms=132)
    # GEMM M = N*P*Q in tiles of 64, N = K in tiles of 32, K-loop over C*R*S in steps of 64
    assert out["tiles"].tolist() == [np.ceil(49 / 64) * 2, np.ceil(100352 / 64) * np.ceil(100 / 32)]
    assert out["k_loop"].tolist() == [np.ceil(288 / 64), 1.0]
    # occupancy: 65,536 registers / (128 x 128) = 4 blocks; 228 KB / 64 KB = 3 blocks -> 3
    assert out["blocks_per_sm"].tolist() == [3.0, 3.0]
    assert out["waves"].iloc[1] == pytest.approx(out["tiles"].iloc[1] / (132 * 3))
    assert out["tile_util"].iloc[0] == pytest.approx(49 * 64 / (2 * 64 * 32))
    assert out["impl"].tolist() == [0, 0]
