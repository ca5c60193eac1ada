"""The heap of a Spark Python worker, frozen out of the cyclic collector's way.

A reused Python worker runs `gc.collect()` after every task (pyspark's daemon does). That full
collection walks every object the process tracks: pyspark's, pyarrow's and cdcflow's modules,
hundreds of thousands of objects, about 50 ms a task on this machine. A task then waits for
its worker to finish the previous task's collection, so every small batch paid it
(bench/bench_spark.py at 1,000 mods a batch: the source's four tasks took 50-70 ms each).

`gc.freeze()` moves the objects alive now into the permanent generation, which collections
skip. Reference counting still frees them; only a cycle among frozen objects that later
becomes garbage would stay. So the heap is frozen once a worker has grown by more than
FREEZE_AFTER objects since the last freeze: the first task of a worker (its imports), and
again only after a later import adds as much. What a task frees in between is collected as
before. The driver and other processes that are not Spark tasks are left alone.
"""

from __future__ import annotations

import gc

FREEZE_AFTER = 20_000
"""Objects tracked outside the permanent generation that make a task freeze them."""


def settle_task_heap() -> bool:
    """In a Spark task's Python worker, freeze the tracked objects when they have grown past
    FREEZE_AFTER (see the module). Returns whether it froze."""
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return False
    return freeze_if_grown(FREEZE_AFTER)


def freeze_if_grown(limit: int) -> bool:
    """Freeze the objects the collector tracks outside its permanent generation when there
    are more than `limit` of them. Counting walks only those objects: cheap once frozen."""
    if len(gc.get_objects()) <= limit:
        return False
    gc.freeze()
    return True
