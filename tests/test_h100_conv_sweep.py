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
