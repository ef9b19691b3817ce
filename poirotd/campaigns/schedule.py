"""When a canary may start, and what it may spend: the spec's interval and quiet hours, and its
daily LLM-token budget. Pure: the clock is always passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from poirotd.config.spec import CanarySpec

_DAY_MINUTES = 24 * 60


@dataclass(frozen=True)
class QuietHours:
    """A daily UTC window [start, end) in minutes after midnight; it wraps midnight when
    end <= start ("22:00-05:30")."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> QuietHours:
        """From "HH:MM-HH:MM" (validated by the spec's pattern)."""
        first, last = text.split("-")
        return cls(_minutes(first), _minutes(last))

    def seconds_until_open(self, at: datetime) -> float:
        """0 within the window, else the seconds until it next opens."""
        minute = at.hour * 60 + at.minute + at.second / 60 + at.microsecond / 60e6
        inside = (
            self.start <= minute < self.end
            if self.start < self.end
            else minute >= self.start or minute < self.end
        )
        if inside:
            return 0.0
        return ((self.start - minute) % _DAY_MINUTES) * 60


def _minutes(hh_mm: str) -> int:
    hours, minutes = hh_mm.split(":")
    return int(hours) * 60 + int(minutes)


def seconds_until_due(spec: CanarySpec, last_started: datetime | None, at: datetime) -> float:
    """How long until a canary may start: one interval after the last one, within the quiet
    hours when the spec sets them; 0 when it may start now."""
    wait = 0.0
    if last_started is not None:
        wait = max(0.0, (last_started - at).total_seconds() + spec.interval_seconds)
    if spec.quiet_hours is not None:
        opens = QuietHours.parse(spec.quiet_hours).seconds_until_open(at + timedelta(seconds=wait))
        wait += opens
    return wait


@dataclass
class DailyBudget:
    """LLM tokens canaries spent on each UTC day, against the spec's daily budget. Kept in
    memory: a restart gives the day its whole budget again (at most one run's more)."""

    per_day: int
    _spent: dict[date, int] = field(default_factory=dict)

    def left(self, at: datetime) -> int:
        return max(0, self.per_day - self._spent.get(at.date(), 0))

    def spend(self, at: datetime, tokens: int) -> None:
        day = at.date()
        self._spent = {day: self._spent.get(day, 0) + tokens}
