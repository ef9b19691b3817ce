"""gRPC Ingest: each request's items go to the ingest pipeline, and are acked once durable.

A request carries one item or a batch of them (`items`, numbered from the request's seq): the
batched form is what makes high rates possible, each request costing the event loop one turn.
The stream's own rules live here: seqs increase, an item is no larger than the limit, and a
stream that sends nothing for POIROTD_INGEST_IDLE_SECONDS is ended; and the client's: how many
streams it may hold open, and how fast its items are read. The domain rules are the pipeline's.

Idempotency keys: with authentication on, the request's `producer` is scoped by who the caller
authenticated as (``grpc:token:<name>|<producer>``, `poirotd.model.scoped_producer`), so two
clients naming the same producer never hold each other's keys; the replicas of a forwarder that
take over from each other share one identity and keep exactly-once. Without authentication (a
loopback or sidecar port, every caller trusted) the name is the store's key as the client gives
it, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import structlog

from poirotd.api import convert
from poirotd.api.convert import UnnumberedMessage
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import (
    IDLE,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    ServiceError,
    Unavailable,
    draining,
)
from poirotd.ingest.pipeline import Admission, IngestPipeline
from poirotd.ingest.validation import IngestScope
from poirotd.model import (
    MAX_INTEGER,
    AgentMessage,
    IngestItem,
    ItemKey,
    producer_problem,
    scoped_producer,
)
from poirotd.observability.metrics import Metrics
from poirotd.transports.grpc.auth import caller
from poirotd.transports.grpc.clients import ClientLimits, client_identity
from poirotd.transports.grpc.status import abort

log = structlog.get_logger(__name__)

_RPC = "Ingest.Stream"
_MAX_SEQ = 2**64 - 1


@dataclass(frozen=True)
class _Pending:
    """Admitted items of one request, acknowledged as `seq` once durable."""

    seq: int
    admission: Admission


class _Unacked:
    """A stream's admitted requests not yet acknowledged, in order, and how the stream ends.
    Reading pauses while a transaction's worth of items waits (HTTP/2 flow control then pushes
    back on the client), and a stream silent for `idle_seconds` with nothing unacked is
    ended."""

    def __init__(self, limit: int, idle_seconds: float) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        # The reader's deadline while it waits for a request (see `next_request`).
        self._silence: asyncio.Timeout | None = None
        self._pending: deque[_Pending] = deque()
        self._items = 0
        self._ended = False
        self.error: ServiceError | None = None
        # Items acked so far that the store dropped as copies of stored ones, or set aside as
        # conflicts.
        self.duplicates = 0
        self.conflicts = 0
        self._changed = asyncio.Condition()

    async def add(self, pending: _Pending) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._items < self._limit)
            self._pending.append(pending)
            self._items += pending.admission.accepted
            self._changed.notify_all()

    async def next_request(self, requests: AsyncIterator[pb.IngestRequest]) -> pb.IngestRequest:
        """The stream's next request; TimeoutError once the stream has sent nothing for
        `idle_seconds` with everything it sent acked. A client that waits for its acks before
        it sends more waits for the daemon, not idle: while requests are unacked there is no
        deadline, and it is set when the last of them is acked."""
        loop = asyncio.get_running_loop()
        when = None if self._pending else loop.time() + self._idle_seconds
        async with asyncio.timeout_at(when) as self._silence:
            try:
                return await anext(requests)
            finally:
                self._silence = None

    async def end(self, error: ServiceError | None) -> None:
        async with self._changed:
            self._ended, self.error = True, error
            self._changed.notify_all()

    async def next_durable(self) -> int | None:
        """Waits until the oldest request is durable; returns the highest seq durable now (the
        requests behind it that are durable too are acked with it), or None at the end."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._pending) or self._ended)
            if not self._pending:
                return None
            oldest = self._pending[0]
        await oldest.admission.wait()  # a failed commit raises here
        async with self._changed:
            seq = 0
            while self._pending and self._pending[0].admission.durable.done():
                done = self._pending.popleft()
                self.duplicates += done.admission.duplicates()
                self.conflicts += done.admission.conflicts()
                self._items -= done.admission.accepted
                seq = done.seq
            if not self._pending and self._silence is not None:
                # Only the reader adds requests: it waits, and from now on the stream is silent.
                self._silence.reschedule(asyncio.get_running_loop().time() + self._idle_seconds)
            self._changed.notify_all()
            return seq


class _StreamOrder:
    """The stream rules: seqs increase, and no item is larger than the limit."""

    def __init__(self, max_item_bytes: int) -> None:
        self.max_item_bytes = max_item_bytes
        self.last_seq = 0

    def check(self, seq: int, size_bytes: int) -> None:
        if seq > _MAX_SEQ:  # a batch numbered from near the top runs past an ack's uint64
            raise InvalidArgument(f"seq {seq} is beyond {_MAX_SEQ}", reason="invalid")
        if seq <= self.last_seq:
            raise InvalidArgument(
                f"seq {seq}: seq must increase within a stream (last was {self.last_seq})",
                reason="invalid",
            )
        if size_bytes > self.max_item_bytes:
            raise ResourceExhausted(
                f"seq {seq}: item is {size_bytes} bytes, the limit is {self.max_item_bytes}",
                reason="oversized",
            )
        self.last_seq = seq


class IngestServicer(pb_grpc.IngestServicer):
    def __init__(
        self,
        pipeline: IngestPipeline,
        metrics: Metrics,
        limits: ClientLimits,
        *,
        max_item_bytes: int,
        batch_max: int,
        idle_seconds: float,
    ) -> None:
        self._pipeline = pipeline
        self._metrics = metrics
        self._limits = limits
        self._max_item_bytes = max_item_bytes
        self._batch_max = batch_max
        self._idle_seconds = idle_seconds
        # Set on SIGTERM: open streams stop reading, are acked to the end and closed.
        self._draining = asyncio.Event()
        self._open = 0
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    async def drain(self, wait_seconds: float) -> None:
        """Ends every open stream the clean way (see `_read`) and refuses new ones; returns
        once all have ended, or after `wait_seconds` (a stream whose commit is stuck)."""
        self._draining.set()
        try:
            async with asyncio.timeout(wait_seconds):
                await self._all_closed.wait()
        except TimeoutError:
            log.warning("ingest streams still open after the drain timeout", open=self._open)

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.IngestRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.IngestAck]:
        client = client_identity(context)
        if self._draining.is_set():
            await abort(context, self._metrics, _RPC, draining())
        try:
            held = self._limits.ingest_streams.hold(client)
        except ServiceError as refused:
            await abort(context, self._metrics, _RPC, refused)
        self._open += 1
        self._all_closed.clear()
        try:
            with held:
                acks = self._acks(request_iterator, context, client)
                async with contextlib.aclosing(acks) as ackings:
                    async for ack in ackings:
                        yield ack
        finally:
            self._open -= 1
            if not self._open:
                self._all_closed.set()

    async def _acks(
        self,
        request_iterator: AsyncIterator[pb.IngestRequest],
        context: grpc.aio.ServicerContext,
        client: str,
    ) -> AsyncGenerator[pb.IngestAck]:
        unacked = _Unacked(self._batch_max, self._idle_seconds)
        reading = asyncio.Event()  # set while the reader waits for a request
        reader = asyncio.create_task(self._read(request_iterator, unacked, client, reading))
        stopper = asyncio.create_task(self._stop_reading(reader, reading))
        try:
            while True:
                try:
                    seq = await unacked.next_durable()
                except Exception as exc:
                    error = Unavailable(f"store write failed: {exc}", reason="store_error")
                    await abort(context, self._metrics, _RPC, error)
                if seq is None:
                    break
                yield pb.IngestAck(
                    durable_seq=seq, duplicates=unacked.duplicates, conflicts=unacked.conflicts
                )
            if unacked.error is not None:
                await abort(context, self._metrics, _RPC, unacked.error)
        finally:
            stopper.cancel()
            reader.cancel()

    async def _read(
        self,
        requests: AsyncIterator[pb.IngestRequest],
        unacked: _Unacked,
        client: str,
        reading: asyncio.Event,
    ) -> None:
        scope = self._pipeline.scope()
        order = _StreamOrder(self._max_item_bytes)
        identity = caller()
        producers = "" if identity is None else f"grpc:{identity.qualified_name}"
        received = aiter(requests)
        while True:
            if self._draining.is_set():
                # What was read is admitted: it is committed and acked before the stream ends,
                # and the client resends the rest to another replica.
                await unacked.end(draining())
                return
            try:
                reading.set()
                request = await unacked.next_request(received)
            except StopAsyncIteration:
                break
            except TimeoutError:
                # A producer that stopped sending gives its client's stream slot back; all it
                # sent is acked already.
                await unacked.end(_idle(self._idle_seconds))
                return
            except asyncio.CancelledError:
                if not self._draining.is_set():
                    raise
                # Cancelled waiting for a request (see `_stop_reading`): none was read.
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                await unacked.end(draining())
                return
            except grpc.aio.AbortError:  # the daemon ended the stream itself (a status sent)
                return
            except Exception as exc:  # grpc could not decode the next request
                log.warning("ingest request unreadable", after_seq=order.last_seq, error=repr(exc))
                message = f"the request after seq {order.last_seq} could not be read: {exc}"
                await unacked.end(InvalidArgument(message, reason="undecodable"))
                return
            finally:
                reading.clear()
            await self._pace(client, len(request.items) or 1)
            error = await self._admit(request, scope, order, unacked, producers)
            if error is not None:
                await unacked.end(error)
                return
        await unacked.end(None)

    async def _stop_reading(self, reader: asyncio.Task[None], reading: asyncio.Event) -> None:
        """On drain, cancels the stream's reader if it waits for a request (a request not read
        by then stays the client's: neither admitted nor acked); a reader busy admitting one
        stops before the next read."""
        await self._draining.wait()
        if reading.is_set():
            reader.cancel()

    async def _pace(self, client: str, items: int) -> None:
        """Keeps the client to POIROTD_INGEST_RATE_PER_CLIENT (over all its streams) by reading
        more slowly: HTTP/2 flow control then makes its writes wait. Refusing instead would end
        the stream and have the client resend from its last ack; paced, nothing is refused,
        nothing is lost, and a client sees only acks arriving at the rate."""
        rates = self._limits.ingest_rate
        wait = rates.reserve(client, items) if rates is not None else 0.0
        if wait:
            self._metrics.ingest_throttled.inc(wait)
            await asyncio.sleep(wait)

    async def _admit(
        self,
        request: pb.IngestRequest,
        scope: IngestScope,
        order: _StreamOrder,
        unacked: _Unacked,
        producers: str,
    ) -> ServiceError | None:
        """Hands the request's items to the pipeline up to the first bad one; returns what is
        wrong with that one (the items before it are still committed and acked). Messages sent
        with assign_index are numbered here, in stream order. `producers`: the scope of the
        caller's producer names ("": none, authentication is off)."""
        seqs: list[int] = []
        items: list[IngestItem] = []
        keys: list[ItemKey | None] = []
        unnumbered: list[int] = []  # positions in `items`
        error: ServiceError | None = None
        try:
            producer = _producer(request, producers)
            unpacked = _unpack(request, datetime.now(UTC), self._max_item_bytes)
            for seq, item, size, producer_seq in unpacked:
                order.check(seq, size)
                key = _key(producer, producer_seq, seq)
                if isinstance(item, UnnumberedMessage):
                    unnumbered.append(len(items))
                    item = item.message
                seqs.append(seq)
                items.append(item)
                keys.append(key)
        except ServiceError as stream_error:
            error = stream_error
        except Exception as exc:  # a bug of ours: the stream ends with a status, not a hang
            log.exception("ingest request failed", seq=request.seq)
            error = Internal(f"seq {request.seq}: request failed: {exc}", reason="internal")
        if unnumbered:
            await self._number(items, unnumbered)
        await self._pipeline.find_sessions(items, scope)
        admission = self._pipeline.accept(items, scope, keys=keys)
        if admission.refused:
            first = admission.refused[0]
            error = first.error.at(f"seq {seqs[first.index]}")
        if admission.accepted:
            seq = seqs[admission.accepted - 1]
            await unacked.add(_Pending(seq, admission))
        return error

    async def _number(self, items: list[IngestItem], positions: Sequence[int]) -> None:
        indexes = self._pipeline.indexes
        numbered = set(positions)
        chosen = [
            (item.session_id, item.index)
            for i, item in enumerate(items)
            if i not in numbered and isinstance(item, AgentMessage)
        ]
        await indexes.learn((items[i].session_id for i in positions), chosen)
        for i, item in enumerate(items):
            if i in numbered:
                items[i] = item.model_copy(update={"index": indexes.take(item.session_id)})
            elif isinstance(item, AgentMessage):
                # A producer's own index earlier in this request: number past it.
                indexes.observe(item.session_id, item.index)


def _idle(seconds: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"{IDLE} no request for {seconds:g} s (POIROTD_INGEST_IDLE_SECONDS={seconds:g}); "
        "everything sent is acked: open a new stream to send more",
        reason="idle",
    )


def _producer(request: pb.IngestRequest, scope: str) -> str:
    """The request's producer, checked, as the store keys on it: within `scope` when one is
    given ("": its items carry no keys)."""
    producer = request.producer
    if problem := producer_problem(producer):
        raise InvalidArgument(f"seq {request.seq}: {problem}", reason="invalid")
    return scoped_producer(scope, producer) if producer and scope else producer


def _key(producer: str, producer_seq: int, seq: int) -> ItemKey | None:
    if not producer_seq:
        return None
    if not producer:
        raise InvalidArgument(f"seq {seq}: producer_seq needs a producer", reason="invalid")
    if producer_seq > MAX_INTEGER:
        raise InvalidArgument(
            f"seq {seq}: producer_seq {producer_seq} is beyond {MAX_INTEGER}", reason="invalid"
        )
    return ItemKey(producer, producer_seq)


def _unpack(
    request: pb.IngestRequest, received_at: datetime, item_limit: int
) -> Iterator[tuple[int, IngestItem | UnnumberedMessage, int, int]]:
    """(seq, item, its size in bytes, its producer_seq) for each item of the request, in order.
    Within a batch no larger than `item_limit`, the batch's size stands for each item's (no
    item can exceed it): sizing an item means serialising it, a tenth of the cost of converting
    it."""
    request_bytes = request.ByteSize()
    if not request.items:
        item = convert.ingest_item(request, request.seq, received_at)
        yield request.seq, item, request_bytes, request.producer_seq
        return
    if request.WhichOneof("item") is not None:
        raise InvalidArgument(
            f"seq {request.seq}: a request carries one item or a batch of items, not both",
            reason="invalid",
        )
    sized_each = request_bytes > item_limit
    for offset, entry in enumerate(request.items):
        seq = request.seq + offset
        size = entry.ByteSize() if sized_each else request_bytes
        yield seq, convert.ingest_item(entry, seq, received_at), size, entry.producer_seq
