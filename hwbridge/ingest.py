"""The input pipeline every transport shares: payload -> items -> sink -> acknowledgement.

A transport (MQTT, a TCP line feed) yields ``Delivery`` objects; this module decodes them through
the routes, hands the items to a sink in batches (telemetry: a ``TelemetryBatch``, rows of the
session, no pydantic object per sample; agent messages: a list of ``ReceivedMessage``) and
acknowledges each delivery back to its
transport only after the sink has accepted every batch up to and including it, in arrival order
(MQTT requires PUBACKs in the order the PUBLISHes came, MQTT-4.6.0-2). For the gRPC forwarder,
"accepted" means durable at poirotd; for an in-process daemon, committed to its store.

Memory is bounded by backpressure, not by dropping: a full queue of received deliveries (kept
undecoded: a payload is far smaller than its samples) stops reading from the transport, and at
most ``max_batches_in_flight`` sink calls are outstanding. For MQTT at QoS 1
that reaches the broker, which stops sending once its in-flight window of un-acked messages is
full and queues the rest (persisted) on its side.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, NamedTuple, TypeVar

from hwbridge.codecs import DecodeError, DocumentCodec
from hwbridge.config import PipelineConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.messages import PINNABLE, MessageRoute, ReceivedMessage, RouteRefusedError
from hwbridge.topics import Route, Router, RouteT, topic_key
from poirotd.model import ItemKey, SampleRow, TelemetryBatch, producer_problem

# The in-process consumer interfaces: return once the sink has taken responsibility for the
# batch; raising means it has not, and nothing from that batch on is acknowledged.
Sink = Callable[[TelemetryBatch], Awaitable[None]]
MessageSink = Callable[[list[ReceivedMessage]], Awaitable[None]]
ItemT = TypeVar("ItemT")
BatchT = TypeVar("BatchT")


class Delivery(NamedTuple):
    # MQTT topic, or a TCP feed's name.
    source: str
    payload: bytes
    received_at: datetime
    # Tells the transport this delivery is taken care of (MQTT: send the PUBACK).
    ack: Callable[[], None]


@dataclass
class InputStats:
    received: int = 0  # deliveries
    decoded: int = 0  # items: samples, or agent messages
    undecodable: int = 0  # deliveries dead-lettered: bad payload, too large, or no route
    forwarded: int = 0  # items the sink accepted
    acked: int = 0  # deliveries acknowledged to the transport


class _Received:
    """Received deliveries on their way to the batching task, at most `limit` (None marks the
    end). What a bounded asyncio.Queue does, with a deque append and popleft per delivery:
    the queue's put and get are Python-level calls each (measured: a sixth of the input's own
    cost per one-reading message). One task adds, one takes."""

    def __init__(self, limit: int) -> None:
        self.items: deque[Delivery | None] = deque()
        self._limit = limit
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()

    async def add(self, item: Delivery | None) -> None:
        items = self.items
        while len(items) >= self._limit:
            self._room.clear()
            await self._room.wait()
        items.append(item)
        if len(items) == 1:  # the taker may be waiting for the first
            self._arrived.set()

    async def first(self) -> Delivery | None:
        """Waits for a delivery (or the end) and takes it; the rest are in `items`."""
        while not self.items:
            self._arrived.clear()
            await self._arrived.wait()
        return self.items.popleft()

    def taken(self) -> None:
        """Call after taking items with `items.popleft()`: frees an adder waiting for room."""
        self._room.set()


@dataclass(frozen=True)
class _Batch:
    sink_call: asyncio.Task[None] | None
    deliveries: list[Delivery]


class DeliveryInput(ABC, Generic[RouteT, ItemT, BatchT]):
    """The pipeline for one kind of item; a subclass decodes a delivery on its route and says
    what batch of items its sink takes."""

    def __init__(
        self,
        router: Router[RouteT],
        session_id: str,
        sink: Callable[[BatchT], Awaitable[None]],
        dead_letters: DeadLetterStore,
        config: PipelineConfig,
    ) -> None:
        self._router = router
        self._session_id = session_id
        self._sink = sink
        self._dead_letters = dead_letters
        self._config = config
        self.stats = InputStats()

    @abstractmethod
    def _items(self, route: RouteT, captures: tuple[str, ...], delivery: Delivery) -> list[ItemT]:
        """The delivery's items; raises DecodeError saying why there are none."""

    @abstractmethod
    def _batch(self, items: list[ItemT]) -> BatchT:
        """What the sink takes for these items."""

    def decode(self, delivery: Delivery) -> list[ItemT]:
        """The delivery's items; an undecodable delivery is counted, dead-lettered and yields
        []."""
        self.stats.received += 1
        source, payload = delivery.source, delivery.payload
        try:
            if len(payload) > self._config.max_payload_bytes:
                raise DecodeError(
                    f"payload is {len(payload)} bytes, "
                    f"over the {self._config.max_payload_bytes}-byte limit"
                )
            resolved = self._router.resolve(source)
            if resolved is None:
                # Possible with a persistent session: the broker keeps subscriptions of an older
                # configuration until they are unsubscribed.
                raise DecodeError("no mapping for this topic")
            items = self._items(*resolved, delivery)
        except DecodeError as exc:
            self.stats.undecodable += 1
            self._dead_letters.add(source, str(exc), payload)
            return []
        self.stats.decoded += len(items)
        return items

    async def run(self, deliveries: AsyncIterable[Delivery]) -> None:
        """Runs until the deliveries end (everything then acked) or the task is cancelled.

        Raises what the sink raised; deliveries from the failed batch on stay un-acked, so an
        MQTT broker redelivers them to the next session.
        """
        received = _Received(self._config.max_batch)
        batches: asyncio.Queue[_Batch | None] = asyncio.Queue(self._config.max_batches_in_flight)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive_all(deliveries, received))
                group.create_task(self._batch_all(received, batches, group))
                group.create_task(self._ack_all(batches))
        except ExceptionGroup as failure:  # the first failure is the cause; the rest follow it
            raise failure.exceptions[0] from failure

    async def _receive_all(self, deliveries: AsyncIterable[Delivery], received: _Received) -> None:
        async for delivery in deliveries:
            await received.add(delivery)
        await received.add(None)

    async def _batch_all(
        self,
        received: _Received,
        batches: asyncio.Queue[_Batch | None],
        group: asyncio.TaskGroup,
    ) -> None:
        """Waits for one delivery, then takes whatever else has already arrived, decoding as it
        goes: batches grow under load and cost no added latency when idle. A batch may exceed
        max_batch by the samples of its last delivery (deliveries are never split)."""
        waiting, ended = received.items, False
        while not ended:
            first = await received.first()
            if first is None:
                break
            deliveries, rows = [first], self.decode(first)
            while len(rows) < self._config.max_batch and waiting:
                more = waiting.popleft()
                if more is None:
                    ended = True
                    break
                deliveries.append(more)
                rows.extend(self.decode(more))
            received.taken()
            # The batch is made here, in decoding order (a telemetry batch takes the keys its
            # deliveries' decoding noted).
            batch = self._batch(rows) if rows else None
            sink_call = None if batch is None else group.create_task(self._forward(batch, rows))
            await batches.put(_Batch(sink_call, deliveries))
        await batches.put(None)

    async def _forward(self, batch: BatchT, items: list[ItemT]) -> None:
        await self._sink(batch)
        self.stats.forwarded += len(items)

    async def _ack_all(self, batches: asyncio.Queue[_Batch | None]) -> None:
        while (batch := await batches.get()) is not None:
            if batch.sink_call is not None:
                await batch.sink_call
            for delivery in batch.deliveries:
                delivery.ack()
            self.stats.acked += len(batch.deliveries)


def _row_keys(key: ItemKey, rows: int) -> list[ItemKey]:
    """Each reading of a keyed delivery its own key, as decoding orders them (the same for a
    copy of the payload): the first the payload's, the j-th the payload's with `#j` after the
    producer. Every sample is an item of its own downstream (the forwarder sends each alone)."""
    keys = [key] + [ItemKey(f"{key.producer}#{j}", key.seq) for j in range(1, rows)]
    if problem := producer_problem(keys[-1].producer):
        raise DecodeError(f"the producer's name with #{rows - 1}: {problem}")
    return keys


class TelemetryInput(DeliveryInput[Route, SampleRow, TelemetryBatch]):
    """A delivery on a keyed route (its codec reads a producer's key) gives each of its rows
    a key (`_row_keys`), scoped by the topic (or feed) it came on, `transport` saying which
    ("mqtt", "tcp"); the batch holds them, row by row, while any delivery in it had one."""

    def __init__(
        self,
        router: Router[Route],
        session_id: str,
        sink: Sink,
        dead_letters: DeadLetterStore,
        config: PipelineConfig,
        transport: str = "mqtt",
    ) -> None:
        super().__init__(router, session_id, sink, dead_letters, config)
        self._transport = transport
        # The keys of the rows decoded since the last batch was made, once one is keyed.
        self._keys: list[ItemKey | None] | None = None
        self._rows = 0

    def _items(
        self, route: Route, captures: tuple[str, ...], delivery: Delivery
    ) -> list[SampleRow]:
        """Codecs give finite floats and aware times, so rows need no further validation."""
        rows = []
        source = delivery.source
        codec, key = route.codec, None
        if isinstance(codec, DocumentCodec) and codec.keyed:
            readings, (producer, seq) = codec.decode_keyed(delivery.payload, delivery.received_at)
            key = topic_key(source, producer, seq, self._transport)
        else:
            readings = codec.decode(delivery.payload, delivery.received_at)
        for field, value, measured_at in readings:
            component, signal = route.names(field, source, captures)
            if not component or not signal:
                raise DecodeError(f"field {field!r} maps to an empty component or signal")
            rows.append((component, signal, value, measured_at))
        if key is not None and self._keys is None:
            self._keys = [None] * self._rows
        if self._keys is not None:
            self._keys += [None] * len(rows) if key is None else _row_keys(key, len(rows))
        self._rows += len(rows)
        return rows

    def _batch(self, items: list[SampleRow]) -> TelemetryBatch:
        keys, self._keys, self._rows = self._keys, None, 0
        return TelemetryBatch(self._session_id, items, keys)


class MessageInput(DeliveryInput[MessageRoute, ReceivedMessage, list[ReceivedMessage]]):
    """Agent messages: one per delivery, in its session (the payload's, the topic's, or the
    input's `session_id`). Deliveries whose payload chose what its route decides are counted
    by the field (`route_refusals`) besides as undecodable."""

    def __init__(
        self,
        router: Router[MessageRoute],
        session_id: str,
        sink: MessageSink,
        dead_letters: DeadLetterStore,
        config: PipelineConfig,
    ) -> None:
        super().__init__(router, session_id, sink, dead_letters, config)
        self.route_refusals = dict.fromkeys(PINNABLE, 0)

    def _items(
        self, route: MessageRoute, captures: tuple[str, ...], delivery: Delivery
    ) -> list[ReceivedMessage]:
        source, payload = delivery.source, delivery.payload
        try:
            message = route.decode(
                payload, source, captures, delivery.received_at, self._session_id
            )
        except RouteRefusedError as refusal:
            self.route_refusals[refusal.field] += 1
            raise
        return [message]

    def _batch(self, items: list[ReceivedMessage]) -> list[ReceivedMessage]:
        return items
