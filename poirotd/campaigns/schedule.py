"""When a canary may start, the spec's interval and quiet hours, and the UTC day its
LLM-token budget counts. Pure: the clock is always passed in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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


def utc_midnight(at: datetime) -> datetime:
    """The start of `at`'s UTC day: the canaries' token budget is per UTC day."""
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
