"""The shared input pipeline without a transport: batching, backpressure, acknowledgement order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from hwbridge.config import DeadLetterConfig, PipelineConfig, TopicMapping
from hwbridge.deadletter import DeadLetterStore
from hwbridge.ingest import Delivery, TelemetryInput
from hwbridge.topics import Router
from poirotd.model import TelemetryBatch

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_stalled_sink_stops_taking_deliveries_and_acks_keep_their_order() -> None:
    """While the sink does not return, the pipeline takes a bounded number of deliveries from
    the transport (the rest wait there, un-acked); released, it acks every one, in order."""
    config = PipelineConfig(max_batch=8, max_batches_in_flight=1)
    router = Router([TopicMapping(topic="lab/+", component="exo").route()])
    acked: list[int] = []
    taken = 0
    released = asyncio.Event()
    batches: list[TelemetryBatch] = []

    async def sink(batch: TelemetryBatch) -> None:
        await released.wait()
        batches.append(batch)

    async def deliveries() -> AsyncIterator[Delivery]:
        nonlocal taken
        for i in range(1000):
            taken += 1
            yield Delivery("lab/x", b"%d" % i, NOW, functools.partial(acked.append, i))

    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    pipeline = TelemetryInput(router, "s1", sink, dead_letters, config)
    running = asyncio.create_task(pipeline.run(deliveries()))
    for _ in range(50):
        await asyncio.sleep(0)
    # One batch in the sink, one queued for it, one being cut, the received ones, one in hand.
    assert 0 < taken <= config.max_batch * (config.max_batches_in_flight + 3) + 1
    assert acked == []
    released.set()
    async with asyncio.timeout(10):
        await running
    assert acked == list(range(1000))
    assert [value for batch in batches for _, _, value, _ in batch.rows] == [
        float(i) for i in range(1000)
    ]
    assert all(len(batch.rows) <= config.max_batch for batch in batches)
