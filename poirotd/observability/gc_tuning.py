"""The process's cyclic garbage collector, set for a long-running daemon under steady ingest.

Reference counting frees nearly everything the daemon drops; the cyclic collector only finds
reference cycles. With CPython's defaults it runs a young collection every 700 net allocations
of container objects, and the older generations follow. Under 10k samples/s of telemetry
(bench.ingest's latency run) that paused the event loop for up to ~35 ms (middle generation)
and ~120 ms (a full collection) every few seconds: the tail of the hazard latency. Two changes,
made once start-up is done:

* what start-up built (modules, pydantic schemas, the spec) is frozen: full collections no
  longer walk it, and it is never garbage anyway;
* the young generation is collected every `young_threshold` net allocations (the setting
  `POIROTD_GC_YOUNG_THRESHOLD`, default `YOUNG_THRESHOLD`). A cycle then waits longer to be
  freed, so memory holds at most that many more objects, a few MiB at the default. A lower
  value gives shorter, more frequent pauses.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune_for_daemon(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Call once, when start-up is done. Process-wide: the daemon's entry points call it, not
    `Daemon.start` (tests start many daemons in one process)."""
    gc.freeze()
    _, middle, full = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, full)
