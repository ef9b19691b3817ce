"""Reconnect delays: exponential, capped, jittered.

Jitter matters here: after a broker or poirotd restart every bridge on the site reconnects at
once, and equal delays would make them retry in lockstep.
"""

from __future__ import annotations

import asyncio
import random

from hwbridge.config import BackoffConfig


class Backoff:
    def __init__(self, config: BackoffConfig) -> None:
        self._config = config
        self._attempt = 0

    def next_delay(self) -> float:
        """Half the exponential step, plus a random part of the other half ("equal jitter")."""
        step = min(self._config.max_s, self._config.initial_s * self._config.factor**self._attempt)
        if step < self._config.max_s:  # stop counting at the cap (factor**n would overflow)
            self._attempt += 1
        return step / 2 + random.uniform(0, step / 2)

    def reset(self) -> None:
        """After a connection that worked, the next failure starts from the initial delay."""
        self._attempt = 0

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_delay())
