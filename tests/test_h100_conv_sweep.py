"""scripts/h100_conv_sweep.py: re-timing when the GPU sleep ran out (torch.cuda faked)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import h100_conv_sweep as sweep  # noqa: E402


class _FakeCuda:
    """The sleep 'runs out' (its event completes before the launches are queued) unless it
    lasts at least `enough` cycles."""

    def __init__(self, enough: int):
        self.enough, self.sleeps = enough, []
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def query(self):
                return cuda.sleeps[-1] < cuda.enough

            def elapsed_time(self, other):
                return 0.5 if cuda.sleeps[-1] >= cuda.enough else 9.0

        self.Event = Event

    def _sleep(self, cycles):
        self.sleeps.append(cycles)

    def synchronize(self):
        pass


@pytest.mark.parametrize("enough, retries, clean", [(1, 0, True), (12_000_000, 1, True),
                                                    (10**12, 3, False)])
def test_time_conv_retimes_with_longer_sleep(monkeypatch, enough, retries, clean):
    fake = _FakeCuda(enough)
    for name in ("Event", "_sleep", "synchronize"):
        monkeypatch.setattr(sweep.torch.cuda, name, getattr(fake, name))
    row = sweep.time_conv(lambda: None, reps=5)
    assert row["glitch_retries"] == retries and row["timing_clean"] is clean
    assert fake.sleeps == [sweep.SLEEP_CYCLES * 4 ** i for i in range(retries + 1)]
    assert row["sleep_cycles"] == fake.sleeps[-1]
    assert row["latency_ms"] == (0.5 if clean else 9.0)


def test_random_configurations_deterministic_and_valid():
    rows = sweep.random_configurations(60, seed=3, pairs=4)
    assert rows == sweep.random_configurations(60, seed=3, pairs=4)
    assert rows != sweep.random_configurations(60, seed=4, pairs=4)
    geoms = {}
    for r in rows:
        assert r["net"] == "random" and r["case"] >= sweep.RANDOM_CASE0
        assert r["H"] == r["W"] and 7 <= r["H"] <= 224
        assert (r["R"], r["S"]) in sweep.KERNELS and r["stride"] in (1, 2)
        assert r["stride"] == 1 or r["R"] == r["S"]
        assert (r["pad_h"], r["pad_w"]) in ((0, 0), (r["R"] // 2, r["S"] // 2))
        assert r["C"] % 16 == 0 and r["K"] % 16 == 0
        assert 16 <= min(r["C"], r["K"]) and max(r["C"], r["K"]) <= sweep.MAX_CHANNELS
        assert r["P"] == sweep.out_size(r["H"], r["R"], r["stride"], r["pad_h"]) >= 1
        assert r["Q"] == sweep.out_size(r["W"], r["S"], r["stride"], r["pad_w"]) >= 1
        assert r["dtype"] in sweep.DTYPES and r["N"] in sweep.BATCHES
        assert r["flops"] == 2.0 * r["N"] * r["P"] * r["Q"] * r["K"] * r["C"] * r["R"] * r["S"]
        assert r["flops"] <= sweep.MAX_FLOPS
        g = (r["H"], r["W"], r["R"], r["S"], r["stride"], r["pad_h"], r["pad_w"])
        assert geoms.setdefault(r["case"], g) == g     # one case id is one geometry
    assert len(set(geoms.values())) == len(geoms) > 20
    keys = [sweep.config_key(r) for r in rows]
    assert len(set(keys)) == len(keys)                 # no configuration twice


def test_default_plan_is_still_the_cases():
    rows = sweep.configurations()
    assert {r["case"] for r in rows} == set(range(len(sweep.CASES)))
    assert len(rows) == 8598                           # datasets/h100-cudnn-conv
