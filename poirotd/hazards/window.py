"""Bounded, preallocated storage of one telemetry stream, and the windowed statistics every
per-signal rule reads from it.

Rules read "recent history followed by the chunk just appended" as a single numpy view. A
circular buffer would have to copy the part that wraps around on every read. ``RingBuffer``
instead keeps room for ``history + 2 * chunk`` items and appends at the end. When the end is
reached, it moves the newest ``history`` items back to the front: one memmove every ``chunk`` or
more items, and nothing is allocated after construction.

When a windowed rule (zscore, rolling_mean) watches the stream, the stream also keeps running
sums of the values and of their squares. A window's mean and std then cost O(1) per sample, and
all windowed rules on the signal share the work. The sums are taken relative to the stream's
first value, and they are re-based whenever the buffer moves its contents. Their magnitude thus
stays at a few windows' worth, and the variance does not lose precision on signals with a large
offset, such as prices.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from poirotd.hazards.spec import WindowSpec
from poirotd.model import SampleRow, TelemetrySample, sample_of

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

# The most samples of one stream appended at once. Callers split larger groups.
CHUNK = 256


class RingBuffer:
    def __init__(self, history: int, chunk: int, dtype: DTypeLike) -> None:
        if history < 0 or chunk < 1:
            raise ValueError(f"need history >= 0 and chunk >= 1, got {history} and {chunk}")
        self._data: NDArray[Any] = np.empty(history + 2 * chunk, dtype=dtype)
        self._history = history
        self._chunk = chunk
        self._end = 0

    def __len__(self) -> int:
        return self._end

    def append(self, items: NDArray[Any]) -> bool:
        """Append at most ``chunk`` items. Items older than ``history`` may be dropped.

        Returns whether the contents moved.
        """
        n = len(items)
        if n > self._chunk:
            raise ValueError(f"append at most {self._chunk} items at once, got {n}")
        moved = self._end + n > len(self._data)
        if moved:
            keep = min(self._history, self._end)
            self._data[:keep] = self._data[self._end - keep : self._end]
            self._end = keep
        self._data[self._end : self._end + n] = items
        self._end += n
        return moved

    def tail(self, n: int) -> NDArray[Any]:
        """The newest ``n`` items (fewer if fewer are held), oldest first. The result is a view,
        valid only until the next append."""
        return self._data[max(0, self._end - n) : self._end]


@dataclass(frozen=True, slots=True)
class View:
    """A stream's recent history followed by the chunk just appended, which starts at ``first``.

    The arrays are views into the stream's buffers and are valid until its next append.
    ``sums`` and ``squares`` are running sums of ``v - ref`` and of its square. They are present
    only when the stream keeps them.
    """

    t: FloatArray
    v: FloatArray
    first: int
    sums: FloatArray | None = None
    squares: FloatArray | None = None
    ref: float = 0.0

    @property
    def new_values(self) -> FloatArray:
        return self.v[self.first :]

    def stats(
        self, window: WindowSpec, *, include_newest: bool
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """Count, mean and sample std of each new sample's window. The window is the
        samples just before it (``include_newest=False``) or up to and including it. Mean and
        std are NaN where the window holds fewer than ``window.min_samples`` samples."""
        assert self.sums is not None and self.squares is not None, "stream keeps no sums"
        ends = np.arange(self.first + include_newest, len(self.v) + include_newest)
        if window.window_samples is not None:
            starts = ends - window.window_samples
        else:
            assert window.window_seconds is not None
            starts = np.searchsorted(self.t, self.t[self.first :] - window.window_seconds)
            starts = np.maximum(starts, ends - window.max_window_samples)
        starts = np.maximum(starts, 0)
        count = ends - starts
        # sum over [start, end) = S[end - 1] - S[start] + x[start]. With this form, no sum from
        # before the view is needed.
        oldest = self.v[starts] - self.ref
        total = self.sums[ends - 1] - self.sums[starts] + oldest
        square = self.squares[ends - 1] - self.squares[starts] + oldest * oldest
        total[count < window.min_samples] = np.nan  # NaN flows into mean and std, silently
        mean = total / np.maximum(count, 1)
        std = np.sqrt(np.maximum((square - total * mean) / np.maximum(count - 1, 1), 0.0))
        return count, mean + self.ref, std


class SignalWindow:
    """What the engine keeps of one (session, component, signal) stream: its newest samples with
    their times (evidence), and, when a rule looks back (``lookback`` > 0), the ring buffers and
    running sums that rule reads."""

    def __init__(self, session_id: str, lookback: int, evidence_limit: int, *, sums: bool) -> None:
        self.session_id = session_id
        self.lookback = lookback
        # Read only when a rule fires, so lists: appending is cheaper than numpy's, and
        # trimming a round's worth is one slice deletion. A round's evidence reaches back at
        # most this far before it.
        self._held_before = max(evidence_limit - 1, 0)
        self._samples: list[SampleRow] = []
        self._sample_times: list[float] = []
        self._times = RingBuffer(lookback, CHUNK, np.float64) if lookback else None
        self._values = RingBuffer(lookback, CHUNK, np.float64) if lookback else None
        self._sums = RingBuffer(lookback, CHUNK, np.float64) if sums else None
        self._squares = RingBuffer(lookback, CHUNK, np.float64) if sums else None
        self._ref = math.nan
        self.last_time = -math.inf

    def trim(self) -> None:
        """Before a round of new samples: drop the held ones its evidence cannot reach back to.
        Older samples go now rather than a round later, so that few samples outlive their
        batch: each one that does is walked by the next young collection."""
        drop = len(self._samples) - self._held_before
        if drop > 0:
            del self._samples[:drop]
            del self._sample_times[:drop]

    def record(self, chunk: Sequence[SampleRow]) -> list[float]:
        """Keep the chunk as evidence (until the next ``trim``) and return its times.

        A late sample, older than the stream's newest, gets the newest time, so that windows
        and cooldowns never run backwards. Events still report its own ``measured_at``.
        """
        # Plain floats: a frame's 50 signals are 50 chunks of one, where numpy's per-call cost
        # would be most of the work.
        times = []
        last = self.last_time
        for row in chunk:
            t = row[3].timestamp()  # measured_at
            last = t if t > last else last
            times.append(last)
        self._samples.extend(chunk)
        self._sample_times.extend(times)
        self.last_time = last
        return times

    def view(self, times: Sequence[float], values: Sequence[float]) -> View:
        """The view rules read for a chunk just recorded (its times as `record` returned them,
        its values): the lookback's history, then the chunk."""
        t = np.array(times, np.float64)
        v = np.array(values, np.float64)
        if self._times is None or self._values is None:
            return View(t, v, 0)
        self._times.append(t)
        self._values.append(v)
        n = len(t)
        span = self.lookback + n
        t_view, v_view = self._times.tail(span), self._values.tail(span)
        first = len(t_view) - n
        if self._sums is None or self._squares is None:
            return View(t_view, v_view, first)
        if math.isnan(self._ref):
            self._ref = float(v[0])
        x = v - self._ref
        for running, part in ((self._sums, x), (self._squares, x * x)):
            sums = np.cumsum(part)
            if len(running):
                sums += running.tail(1)[0]
            if running.append(sums):
                held = running.tail(len(running))
                held -= held[0]
        return View(
            t_view, v_view, first, self._sums.tail(span), self._squares.tail(span), self._ref
        )

    def evidence_at(self, t: float, limit: int) -> tuple[TelemetrySample, ...]:
        """The newest ``limit`` samples at or before time ``t``."""
        end = bisect.bisect_right(self._sample_times, t)
        held = self._samples[max(0, end - limit) : end]
        return tuple(sample_of(self.session_id, row) for row in held)
