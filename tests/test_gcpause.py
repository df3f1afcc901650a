"""The collector settings of bulk building and of latency-critical loops."""

import gc

from simulator.gcpause import YOUNG_THRESHOLD, gc_frozen, gc_paused


def test_paused_inside_and_restored():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_frozen_hides_what_lives_and_spaces_young_collections():
    before = gc.get_threshold()
    alive = [[i] for i in range(1000)]  # containers the collector would otherwise walk
    with gc_frozen():
        assert gc.get_freeze_count() >= len(alive)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # cycles made inside are still found
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
