"""Market data for trading systems: ticks and bars, a TCP line feed, a CSV replayer, a simulator.

On the wire a quote is one JSON line, ``{"symbol": "ACME", "ts": <epoch s>, "price": .., ...}``;
the bridge decodes it with the JSON codec and ``prefix_field: symbol`` into signals such as
``ACME.price``. The simulator is geometric Brownian motion with the shocks a trading MAS must
cope with: a price gap, a volatility spike and a stale feed (price frozen while the market moves).
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwbridge.backoff import Backoff
from hwbridge.config import TcpFeedConfig
from hwbridge.ingest import Delivery

log = structlog.get_logger(__name__)

Times = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Tick:
    symbol: str
    at: datetime
    price: float
    volume: float

    def values(self) -> dict[str, float]:
        return {"price": self.price, "volume": self.volume}


@dataclass(frozen=True)
class Bar:
    symbol: str
    at: datetime
    open: float
    high: float
    low: float
    close: float
    volume: float

    def values(self) -> dict[str, float]:
        return {
            "open": self.open,
            "high": self.high,
            "low": self.low,
            "close": self.close,
            "volume": self.volume,
        }


Quote = Tick | Bar


def to_line(quote: Quote) -> bytes:
    record = {"symbol": quote.symbol, "ts": quote.at.timestamp(), **quote.values()}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


# ------------------------------------------------------------------ TCP line feed


@dataclass
class TcpFeedStats:
    connects: int = 0
    # Lines longer than max_line_bytes: discarded by the stream reader before they can be kept.
    oversized: int = 0


class TcpLineFeed:
    """Yields one delivery per line, reconnecting with backoff. TCP has no acknowledgements:
    lines read but not yet durable at poirotd are lost if the bridge stops (the feed is live)."""

    def __init__(self, config: TcpFeedConfig) -> None:
        self._config = config
        self.name = config.name
        self.stats = TcpFeedStats()

    async def deliveries(self) -> AsyncGenerator[Delivery]:
        config, backoff = self._config, Backoff(self._config.backoff)
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    config.host, config.port, limit=config.max_line_bytes
                )
            except OSError as exc:
                log.warning("tcp feed connect failed", feed=config.name, error=str(exc))
                await backoff.sleep()
                continue
            self.stats.connects += 1
            backoff.reset()
            try:
                while line := await self._readline(reader):
                    if line.strip():
                        yield Delivery(
                            config.name, line.rstrip(b"\r\n"), datetime.now(UTC), _no_ack
                        )
            except OSError as exc:
                log.warning("tcp feed lost", feed=config.name, error=str(exc))
            finally:
                writer.close()
            await backoff.sleep()

    async def _readline(self, reader: asyncio.StreamReader) -> bytes:
        """The next line (b"" at end of stream); an oversized line is counted and skipped."""
        while True:
            try:
                return await reader.readline()
            except ValueError:  # over the limit; the reader dropped what it had buffered
                self.stats.oversized += 1
                log.warning("tcp feed line too long", feed=self._config.name)


def _no_ack() -> None:
    """TCP feeds cannot be asked to resend: nothing to acknowledge."""


# ------------------------------------------------------------------ CSV replay


def read_csv(path: Path) -> Iterator[Quote]:
    """Ticks (columns ts, symbol, price, volume) or bars (ts, symbol, open, high, low, close,
    volume); ts is epoch seconds or ISO-8601. Raises ValueError naming the offending line."""
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        columns = set(reader.fieldnames or ())
        if {"ts", "symbol", "price", "volume"} <= columns:
            kind = "tick"
        elif {"ts", "symbol", "open", "high", "low", "close", "volume"} <= columns:
            kind = "bar"
        else:
            raise ValueError(f"{path}: header {sorted(columns)} is neither ticks nor bars")
        for row in reader:
            try:
                yield _quote(kind, row)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{reader.line_num}: {exc}") from exc


def _quote(kind: str, row: dict[str, str]) -> Quote:
    at = _csv_time(row["ts"])
    if kind == "tick":
        return Tick(row["symbol"], at, float(row["price"]), float(row["volume"]))
    fields = (float(row[k]) for k in ("open", "high", "low", "close", "volume"))
    return Bar(row["symbol"], at, *fields)


def _csv_time(text: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        parsed = datetime.fromisoformat(text)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


async def replay(
    quotes: Iterable[Quote], *, speed: float, rebase_to: datetime | None = None
) -> AsyncIterator[Quote]:
    """Yields quotes paced by their own timestamps, compressed `speed` times (60 = one recorded
    minute per second). With `rebase_to`, timestamps become rebase_to + elapsed / speed, i.e.
    the compressed time a live consumer sees; otherwise they stay as recorded."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    loop = asyncio.get_running_loop()
    started, first = loop.time(), None
    for quote in quotes:
        first = first or quote.at
        elapsed = (quote.at - first).total_seconds() / speed
        delay = started + elapsed - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if rebase_to is not None:
            quote = _at(quote, rebase_to + timedelta(seconds=elapsed))
        yield quote


def _at(quote: Quote, at: datetime) -> Quote:
    if isinstance(quote, Tick):
        return Tick(quote.symbol, at, quote.price, quote.volume)
    return Bar(quote.symbol, at, quote.open, quote.high, quote.low, quote.close, quote.volume)


# ------------------------------------------------------------------ simulator

# Volatility and drift are annual, as quoted; time advances in trading seconds.
TRADING_SECONDS_PER_YEAR = 252 * 6.5 * 3600


class SymbolSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    symbol: str = Field(min_length=1)
    price: float = Field(gt=0)
    mu: float = 0.05
    sigma: float = Field(default=0.3, gt=0)


class ShockSpec(BaseModel):
    """gap: the price jumps by `magnitude` (relative, -0.08 = 8 % down) at start_s.
    vol_spike: volatility times `magnitude` for duration_s. stale: the feed repeats its last
    price (volume 0) for duration_s while the market moves on; the catch-up shows at the end."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["gap", "vol_spike", "stale"]
    # None = every symbol.
    symbol: str | None = None
    start_s: float = Field(ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    magnitude: float = 0.0

    @model_validator(mode="after")
    def _meaningful(self) -> ShockSpec:
        if self.kind == "gap" and (self.magnitude <= -1 or self.magnitude == 0):
            raise ValueError("a gap needs a relative magnitude in (-1, 0) or > 0")
        if self.kind == "vol_spike" and self.magnitude <= 1:
            raise ValueError("a vol_spike needs a volatility multiplier > 1")
        if self.kind != "gap" and self.duration_s is None:
            raise ValueError(f"a {self.kind} shock needs duration_s")
        return self

    def applies_to(self, symbol: str) -> bool:
        return self.symbol is None or self.symbol == symbol

    def active(self, t: Times) -> Mask:
        end = self.start_s + (self.duration_s or 0.0)
        mask: Mask = (t >= self.start_s) & (t < end)
        return mask


class MarketSimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    symbols: tuple[SymbolSpec, ...] = (SymbolSpec(symbol="ACME", price=100.0),)
    tick_interval_s: float = Field(default=0.1, gt=0)
    mean_volume: float = Field(default=100.0, gt=0)
    shocks: tuple[ShockSpec, ...] = ()
    seed: int | None = None


@dataclass
class _SymbolState:
    log_price: float
    reported: float
    gaps_done: set[int]


class MarketSimulator:
    """Deterministic for a seed; ``advance(until_s)`` returns the ticks up to that simulated
    time since the previous call, in time order."""

    def __init__(self, config: MarketSimConfig, *, origin: datetime | None = None) -> None:
        self._config = config
        self._origin = origin or datetime.now(UTC)
        self._rng = np.random.default_rng(config.seed)
        self._next = 0
        self._state = {
            s.symbol: _SymbolState(math.log(s.price), s.price, set()) for s in config.symbols
        }

    def advance(self, until_s: float) -> list[Tick]:
        interval = self._config.tick_interval_s
        last = math.ceil(until_s / interval - 1e-9)
        t = np.arange(self._next, max(self._next, last), dtype=np.float64) * interval
        self._next = max(self._next, last)
        if not t.size:
            return []
        per_symbol = [(s.symbol, *self._path(s, t)) for s in self._config.symbols]
        return [
            Tick(symbol, self._origin + timedelta(seconds=float(t[i])), price[i], volume[i])
            for i in range(t.size)
            for symbol, price, volume in per_symbol
        ]

    def _path(self, spec: SymbolSpec, t: Times) -> tuple[list[float], list[float]]:
        state, dt = (
            self._state[spec.symbol],
            self._config.tick_interval_s / TRADING_SECONDS_PER_YEAR,
        )
        shocks = [s for s in self._config.shocks if s.applies_to(spec.symbol)]
        sigma = np.full(t.size, spec.sigma)
        for shock in shocks:
            if shock.kind == "vol_spike":
                sigma[shock.active(t)] *= shock.magnitude
        steps = (spec.mu - sigma**2 / 2) * dt + sigma * math.sqrt(dt) * self._rng.standard_normal(
            t.size
        )
        for i, shock in enumerate(shocks):
            if shock.kind == "gap" and i not in state.gaps_done and t[-1] >= shock.start_s:
                steps[int(np.argmax(t >= shock.start_s))] += math.log1p(shock.magnitude)
                state.gaps_done.add(i)
        price = np.exp(state.log_price + np.cumsum(steps))
        state.log_price = float(np.log(price[-1]))
        volume = self._rng.poisson(self._config.mean_volume, t.size).astype(np.float64)
        stale = np.zeros(t.size, dtype=bool)
        for shock in shocks:
            if shock.kind == "stale":
                stale |= shock.active(t)
        reported = price.copy()
        for i in range(t.size):  # the feed repeats what it last reported while stale
            if stale[i]:
                reported[i] = state.reported
            state.reported = float(reported[i])
        volume[stale] = 0.0
        return reported.tolist(), volume.tolist()
