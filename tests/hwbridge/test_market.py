"""Market data: GBM shocks are visible, the replayer compresses time, the TCP feed reconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from hwbridge import market
from hwbridge.config import BackoffConfig, DeadLetterConfig, PipelineConfig, TcpFeedConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.ingest import TelemetryInput
from hwbridge.topics import Router
from tests.support.waiting import Collector

ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


def simulate(
    seconds: float, *shocks: market.ShockSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, price, volume) of ACME at 10 ticks/s, in one simulated span."""
    config = market.MarketSimConfig(shocks=shocks, seed=11, tick_interval_s=0.1)
    ticks = market.MarketSimulator(config, origin=ORIGIN).advance(seconds)
    t = np.array([(tick.at - ORIGIN).total_seconds() for tick in ticks])
    return t, np.array([tick.price for tick in ticks]), np.array([tick.volume for tick in ticks])


def test_gap_moves_the_price_once_by_its_magnitude() -> None:
    t, price, _ = simulate(20.0, market.ShockSpec(kind="gap", start_s=10.0, magnitude=-0.08))
    returns = np.diff(np.log(price))
    jump = int(np.argmax(np.abs(returns)))
    assert t[jump + 1] == pytest.approx(10.0)
    assert returns[jump] == pytest.approx(np.log(0.92), abs=1e-3)
    assert np.max(np.abs(np.delete(returns, jump))) < 1e-3


def test_volatility_spike_multiplies_the_spread_of_returns() -> None:
    spike = market.ShockSpec(kind="vol_spike", start_s=20.0, duration_s=20.0, magnitude=6.0)
    t, price, _ = simulate(60.0, spike)
    returns, at = np.diff(np.log(price)), t[1:]
    inside = np.std(returns[(at >= 20) & (at < 40)])
    outside = np.std(returns[(at < 20) | (at >= 40)])
    assert 4.5 < inside / outside < 7.5


def test_stale_feed_repeats_its_last_price_then_catches_up() -> None:
    stale = market.ShockSpec(kind="stale", start_s=5.0, duration_s=5.0)
    t, price, volume = simulate(15.0, stale)
    frozen = (t >= 5) & (t < 10)
    assert np.all(price[frozen] == price[np.argmax(frozen) - 1]) and np.all(volume[frozen] == 0)
    assert np.all(np.diff(price[t < 5]) != 0) and np.all(volume[~frozen] > 0)


def test_ticks_are_the_same_however_the_span_is_cut() -> None:
    """Shocks and state carry over between advance() calls (the CLI advances in steps)."""
    shocks = (
        market.ShockSpec(kind="gap", start_s=2.05, magnitude=0.1),
        market.ShockSpec(kind="stale", start_s=3.0, duration_s=1.0),
    )
    config = market.MarketSimConfig(shocks=shocks, seed=5)
    whole = market.MarketSimulator(config, origin=ORIGIN).advance(6.0)
    stepped_sim = market.MarketSimulator(config, origin=ORIGIN)
    stepped = [tick for k in range(1, 61) for tick in stepped_sim.advance(k / 10)]
    assert [tick.at for tick in stepped] == [tick.at for tick in whole]
    gap_at = next(
        i for i, tick in enumerate(stepped) if tick.at >= ORIGIN + timedelta(seconds=2.05)
    )
    assert stepped[gap_at].price / stepped[gap_at - 1].price == pytest.approx(1.1, rel=1e-3)


def test_shock_specs_are_validated() -> None:
    with pytest.raises(ValidationError, match="needs duration_s"):
        market.ShockSpec(kind="stale", start_s=1)
    with pytest.raises(ValidationError, match="multiplier > 1"):
        market.ShockSpec(kind="vol_spike", start_s=1, duration_s=1, magnitude=0.5)
    with pytest.raises(ValidationError, match="relative magnitude"):
        market.ShockSpec(kind="gap", start_s=1, magnitude=-1.5)


def write_csv(path: Path, rows: Sequence[str], header: str = "ts,symbol,price,volume") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


async def test_replay_compresses_time_and_can_rebase(tmp_path: Path) -> None:
    rows = [f"{1_700_000_000 + i},ACME,{100 + i},10" for i in range(5)]  # 4 recorded seconds
    csv = write_csv(tmp_path / "ticks.csv", rows)
    started = time.monotonic()
    replayed = [q async for q in market.replay(market.read_csv(csv), speed=40.0)]
    assert 0.09 <= time.monotonic() - started < 1.0  # 4 s / 40 = 0.1 s
    assert [q.at.timestamp() for q in replayed] == [1_700_000_000 + i for i in range(5)]
    rebased = [q async for q in market.replay(market.read_csv(csv), speed=40.0, rebase_to=ORIGIN)]
    assert rebased[-1].at == ORIGIN + timedelta(seconds=0.1)
    assert market.to_line(rebased[0]).startswith(b'{"symbol":"ACME","ts":')


def test_csv_bars_and_errors_name_the_line(tmp_path: Path) -> None:
    bars = write_csv(
        tmp_path / "bars.csv",
        ["2026-01-01T09:30:00,ACME,1,2,0.5,1.5,900"],
        header="ts,symbol,open,high,low,close,volume",
    )
    (bar,) = market.read_csv(bars)
    assert (
        isinstance(bar, market.Bar)
        and bar.high == 2
        and bar.at == datetime(2026, 1, 1, 9, 30, tzinfo=UTC)
    )
    broken = write_csv(tmp_path / "broken.csv", ["1700000000,ACME,100,1", "1700000001,ACME,abc,1"])
    with pytest.raises(ValueError, match=r"broken\.csv:3"):
        list(market.read_csv(broken))
    with pytest.raises(ValueError, match="neither ticks nor bars"):
        list(market.read_csv(write_csv(tmp_path / "odd.csv", [], header="a,b")))


async def test_tcp_feed_decodes_lines_dead_letters_bad_ones_and_reconnects(tmp_path: Path) -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        tick = market.Tick("ACME", ORIGIN, 100.0 + connections, 5.0)
        writer.write(market.to_line(tick) + b"not json\n" + b"x" * 300 + b"\n\n")
        writer.write(b'{"symbol": "ACME", "ts": 1, "price": 1}\r\n')
        await writer.drain()
        writer.close()  # the feed must reconnect for the second connection's lines

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    feed_config = TcpFeedConfig(
        name="ticks",
        port=port,
        component="market_feed",
        max_line_bytes=128,
        backoff=BackoffConfig(initial_s=0.01, max_s=0.02),
    )
    feed = market.TcpLineFeed(feed_config)
    collector = Collector()
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    pipeline = TelemetryInput(
        Router([feed_config.route()]), "s", collector, dead_letters, PipelineConfig()
    )
    task = asyncio.create_task(pipeline.run(feed.deliveries()))
    try:
        async with asyncio.timeout(5):
            await collector.wait_until(lambda samples: len(samples) >= 6)
    finally:
        task.cancel()
        server.close()
    received = collector.samples
    assert [(s.signal, s.value) for s in received[:3]] == [
        ("ACME.price", 101.0),
        ("ACME.volume", 5.0),
        ("ACME.price", 1.0),
    ]
    assert {s.component for s in received} == {"market_feed"}
    assert feed.stats.connects >= 2 and feed.stats.oversized >= 2
    assert dead_letters.recent()[0].reason.startswith("invalid JSON")
    assert pipeline.stats.undecodable >= 2
