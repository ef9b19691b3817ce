"""The forwarder fails over between real daemon processes: SIGTERM one mid-stream, and it ends
the stream after acking everything it read (well before its 5 s grace); every acked sample is
in its store, and the forwarder lands the rest on the second daemon, none twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwbridge.config import BackoffConfig, DeadLetterConfig, PoirotdConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import Forwarder
from poirotd.devtools.clinic import BRIDGE_CLINIC
from poirotd.devtools.process import DaemonProcess
from tests.support.bridge import samples, stored_values
from tests.support.daemon import two_replicas


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    with two_replicas(lambda _: BRIDGE_CLINIC, tmp_path) as both:
        yield both


@pytest.mark.slow
@pytest.mark.timeout(300)  # about 5 s on a quiet 2-core box; two daemon starts of up to 120 s
async def test_sigterm_mid_stream_drains_and_the_forwarder_lands_the_rest_elsewhere(
    replicas: tuple[DaemonProcess, DaemonProcess],
) -> None:
    a, b = replicas
    total, per_call = 20_000, 100
    config = PoirotdConfig(
        target=a.grpc_target,
        failover_targets=(b.grpc_target,),
        system="clinic",
        backoff=BackoffConfig(initial_s=0.05, max_s=0.3),
    )
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    async with Forwarder(config, "e2e", dead_letters) as sink:

        async def produce() -> None:
            """Every call at once: the forwarder's window is full of items sent, unacked."""
            calls = (sink(samples(per_call, offset=k * per_call)) for k in range(total // per_call))
            await asyncio.gather(*calls)

        sending = asyncio.create_task(produce())
        async with asyncio.timeout(30):
            while sink.stats.durable < 2000:  # noqa: ASYNC110 - counters have no event
                await asyncio.sleep(0.005)
        acked_by_a = sink.stats.durable
        began = time.monotonic()
        a.signal_stop()
        exit_code = await asyncio.to_thread(a.wait, 30)
        drained_in = time.monotonic() - began
        async with asyncio.timeout(60):
            await sending
        stats = sink.stats
    in_a, in_b = stored_values(a.db_path), stored_values(b.db_path)
    counts = Counter(in_a + in_b)
    print(
        f"\nfailover: {total} sent, {len(in_a)} stored by A (>= {acked_by_a} acked before "
        f"SIGTERM), {len(in_b)} by B, A exited {exit_code} in {drained_in:.2f} s, "
        f"streams {stats.streams}, drained {stats.drained}, resent {stats.resent} (sent to A, "
        f"not acked: A had not read them)"
    )
    assert exit_code == 0
    assert drained_in < 5.0, "the ingest stream ended before the transports' grace ran out"
    assert len(in_a) >= acked_by_a, "everything A acked is in A's store"
    assert set(counts) == {float(i) for i in range(total)}, "nothing lost"
    assert max(counts.values()) == 1, "nothing stored twice: A acked all it committed"
    assert len(in_b) > 0 and stats.streams >= 2
