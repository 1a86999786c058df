"""The daemon's startup heap is frozen out of the collector's full passes; what comes after is
still collected."""

from __future__ import annotations

import gc
import weakref

from llmconsole.daemon.main import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_the_startup_heap_is_frozen_and_later_garbage_is_still_collected():
    before = _Node()  # alive at "startup"
    try:
        frozen = freeze_startup_heap()
        # The imported modules' objects; a frozen object freed since (a thread an earlier test of
        # this worker left behind drops its last reference) leaves the count, never adds to it.
        assert frozen > 10_000 and 0.99 * frozen <= gc.get_freeze_count() <= frozen
        assert gc.is_tracked(before) and not any(o is before for o in gc.get_objects())  # out of every generation
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle made after the freeze: only the collector can free it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # the rest of the suite runs with its heap as it was
    assert gc.get_freeze_count() == 0 and any(o is before for o in gc.get_objects())
