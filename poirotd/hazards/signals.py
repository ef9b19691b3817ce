"""Per-signal rules as vectorised conditions over a stream's window.

Each kind is a *measure* taken for every new sample, compared with *levels*:

* threshold, range: the value itself;
* rate: Δvalue/Δt from the previous sample;
* zscore: the distance of the value from the mean of the window before it, in stds;
* rolling_mean: the mean of the window that ends at the sample.

Every kind reads the same ``View`` of the stream, and all of them share the same levels logic
(hit, clear, hysteresis). The work is done on whole arrays, so a batch of a hundred samples costs
about as much as one. Cooldown and latching are applied afterwards by ``gate``. A NaN measure
(too few samples, Δt ≤ 0, a window whose statistics overflow) never hits and never clears. An
infinite one (a jump or a z past the float limit) hits like any other past its level.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from poirotd.hazards.spec import (
    LevelsSpec,
    RangeRule,
    RateRule,
    RollingMeanRule,
    SignalRuleSpec,
    ThresholdRule,
    WindowSpec,
    ZScoreRule,
)
from poirotd.hazards.window import FloatArray, IntArray, View

BoolArray = NDArray[np.bool_]


def fmt(x: float) -> str:
    """A number for a one-line summary: 6 significant digits, with '.0' on whole numbers."""
    text = f"{x:.6g}"
    return text if any(c in text for c in ".einf") else f"{text}.0"


@dataclass(frozen=True, slots=True)
class Levels:
    """Trigger levels and the clear band inside which a latched rule re-arms."""

    above: float
    below: float
    clear_below: float
    clear_above: float

    @classmethod
    def of(cls, spec: LevelsSpec | RangeRule) -> Levels:
        if isinstance(spec, RangeRule):
            margin = spec.hysteresis
            return cls(spec.max, spec.min, spec.min + margin, spec.max - margin)
        return cls(*spec.effective_levels())

    @classmethod
    def magnitude(cls, limit: float) -> Levels:
        """|measure| > limit hits. The rule re-arms once |measure| <= limit."""
        return cls(limit, -limit, -limit, limit)

    def hits(self, x: FloatArray) -> BoolArray:
        # One comparison when a side is unset: this runs for every rule on every chunk.
        if self.below == -math.inf:
            return x > self.above
        if self.above == math.inf:
            return x < self.below
        return (x > self.above) | (x < self.below)

    def hit_any(self, values: Sequence[float]) -> bool:
        """`hits(values).any()` on plain floats, for chunks too small to be worth an array."""
        above, below = self.above, self.below
        for x in values:  # noqa: SIM110 - any() builds a generator per call; this runs per chunk
            if x > above or x < below:
                return True
        return False

    def clears(self, x: FloatArray) -> BoolArray:
        return (x >= self.clear_below) & (x <= self.clear_above)

    def describe(self, x: float) -> str:
        return f"above {fmt(self.above)}" if x > self.above else f"below {fmt(self.below)}"


@dataclass(frozen=True, slots=True)
class Reading:
    """What a condition measured for each new sample."""

    sample: FloatArray
    measure: FloatArray
    # Windowed kinds: samples, mean and std of the window each measure was taken over.
    count: IntArray | None = None
    mean: FloatArray | None = None
    std: FloatArray | None = None


class Condition(ABC):
    # How many samples before the oldest new one `read` looks at.
    lookback: int = 0
    levels: Levels

    @abstractmethod
    def read(self, view: View) -> Reading:
        """Measure the view's new samples."""

    @abstractmethod
    def describe(self, reading: Reading, i: int) -> str:
        """What new sample ``i`` measured, as the part of a summary after the signal's name."""


class ValueCondition(Condition):
    def __init__(self, spec: ThresholdRule | RangeRule) -> None:
        self.levels = Levels.of(spec)

    def read(self, view: View) -> Reading:
        x = view.new_values
        return Reading(x, x)

    def describe(self, reading: Reading, i: int) -> str:
        x = float(reading.sample[i])
        return f"= {fmt(x)} {self.levels.describe(x)}"


class RateCondition(Condition):
    lookback = 1

    def __init__(self, spec: RateRule) -> None:
        self.levels = Levels.magnitude(spec.max_rate_per_second)

    def read(self, view: View) -> Reading:
        start = max(view.first - 1, 0)
        dv = np.diff(view.v[start:])
        dt = np.diff(view.t[start:])
        rate = np.divide(dv, dt, out=np.full_like(dv, np.nan), where=dt > 0.0)
        if view.first == 0:
            rate = np.concatenate(([np.nan], rate))
        return Reading(view.new_values, rate)

    def describe(self, reading: Reading, i: int) -> str:
        return (
            f"= {fmt(float(reading.sample[i]))} changing at {fmt(float(reading.measure[i]))}/s, "
            f"limit {fmt(self.levels.above)}/s"
        )


class ZScoreCondition(Condition):
    def __init__(self, spec: ZScoreRule) -> None:
        self._window: WindowSpec = spec
        self.lookback = spec.window_capacity
        self.levels = Levels.magnitude(spec.threshold)
        # A zero std with no floor would divide by zero; the smallest float keeps z finite.
        self._min_std = max(spec.min_std, np.finfo(np.float64).tiny)

    def read(self, view: View) -> Reading:
        count, mean, std = view.stats(self._window, include_newest=False)
        x = view.new_values
        z = (x - mean) / np.maximum(std, self._min_std)
        return Reading(x, z, count, mean, std)

    def describe(self, reading: Reading, i: int) -> str:
        assert reading.count is not None and reading.mean is not None and reading.std is not None
        return (
            f"= {fmt(float(reading.sample[i]))}, z = {reading.measure[i]:.2f} against "
            f"mean {fmt(float(reading.mean[i]))}, std {fmt(float(reading.std[i]))} "
            f"over {reading.count[i]} samples (limit {fmt(self.levels.above)})"
        )


class RollingMeanCondition(Condition):
    def __init__(self, spec: RollingMeanRule) -> None:
        self._window: WindowSpec = spec
        self.lookback = spec.window_capacity - 1
        self.levels = Levels.of(spec)

    def read(self, view: View) -> Reading:
        count, mean, std = view.stats(self._window, include_newest=True)
        return Reading(view.new_values, mean, count, mean, std)

    def describe(self, reading: Reading, i: int) -> str:
        assert reading.count is not None
        mean = float(reading.measure[i])
        return f"mean {fmt(mean)} over {reading.count[i]} samples {self.levels.describe(mean)}"


def condition_for(rule: SignalRuleSpec) -> Condition:
    if isinstance(rule, ThresholdRule | RangeRule):
        return ValueCondition(rule)
    if isinstance(rule, RateRule):
        return RateCondition(rule)
    if isinstance(rule, ZScoreRule):
        return ZScoreCondition(rule)
    return RollingMeanCondition(rule)


def consecutive(hit: BoolArray, carry: int) -> NDArray[np.int64]:
    """Length of the run of hits ending at each sample. ``carry`` is the length of the run that
    ended the previous chunk."""
    index = np.arange(len(hit), dtype=np.int64)
    last_miss = np.maximum.accumulate(np.where(hit, -1, index))
    run = index - last_miss
    run[last_miss < 0] += carry
    return run
