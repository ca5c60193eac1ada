"""The heap of a Spark Python worker, frozen out of the cyclic collector's way.

A reused Python worker runs `gc.collect()` after every task (pyspark's daemon does, when
SPARK_REUSE_WORKER is set, Spark's default). That full collection walks every object the
process tracks: pyspark's, pyarrow's and cdcflow's modules. In a worker of the "cdcflow"
source that is about 84,000 objects, and a collection of them took 17-54 ms here (28 ms on
average, measured in the worker). A task waits for its worker to finish the previous task's
collection, so every small batch paid it.

`gc.freeze()` moves the objects alive now into the permanent generation, which collections
skip. Reference counting still frees them. But a cycle that holds a frozen object is never
collected once it becomes garbage (the task's own command, say, when the freeze came in its
task; or a user's UDF object alive at that moment, in a worker that also runs the user's
UDFs). So a worker freezes rarely: in the first cdcflow task it runs (its imports), and
again only once the objects outside the permanent generation outnumber FREEZE_AFTER and half
of the most it ever froze. A freeze thus needs that many objects kept alive since the last
one, which a worker's bounded caches (about 12,000 objects in a source worker) do not reach:
it freezes a few times in its life, and a collection walks at most about a third of its
heap. Nothing is frozen on the driver, in a worker that is not reused, or with
CDCFLOW_WORKER_GC_FREEZE=0 in the workers' environment.
"""

from __future__ import annotations

import gc
import os

FREEZE_AFTER = 20_000
"""The fewest objects tracked outside the permanent generation that make a task freeze them."""

SWITCH = "CDCFLOW_WORKER_GC_FREEZE"
"""Set to 0 in the workers' environment, no worker freezes its heap."""

_frozen_peak = 0
"""The most objects this process has had frozen (frozen objects that are freed leave the
permanent generation, so its own count can fall back)."""


def settle_task_heap() -> bool:
    """In a reused Spark task's Python worker, freeze the tracked objects when they outnumber
    FREEZE_AFTER and half of the most ever frozen (see the module). Returns whether it
    froze."""
    from pyspark import TaskContext

    if (TaskContext.get() is None or os.environ.get(SWITCH, "1") == "0"
            or not os.environ.get("SPARK_REUSE_WORKER")):
        return False
    global _frozen_peak
    if not freeze_if_grown(max(FREEZE_AFTER, _frozen_peak // 2)):
        return False
    # counted only after a freeze: gc.get_freeze_count() walks the whole permanent
    # generation (2 ms for 74,000 objects here), too much for every task
    _frozen_peak = max(_frozen_peak, gc.get_freeze_count())
    return True


def freeze_if_grown(limit: int) -> bool:
    """Freeze the objects the collector tracks outside its permanent generation when there
    are more than `limit` of them. Counting walks only those objects: cheap once frozen."""
    if len(gc.get_objects()) <= limit:
        return False
    gc.freeze()
    return True
