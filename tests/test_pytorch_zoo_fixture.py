"""from_torch against litert-torch on the zoo, without litert-torch.

scripts/zoo_convert_check.py converted every zoo model's torch module (`latpred.pytorch.to_torch`,
seed-0 weights, NCHW in and out) with litert-torch 0.10.0 and kept, in
tests/fixtures/from_torch/zoo_litert_torch_0.10.json.gz (its `fixture` step), each file's op
list in execution order (type, the attributes compared, input and output shapes), graph output
shapes, MACs, parameters, and the checksum of the weights it converted. Each test builds the
same module, runs `from_torch`, and compares with the script's own `versus` and `identical`
(the compare step's (b)): op types, attributes, output shapes, input shapes (up to leading
size-1 axes), graph outputs, MACs, parameters (counted per reading op: litert-torch 0.10.0 gives
some same-shaped convolutions one weight tensor, see docs/pytorch.md) and the weight checksum
must all be equal. All 48 models run (about 40 s on 2 cores; the regeneration steps are in
docs/pytorch.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from latpred.zoo import ZOO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import zoo_convert_check as check  # noqa: E402

torch.set_num_threads(1)
FIXTURE = check.load_fixture()


def test_fixture_covers_the_zoo():
    assert list(FIXTURE["models"]) == list(ZOO)
    assert FIXTURE["converter"].startswith("litert-torch 0.10.0")


@pytest.mark.parametrize("name", list(FIXTURE["models"]))
def test_from_torch_equals_litert_torch(name):
    _, module, ours = check.from_torch_zoo(name)
    d = check.versus(ours, module, FIXTURE["models"][name])
    assert check.identical(d), "\n".join([check._word(d, "from_torch")] + d["type_diff"][:40])
