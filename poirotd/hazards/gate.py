"""Decides, for one rule in one session, which of the condition's hits become events.

Two mechanisms keep one fault from producing a stream of investigations:

* cooldown: after an event, no further event until ``cooldown`` seconds of sample time have
  passed;
* latch (level-like rules only): after an event, no further event until the signal has been in
  its clear band. A hit suppressed by the cooldown does not set the latch, so an excursion that
  began during the cooldown and is still going on when the cooldown ends still fires.

The scan jumps between hits and clears with ``searchsorted``. It costs one step per event, not
one per sample, even when a fault lasts a whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(slots=True)
class Gate:
    cooldown: float
    latching: bool
    latched: bool = False
    ready_at: float = -math.inf

    def admit(
        self, times: NDArray[np.float64], hits: NDArray[np.intp], clears: NDArray[np.intp]
    ) -> list[int]:
        """The indices among ``hits`` that fire.

        ``times`` must be non-decreasing. ``hits`` and ``clears`` are ascending indices into
        ``times``.
        """
        fired: list[int] = []
        i = 0
        while True:
            if self.latched:
                k = int(np.searchsorted(clears, i))
                if k == len(clears):
                    return fired
                self.latched = False
                i = int(clears[k])
            ready = int(np.searchsorted(times, self.ready_at))
            k = int(np.searchsorted(hits, max(i, ready)))
            if k == len(hits):
                return fired
            j = int(hits[k])
            fired.append(j)
            self.ready_at = float(times[j]) + self.cooldown
            self.latched = self.latching
            i = j + 1

    def admit_one(self, t: float) -> bool:
        """Whether a single hit at time ``t`` fires (a message, or a stale check on tick)."""
        if self.latched or t < self.ready_at:
            return False
        self.ready_at = t + self.cooldown
        self.latched = self.latching
        return True
