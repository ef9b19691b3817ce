"""The stream buffers keep exactly the newest items. Each window's mean and std, computed from
its own values, match an exact computation for any finite values within the bound ingest keeps
them to, and recover once extreme readings leave the window."""

from __future__ import annotations

import bisect
import math
import statistics
import sys
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poirotd.devtools.hazard_inputs import T0, rule, series
from poirotd.hazards.spec import RollingMeanRule, WindowSpec
from poirotd.hazards.window import CHUNK, RingBuffer, SignalWindow, View
from poirotd.model import DEFAULT_MAX_ABS_VALUE, MAX_ABS_VALUE, SampleRow, row_of

EPS = sys.float_info.epsilon
TINY = sys.float_info.min * EPS  # the gap between subnormals


def test_ring_buffer_keeps_the_newest_items() -> None:
    ring = RingBuffer(history=10, chunk=4, dtype=np.int64)
    data = np.arange(1000)
    rng = np.random.default_rng(0)
    i = 0
    while i < len(data):
        n = int(rng.integers(1, 5))
        ring.append(data[i : i + n])
        i += n
        held = ring.tail(10 + n)
        assert list(held) == list(data[max(0, i - len(held)) : i])
        assert len(held) >= min(i, 10)


def test_ring_buffer_refuses_more_than_a_chunk() -> None:
    with pytest.raises(ValueError, match="at most 4"):
        RingBuffer(history=1, chunk=4, dtype=np.float64).append(np.zeros(5))


@pytest.mark.parametrize("window", [{"window_samples": 40}, {"window_seconds": 0.255}])
@pytest.mark.parametrize("offset", [0.0, 1e5])
def test_window_stats_match_numpy(window: dict[str, Any], offset: float) -> None:
    """Over many moves of the stream's buffers, on a signal with a large offset."""
    spec = RollingMeanRule.model_validate(rule("rolling_mean", above=1e9, min_samples=5, **window))
    values = offset + np.random.default_rng(2).normal(0.0, 0.01, 5 * CHUNK + 17)
    samples = series(values)  # 100 Hz: either window holds 40 or 26 samples once full
    stream = SignalWindow("s", spec.window_capacity, 1)
    rng = np.random.default_rng(3)
    i = 0
    while i < len(samples):
        n = int(rng.integers(1, CHUNK + 1))
        chunk = samples[i : i + n]
        stream.trim()
        view = stream.view(stream.record(list(map(row_of, chunk))), [s.value for s in chunk])
        count, mean, std = view.stats(spec, include_newest=True)
        for k in rng.integers(0, len(count), 5):
            newest = i + int(k)
            expected = values[newest - int(count[k]) + 1 : newest + 1]
            if len(expected) < 5:
                assert np.isnan(mean[k]) and np.isnan(std[k])
                continue
            assert len(expected) == min(40 if "window_samples" in window else 26, newest + 1)
            assert mean[k] == pytest.approx(expected.mean(), abs=1e-9)
            assert std[k] == pytest.approx(expected.std(ddof=1), rel=1e-6)
        i += n


@st.composite
def windows(draw: st.DrawFn) -> WindowSpec:
    """A window of samples or of seconds, as zscore and rolling_mean rules declare them."""
    if draw(st.booleans()):
        size = draw(st.integers(2, 40))
        return WindowSpec(window_samples=size, min_samples=draw(st.integers(2, size)))
    cap = draw(st.integers(2, 40))
    return WindowSpec(
        window_seconds=draw(st.floats(0.001, 0.5)),
        max_window_samples=cap,
        min_samples=draw(st.integers(2, cap)),
    )


@st.composite
def streams(draw: st.DrawFn) -> list[SampleRow]:
    """Readings of one stream within one bound (all of a scale), some at the same time."""
    bound = draw(st.sampled_from([1.0, 1e6, DEFAULT_MAX_ABS_VALUE, MAX_ABS_VALUE]))
    values = draw(st.lists(st.floats(-bound, bound), min_size=1, max_size=200))
    gaps = draw(st.lists(st.sampled_from([0, 1, 10, 100]), min_size=len(values)))
    seconds = np.cumsum(np.array(gaps[: len(values)]) * 1e-3)
    times = [T0 + timedelta(seconds=float(t)) for t in seconds]
    return [("c", "s", v, at) for v, at in zip(values, times, strict=True)]


def exact_stats(
    window: WindowSpec, t: list[float], v: list[float], i: int, newest: bool
) -> tuple[int, float, float]:
    """(count, mean, std) of sample i's window, from the definition, or NaNs when too short."""
    end = i + newest
    if window.window_samples is not None:
        start = end - window.window_samples
    else:
        assert window.window_seconds is not None
        start = bisect.bisect_left(t, t[i] - window.window_seconds)
        start = max(start, end - window.window_capacity)
    held = v[max(start, 0) : end]
    if len(held) < window.min_samples:
        return len(held), math.nan, math.nan
    return len(held), statistics.fmean(held), statistics.stdev(held)


@settings(max_examples=150, deadline=None)
@given(rows=streams(), window=windows(), newest=st.booleans(), data=st.data())
def test_window_stats_equal_the_exact_ones(
    rows: list[SampleRow], window: WindowSpec, newest: bool, data: st.DataObject
) -> None:
    """Error bounds: a sum of n floats is off by at most (n - 1) * u * sum(|x|), u = EPS / 2;
    the mean by that over n plus a rounding. The std is off by at most 1.5 times the mean's error
    (the deviations are from a mean that far off), plus n + 6 roundings of itself."""
    stream = SignalWindow("s", window.window_capacity - newest, 1)
    t: list[float] = []
    v: list[float] = []
    while len(t) < len(rows):
        chunk = rows[len(t) : len(t) + data.draw(st.integers(1, CHUNK))]
        stream.trim()
        first = len(t)
        t += stream.record(chunk)
        v += [row[2] for row in chunk]
        view = stream.view(t[first:], v[first:])
        count, mean, std = view.stats(window, include_newest=newest)
        for k in range(len(chunk)):
            n, exact_mean, exact_std = exact_stats(window, t, v, first + k, newest)
            assert count[k] == n
            if math.isnan(exact_mean):
                assert math.isnan(mean[k]) and math.isnan(std[k])
                continue
            held = v[first + k + newest - n : first + k + newest]
            # Sums of subnormals (under 2.2e-308) are off by up to TINY each.
            scale = math.fsum(map(abs, held)) + n * TINY
            assert abs(mean[k] - exact_mean) <= EPS * scale
            assert abs(std[k] - exact_std) <= EPS * (2 * scale + (n + 6) * exact_std)


@pytest.mark.parametrize("extreme", [1.797e308, -1.797e308, 1e300])
def test_a_window_that_holds_an_extreme_reading_measures_nan_only_while_it_holds_it(
    extreme: float,
) -> None:
    window = WindowSpec(window_samples=5, min_samples=2)
    values = [1.0, 2.0, 3.0, extreme, extreme, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    view = View(np.arange(len(values), dtype=np.float64), np.array(values), 0)
    with np.errstate(all="ignore"):
        count, mean, std = view.stats(window, include_newest=True)
    assert count.tolist() == [1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5]
    assert np.isnan(mean[3:9]).all() and np.isnan(std[3:9]).all()
    assert mean[9:].tolist() == [6.0, 7.0]
    assert std[9:].tolist() == [statistics.stdev([4.0, 5.0, 6.0, 7.0, 8.0])] * 2
