"""Bounded, preallocated storage of one telemetry stream, and the windowed statistics every
per-signal rule reads from it.

Rules read "recent history followed by the chunk just appended" as a single numpy view. A
circular buffer would have to copy the part that wraps around on every read. ``RingBuffer``
instead keeps room for ``history + 2 * chunk`` items and appends at the end. When the end is
reached, it moves the newest ``history`` items back to the front: one memmove every ``chunk`` or
more items, and nothing is allocated after construction.

A window's mean and std (zscore, rolling_mean) are computed from the window's own values, every
time: its mean, then the deviations from that mean (a two-pass variance). Running sums of the
values and their squares would cost less per sample, but they remember every reading they took
in: one sum that overflows (two readings of 1.8e308) stays inf for good, and one huge reading
ruins their precision by cancellation long after it has left the window. Computed per window, an
extreme reading spoils only the windows that hold it: their statistics are not finite, which
makes them NaN (a NaN measure never hits and never clears), and the rule works again once the
reading has left its window.
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
# The most window values gathered at once: a chunk's windows are computed in blocks of about
# this many values (64 KiB per float64 array), however long the windows are. Larger blocks are
# slower: 256 windows of 200 values took three times as long in one block as in blocks of 8,192.
_BLOCK_VALUES = 1 << 13
# A std below this may have lost digits to underflow: its window's squared deviations sum to
# under 1e-280 per sample, where those that underflowed (each under 2.2e-308) may count.
_SMALL_STD = 1e-140
# Where a window taken alone begins among its values.
_ALONE = np.zeros(1, dtype=np.intp)


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

    def append(self, items: NDArray[Any]) -> None:
        """Append at most ``chunk`` items. Items older than ``history`` may be dropped."""
        n = len(items)
        if n > self._chunk:
            raise ValueError(f"append at most {self._chunk} items at once, got {n}")
        if self._end + n > len(self._data):
            keep = min(self._history, self._end)
            self._data[:keep] = self._data[self._end - keep : self._end]
            self._end = keep
        self._data[self._end : self._end + n] = items
        self._end += n

    def tail(self, n: int) -> NDArray[Any]:
        """The newest ``n`` items (fewer if fewer are held), oldest first. The result is a view,
        valid only until the next append."""
        return self._data[max(0, self._end - n) : self._end]


@dataclass(frozen=True, slots=True)
class View:
    """A stream's recent history followed by the chunk just appended, which starts at ``first``.

    The arrays are views into the stream's buffers and are valid until its next append.
    """

    t: FloatArray
    v: FloatArray
    first: int

    @property
    def new_values(self) -> FloatArray:
        return self.v[self.first :]

    def stats(
        self, window: WindowSpec, *, include_newest: bool
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """Count, mean and sample std of each new sample's window. The window is the
        samples just before it (``include_newest=False``) or up to and including it. Mean and
        std are NaN where the window holds fewer than ``window.min_samples`` samples, or where
        they are not finite. Floating-point errors are the caller's to silence (np.errstate)."""
        ends = np.arange(self.first + include_newest, len(self.v) + include_newest)
        if window.window_samples is not None:
            starts = ends - window.window_samples
        else:
            assert window.window_seconds is not None
            starts = np.searchsorted(self.t, self.t[self.first :] - window.window_seconds)
            starts = np.maximum(starts, ends - window.max_window_samples)
        starts = np.maximum(starts, 0)
        count = ends - starts
        full = count >= window.min_samples
        if full.all():
            return count, *_window_moments(self.v, starts, count)
        mean = np.full(len(count), np.nan)
        std = np.full(len(count), np.nan)
        if full.any():
            mean[full], std[full] = _window_moments(self.v, starts[full], count[full])
        return count, mean, std


def _window_moments(
    values: FloatArray, starts: IntArray, counts: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Mean and sample std of each window ``values[starts[i] : starts[i] + counts[i]]`` (every
    count at least 2), each from the window's own values: its mean, then the deviations from it.
    Where the std is not finite (the window's values or their spread reach past the float
    limit), both are NaN; a mean that is not finite always comes with such a std."""
    if len(starts) == 1:  # a frame's signals come one sample each: a slice, no index array
        start = int(starts[0])
        means, stds = _moments(values[start : start + int(counts[0])], _ALONE, counts)
    else:
        means = np.empty(len(starts))
        stds = np.empty(len(starts))
        # All windows' values at once, in blocks: a chunk's windows may hold CHUNK * 65,536.
        per_block = max(1, _BLOCK_VALUES // int(counts.max()))
        for lo in range(0, len(starts), per_block):
            block = slice(lo, lo + per_block)
            s, c = starts[block], counts[block]
            offsets = np.cumsum(c) - c  # where each window begins among the gathered values
            x = values[np.arange(int(offsets[-1] + c[-1])) + np.repeat(s - offsets, c)]
            means[block], stds[block] = _moments(x, offsets, c)
    overflowed = ~np.isfinite(stds)
    means[overflowed] = np.nan
    stds[overflowed] = np.nan
    return means, stds


def _moments(x: FloatArray, offsets: IntArray, counts: IntArray) -> tuple[FloatArray, FloatArray]:
    """Mean and sample std of the windows laid end to end in ``x``, starting at ``offsets``."""
    mean = np.add.reduceat(x, offsets) / counts
    dev = x - np.repeat(mean, counts)
    std = np.sqrt(np.add.reduceat(dev * dev, offsets) / (counts - 1))
    if (std < _SMALL_STD).any():
        # Deviations this small lose digits, or vanish, when squared (below 2.2e-308): take
        # them relative to the largest of their window first. A constant window comes here too.
        scale = np.maximum.reduceat(np.abs(dev), offsets)
        scale[scale == 0.0] = 1.0
        dev /= np.repeat(scale, counts)
        std = scale * np.sqrt(np.add.reduceat(dev * dev, offsets) / (counts - 1))
    return mean, std


class SignalWindow:
    """What the engine keeps of one (session, component, signal) stream: its newest samples with
    their times (evidence), and, when a rule looks back (``lookback`` > 0), the ring buffers of
    times and values that rule reads."""

    def __init__(self, session_id: str, lookback: int, evidence_limit: int) -> None:
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
        span = self.lookback + len(t)
        t_view, v_view = self._times.tail(span), self._values.tail(span)
        return View(t_view, v_view, len(t_view) - len(t))

    def evidence_at(self, t: float, limit: int) -> tuple[TelemetrySample, ...]:
        """The newest ``limit`` samples at or before time ``t``."""
        end = bisect.bisect_right(self._sample_times, t)
        held = self._samples[max(0, end - limit) : end]
        return tuple(sample_of(self.session_id, row) for row in held)
