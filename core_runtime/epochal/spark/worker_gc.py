"""The garbage collector of a Python worker that runs epochal's tasks.

PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused Python worker
(``pyspark/daemon.py``). A full collection walks every object the collector tracks, and a worker
that has run an epochal task holds tens of thousands of them that live as long as it does:
the modules of pyspark, pyarrow, the connector's client library and epochal, imported by its
first task. Measured with py-spy on the Python workers of a Kafka → Kafka exactly-once job
(2 000-record batches): two thirds of the workers' CPU went to that collection, about 35 ms
per task, on the cores the next batch needs.

:func:`settle_imports`, at the start of each epochal task, moves what the worker holds into
the collector's permanent generation (``gc.freeze()``) whenever modules were imported since it
last did (a worker's first task, and the first that runs another part: a reader, then a
writer), so each later collection walks only what was made since. Frozen objects are still
freed when their last reference goes; only cycles among them are never collected: a bounded
amount, once per import. ``EPOCHAL_WORKER_GC_FREEZE=0`` in the workers' environment turns it
off.
"""

from __future__ import annotations

import gc
import sys
import threading

from epochal.base.switches import env_switch

FREEZE_ENV = "EPOCHAL_WORKER_GC_FREEZE"
"""``0``: leave a worker's collector as PySpark has it."""

_lock = threading.Lock()
_modules_at_freeze = 0


def settle_imports() -> bool:
    """Freeze what this Python worker holds now if modules were imported since the last
    freeze (or there was none); whether this call froze it."""
    global _modules_at_freeze
    modules = len(sys.modules)
    if modules == _modules_at_freeze:
        return False
    with _lock:
        if modules == _modules_at_freeze:
            return False
        _modules_at_freeze = modules
        if not env_switch(FREEZE_ENV, True):
            return False
        gc.collect()  # what is garbage already is freed, not frozen
        gc.freeze()
    return True
