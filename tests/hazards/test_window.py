"""The stream buffers keep exactly the newest items. Windowed statistics from the running sums
match a direct computation, including after many rebases and on signals with a large offset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from poirotd.hazards.spec import RollingMeanRule
from poirotd.hazards.window import CHUNK, RingBuffer, SignalWindow
from poirotd.model import row_of
from tests.support.hazards import rule, series


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
    spec = RollingMeanRule.model_validate(rule("rolling_mean", above=1e9, min_samples=5, **window))
    values = offset + np.random.default_rng(2).normal(0.0, 0.01, 5 * CHUNK + 17)
    samples = series(values)  # 100 Hz: either window holds 40 or 26 samples once full
    stream = SignalWindow("s", spec.window_capacity, 1, sums=True)
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
