"""Composite rules (``all``/``any``): combine the times at which other rules' conditions held.

A composite works from its parts' *hits*, the moments their conditions held, not from their
events. A part that is in its cooldown, is latched, or has ``emit: false`` still counts. Hits
carry the original timestamps, so an event reports the time of the sample or message that
completed the combination.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from numpy.typing import NDArray

from poirotd.hazards.spec import AllRule, AnyRule


@dataclass(frozen=True, slots=True)
class Hits:
    """When one rule's condition held in one session: ascending times and their timestamps."""

    times: NDArray[np.float64]
    stamps: tuple[datetime, ...]

    @classmethod
    def merge(cls, parts: Sequence[Hits]) -> Hits:
        if len(parts) == 1:
            return parts[0]
        times = np.concatenate([p.times for p in parts])
        stamps = [s for p in parts for s in p.stamps]
        order = np.argsort(times, kind="stable")
        return cls(times[order], tuple(stamps[i] for i in order))


class Combination:
    def __init__(self, rule: AllRule | AnyRule) -> None:
        self._rule = rule
        self._within = rule.within_seconds if isinstance(rule, AllRule) else math.inf

    def combine(
        self, new: Mapping[str, Hits], last: Mapping[str, float]
    ) -> tuple[Hits, tuple[str, ...]]:
        """The composite's own hits among the parts' new hits, and which part completed each.

        ``new`` holds this round's hits per part. ``last`` holds each part's latest hit from
        earlier rounds. For ``all``, a new hit of a part counts when every other part has its
        latest hit at or before that moment no more than ``within_seconds`` away.
        """
        names = [n for n in self._rule.rules if n in new]
        times = np.concatenate([new[n].times for n in names])
        stamps = [s for n in names for s in new[n].stamps]
        sources = np.repeat(np.arange(len(names)), [len(new[n].times) for n in names])
        order = np.argsort(times, kind="stable")
        keep = np.ones(len(order), dtype=np.bool_)
        if math.isfinite(self._within):
            ordered = times[order]
            for part in self._rule.rules:
                keep &= self._near(ordered, new.get(part), last.get(part, -math.inf))
        chosen = order[keep]
        hits = Hits(times[chosen], tuple(stamps[i] for i in chosen))
        return hits, tuple(names[sources[i]] for i in chosen)

    def _near(self, t: NDArray[np.float64], part: Hits | None, last: float) -> NDArray[np.bool_]:
        """Whether the part's latest hit at or before each moment lies within the window."""
        latest = np.full(len(t), last)
        if part is not None:
            k = np.searchsorted(part.times, t, side="right")
            latest = np.where(k > 0, part.times[np.maximum(k - 1, 0)], last)
        near: NDArray[np.bool_] = np.abs(t - latest) <= self._within
        return near

    def describe(self, completed_by: str) -> str:
        parts = ", ".join(self._rule.rules)
        if isinstance(self._rule, AllRule):
            within = self._rule.within_seconds
            return f"all of {parts} held within {within:g} s ({completed_by} last)"
        return f"any of {parts}: {completed_by}"
