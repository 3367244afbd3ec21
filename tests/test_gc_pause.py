"""Batch calls pause the cyclic garbage collector and leave it as they found it."""

import gc

import pytest

from latpred.gc_pause import paused_gc


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_gc_restores_the_state_it_found(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with paused_gc():
            assert not gc.isenabled()
            with paused_gc():                    # nested: the inner one leaves it paused
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(ValueError):
            with paused_gc():
                raise ValueError("an error inside the batch")
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()


def test_memory_totals_leave_the_collector_on():
    from latpred.builder import GraphBuilder
    from latpred.memory import memory_totals

    b = GraphBuilder("gc")
    x = b.input((1, 8, 8, 4))
    b.output(b.conv2d(x, 8, 3))
    assert gc.isenabled()
    assert memory_totals([b.build()], "host/cpu/fp32/t1")[0] > 0
    assert gc.isenabled()
