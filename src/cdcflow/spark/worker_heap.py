"""The heap of a Spark Python worker, frozen out of the cyclic collector's way.

A reused Python worker runs `gc.collect()` after every task (pyspark's daemon does). That full
collection walks every object the process tracks: pyspark's, pyarrow's and cdcflow's modules.
In a worker of the "cdcflow" source that is about 84,000 objects, and a collection of them
took 17-54 ms here (28 ms on average, measured in the worker). A task waits for its worker to
finish the previous task's collection, so every small batch paid it.

`gc.freeze()` moves the objects alive now into the permanent generation, which collections
skip. Reference counting still frees them; only a cycle among frozen objects that later
becomes garbage would stay (the task's own command, say, when the freeze came in its task).
So a worker freezes rarely: in its first task (its imports), and again only once the objects
outside the permanent generation outnumber half of those in it (and FREEZE_AFTER). Each
freeze then at least multiplies the frozen count by 1.5, so a worker freezes a few times in
its life, however long it runs, while a collection never walks more than about a third of
its heap. What a task frees in between is collected as before. The driver and other
processes that are not Spark tasks are left alone.
"""

from __future__ import annotations

import gc

FREEZE_AFTER = 20_000
"""The fewest objects tracked outside the permanent generation that make a task freeze them."""


def settle_task_heap() -> bool:
    """In a Spark task's Python worker, freeze the tracked objects when they outnumber
    FREEZE_AFTER and half of the frozen ones (see the module). Returns whether it froze."""
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return False
    return freeze_if_grown(max(FREEZE_AFTER, gc.get_freeze_count() // 2))


def freeze_if_grown(limit: int) -> bool:
    """Freeze the objects the collector tracks outside its permanent generation when there
    are more than `limit` of them. Counting walks only those objects: cheap once frozen."""
    if len(gc.get_objects()) <= limit:
        return False
    gc.freeze()
    return True
