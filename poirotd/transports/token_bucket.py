"""A token bucket: a rate with a burst, the one shape every rate limit of the daemon takes.

Tokens accrue at `rate` per second up to `burst`. A caller either takes tokens only when they are
there (`try_take`: refuse, or come back later) or reserves them at once and waits out any debt
(`reserve`: pace). The clock is injectable so that tests need not sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class TokenBucket:
    def __init__(self, rate: float, burst: float, *, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs a positive rate and burst ({rate}, {burst})")
        self.rate, self.burst = rate, burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def try_take(self, n: float = 1.0) -> float:
        """Takes `n` tokens if they are there and returns 0; otherwise takes nothing and returns
        the seconds until they will be."""
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return 0.0
        return (n - self._tokens) / self.rate

    def reserve(self, n: float) -> float:
        """Takes `n` tokens now, into debt if need be (also beyond the burst), and returns the
        seconds the caller must wait before using them so that the rate holds. Callers that
        wait in turn are paced: each one's debt adds to the next one's wait."""
        self._refill()
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate)

    @property
    def full(self) -> bool:
        """True when the bucket is as if new: forgetting it changes nothing."""
        self._refill()
        return self._tokens >= self.burst

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
