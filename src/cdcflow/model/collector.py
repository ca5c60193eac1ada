"""Python's cyclic garbage collector, paused around work that builds many objects and no
cycles: a batch's rows, folds and events.

Reference counting frees such objects either way. The cyclic collector runs after every few
hundred allocations and walks the objects still alive, so while a batch piles up tens of
thousands of them it walks the same ones again and again: a fifth of the executors' time per
change (bench/bench_throughput.py's shape, process_partition 38 -> 30 us a change) and a tenth
of the source's read. What a paused block does leave in cycles is collected once it ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector inside the block and restore it after, as it was (left
    off when it was off: a caller that disabled it keeps it disabled). The collector is one
    per process: another thread's objects are not collected meanwhile either."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
