"""`gateway serve` freezes what start-up made out of garbage collection
(cli.freeze_startup_heap), so that full collections walk only what requests make:
they had made one request in a hundred wait 20 to 35 ms; and collections come less
often than Python's default."""

from __future__ import annotations

import gc
import weakref

from gateway.cli.main import GC_YOUNG_THRESHOLD, freeze_startup_heap


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_start_up_garbage_is_collected_and_the_rest_frozen() -> None:
    threshold = gc.get_threshold()
    gc.disable()  # no automatic collection frees the cycle before the call does
    try:
        before = weakref.ref(Cycle())  # garbage in a cycle: only a collection frees it
        frozen = freeze_startup_heap()
        # What it reports is what it froze. A thread another test left in this process
        # may free a few frozen objects meanwhile (the count only ever falls after it).
        assert frozen > 10_000 and 0 <= frozen - gc.get_freeze_count() < 1_000
        assert before() is None  # collected first, not frozen alive
        # What is made afterwards is collected as before.
        after = weakref.ref(Cycle())
        assert after() is not None
        gc.collect()
        assert after() is None
        # Collections come after GC_YOUNG_THRESHOLD new objects, not Python's 700.
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > 700
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
        gc.enable()
