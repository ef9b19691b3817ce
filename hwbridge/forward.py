"""The gRPC forwarder: a sink that returns only once poirotd has the samples durably.

Samples go out on one long-lived ``Ingest.Stream``; each stream opens with the (idempotent)
session start, and poirotd acks the highest seq it has committed. Agent messages (``messages``)
go out on the same stream: each new session they name is started first (labels input=mqtt),
and one without an index is sent with ``assign_index`` for poirotd to number. Items sent but not
yet acked stay in memory and go out again, in order, on the next stream after a reconnect.
Every item carries an idempotency key (its MQTT producer's, or this forwarder's: a random
producer id per forwarder and a counter), so one committed just before the link broke (its ack
lost) is dropped when it comes again: stored once on one store, whichever replica of it gets it.
Stores that are not shared (each replica its own SQLite file) cannot see each other's keys, but a
replica that drains acks everything it committed before it ends the stream, so only a crash
(kill -9, its acks lost) can leave a copy on two stores.

Targets: ``poirotd.target`` and then ``failover_targets``, in turn: a stream that fails, or that
a draining replica ends (UNAVAILABLE ``draining:``), reconnects to the next one at once. A stream
poirotd ends for having sent nothing for a while (DEADLINE_EXCEEDED ``idle:``, everything acked)
is reopened on the same target once there is something to send.

A sample poirotd refuses (the error names its seq, e.g. a component its spec does not declare)
is dead-lettered and the stream reopened without it, so one bad sample cannot block the rest. A
refused session, or an error that retrying cannot fix, fails the forwarder (``ForwardError``).

grpc.aio reports ``INTERNAL: Internal error from Core`` instead of the server's status when a
write is under way as the server ends the stream (grpc/grpc#36066, fix PR #43486 not released),
so a refusal is only readable if nothing is being written when it comes. Hence each stream sends
the session start alone and waits for its ack, and a stream after a failed one sends the oldest
un-acked sample alone first: if that is the sample poirotd refuses, the refusal arrives intact.
Each failed stream either identifies the refused sample or gets at least that one acked, so a
refused sample is found after at most as many reconnects as samples were ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
import structlog

from hwbridge.backoff import Backoff
from hwbridge.config import PoirotdConfig, PoirotdTlsConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.messages import ReceivedMessage
from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.client.wire import DaemonTls, batched, open_channel
from poirotd.errors import DRAINING, IDLE
from poirotd.model import ItemKey, TelemetryBatch, TelemetrySample

log = structlog.get_logger(__name__)

# poirotd names the refused item "seq N: ..." (proto/poirot/v1/poirot.proto, Ingest.Stream).
_REFUSED_SEQ = re.compile(r"seq (\d+):")
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
_SESSION_SEQ = 1


class ForwardError(RuntimeError):
    """poirotd refused the bridge in a way retrying cannot fix; the message says how."""


@dataclass
class ForwarderStats:
    accepted: int = 0
    sent: int = 0
    resent: int = 0
    durable: int = 0
    rejected: int = 0
    streams: int = 0
    # Items poirotd acked as copies of what it had stored (a resend whose first ack was lost).
    duplicates: int = 0
    # Items poirotd set aside as conflicts: their key was held by other content (a payload that
    # reused its producer's seq), kept for its operator (`poirotd audit conflicts`).
    conflicts: int = 0
    # Streams a draining replica ended (the forwarder went on with the next target).
    drained: int = 0
    # Streams poirotd ended for sending nothing (the next opened when there was something).
    idle: int = 0


class _Call:
    """One sink call: its waiter completes when every one of its samples is settled."""

    def __init__(self, size: int, done: asyncio.Future[None]) -> None:
        self.remaining = size
        self.done = done

    def settle(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and not self.done.done():
            self.done.set_result(None)

    def fail(self, error: Exception) -> None:
        if not self.done.done():  # a cancelled caller's future is done already
            self.done.set_exception(error)


# What an item carries: a sample, an agent message, or the start of a message's session.
_Carried = TelemetrySample | ReceivedMessage | pb.SessionStart


@dataclass(eq=False)
class _Item:
    carried: _Carried
    call: _Call
    # The item's idempotency key, kept across resends: its producer's own (an MQTT payload's),
    # or the forwarder's.
    key: ItemKey
    seq: int = 0

    def request(self) -> pb.IngestRequest:
        carried = self.carried
        if isinstance(carried, TelemetrySample):
            request = pb.IngestRequest(telemetry=convert.telemetry(carried))
        elif isinstance(carried, pb.SessionStart):
            request = pb.IngestRequest(session_start=carried)
        else:
            request = convert.ingest_request(carried.message)
            request.agent_message.assign_index = not carried.numbered
        request.producer, request.producer_seq = self.key
        return request

    def dead_letter(self) -> bytes:
        carried = self.carried
        if isinstance(carried, TelemetrySample):
            return carried.model_dump_json().encode()
        if isinstance(carried, pb.SessionStart):
            return str(carried).encode()
        return carried.payload


class Forwarder:
    """A sink (``await forwarder(batch)``); use as ``async with Forwarder(...) as forwarder``.

    Memory is bounded by ``max_pending`` samples not yet durable: callers wait for room (a call
    larger than the window is admitted alone), which is the backpressure the inputs pass on.
    """

    def __init__(
        self, config: PoirotdConfig, session_id: str, dead_letters: DeadLetterStore
    ) -> None:
        self._config = config
        self._session_id = session_id
        # One producer per forwarder: what it resends is what it holds in memory, so a new
        # process (a new id) never has a key of an earlier one's.
        self.producer = f"hwbridge-{uuid.uuid4().hex}"
        self._keys = itertools.count(1)
        self._started_at = datetime.now(UTC)
        self._dead_letters = dead_letters
        self._unsent: deque[_Item] = deque()
        # Sessions started on poirotd (or about to be): the bridge's, and its messages'.
        self._started = {session_id}
        self._inflight: deque[_Item] = deque()
        self._pending = 0
        self._admission = asyncio.Lock()  # FIFO: calls enter the window in call order
        self._room = asyncio.Event()
        self._wake = asyncio.Event()
        # Highest seq acked on the current stream, and a signal for each new ack.
        self._stream_acked = 0
        self._acked = asyncio.Event()
        self._failure: ForwardError | None = None
        self._task: asyncio.Task[None] | None = None
        ms = int(config.backoff.max_s * 1000)
        self._targets = (config.target, *config.failover_targets)
        self._channels = [
            open_channel(
                target,
                tls=_client_tls(config.tls),
                token=_token(config.token_file),
                # gRPC's own reconnect backoff goes up to 120 s by default; keep it within ours.
                options=[
                    ("grpc.initial_reconnect_backoff_ms", int(config.backoff.initial_s * 1000)),
                    ("grpc.min_reconnect_backoff_ms", int(config.backoff.initial_s * 1000)),
                    ("grpc.max_reconnect_backoff_ms", ms),
                ],
            )
            for target in self._targets
        ]
        self._stubs = [pb_grpc.IngestStub(channel) for channel in self._channels]
        self._current = 0  # the target streams go to
        self.stats = ForwarderStats()

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name="poirotd-forwarder")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops sending; callers still waiting get ForwardError (their input stays un-acked)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail(ForwardError("forwarder closed"))
        for channel in self._channels:
            await channel.close()

    async def __call__(self, batch: TelemetryBatch) -> None:
        # gRPC carries samples: built here, where the round trip dwarfs their cost.
        await self._send(batch.samples(), batch.keys or ())

    async def messages(self, batch: Sequence[ReceivedMessage]) -> None:
        """The sink of agent messages: returns once poirotd has them durably."""
        carried: list[_Carried] = []
        keys: list[ItemKey | None] = []
        for received in batch:
            message = received.message
            if message.session_id not in self._started:
                self._started.add(message.session_id)
                keys.append(None)
                carried.append(
                    pb.SessionStart(
                        session_id=message.session_id,
                        system=self._config.system,
                        started_at=convert.timestamp(message.sent_at),
                        labels={**self._config.labels, "input": "mqtt"},
                    )
                )
            carried.append(received)
            keys.append(received.key)
        await self._send(carried, keys)

    async def _send(self, carried: Sequence[_Carried], keys: Sequence[ItemKey | None]) -> None:
        """`keys[i]`: item i's own key, if it has one (else it gets one of the forwarder's)."""
        if not carried:
            return
        call = _Call(len(carried), asyncio.get_running_loop().create_future())
        async with self._admission:
            while self._pending and self._pending + len(carried) > self._config.max_pending:
                self._raise_if_failed()
                self._room.clear()
                await self._room.wait()
            self._raise_if_failed()
            self._unsent.extend(
                _Item(one, call, (keys[i] if i < len(keys) else None) or self._own_key())
                for i, one in enumerate(carried)
            )
            self._pending += len(carried)
            self.stats.accepted += len(carried)
            self._wake.set()
        await call.done

    def _own_key(self) -> ItemKey:
        return ItemKey(self.producer, next(self._keys))

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------ connection

    async def _run(self) -> None:
        try:
            await self._reconnect_forever()
        except ForwardError as error:
            log.error("forwarder stopped", error=str(error))
            self._fail(error)
        except Exception as exc:  # a bug here must fail the callers, not leave them waiting
            log.exception("forwarder crashed")
            self._fail(ForwardError(f"forwarder crashed: {exc!r}"))

    async def _reconnect_forever(self) -> None:
        backoff = Backoff(self._config.backoff)
        while True:
            acked_before = self.stats.durable
            target = self._targets[self._current]
            try:
                await self._stream()
            except grpc.aio.AioRpcError as error:
                details = error.details() or ""
                if self._drop_refused(details):
                    continue
                if error.code() not in _RETRYABLE:
                    raise ForwardError(
                        f"poirotd at {target} refused session "
                        f"{self._session_id!r}: {error.code().name}: {details}"
                    ) from error
                if details.startswith(IDLE):
                    self.stats.idle += 1
                    await self._until_unsent()
                    continue
                log.warning(
                    "poirotd stream failed", target=target, code=error.code().name, details=details
                )
                # A replica that drains, or fails, leaves the rest to the next one.
                self._current = (self._current + 1) % len(self._targets)
                if details.startswith(DRAINING):
                    self.stats.drained += 1
                    continue
            if self.stats.durable > acked_before:
                backoff.reset()
            await backoff.sleep()

    async def _stream(self) -> None:
        """One Ingest.Stream: resend what the last one left un-acked, then follow new samples."""
        retry = self.stats.streams > 0
        self.stats.resent += len(self._inflight)
        self._unsent.extendleft(reversed(self._inflight))
        self._inflight.clear()
        self._stream_acked = 0
        self.stats.streams += 1
        call = self._stubs[self._current].Stream()
        writer = asyncio.create_task(self._write(call, probe=retry))
        try:
            duplicates = conflicts = 0
            while (ack := await call.read()) is not grpc.aio.EOF:
                self._settle(ack.durable_seq)
                self.stats.duplicates += ack.duplicates - duplicates
                self.stats.conflicts += ack.conflicts - conflicts
                duplicates, conflicts = ack.duplicates, ack.conflicts
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            call.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall, *, probe: bool) -> None:
        """Writes the session start and then samples, those waiting in batched requests; each
        write waits for HTTP/2 flow control. The session start, and after a failed stream the
        first sample, go alone (see above)."""
        session = pb.SessionStart(
            session_id=self._session_id,
            system=self._config.system,
            started_at=convert.timestamp(self._started_at),
            labels=self._config.labels,
        )
        await call.write(pb.IngestRequest(seq=_SESSION_SEQ, session_start=session))
        await self._until_acked(_SESSION_SEQ)
        seq = _SESSION_SEQ
        while True:
            while self._unsent:
                taken = [self._unsent.popleft() for _ in range(1 if probe else len(self._unsent))]
                for item in taken:
                    seq += 1
                    item.seq = seq
                self._inflight.extend(taken)
                singles = (item.request() for item in taken)
                for request in batched(singles, first_seq=taken[0].seq):
                    self.stats.sent += len(request.items)
                    await call.write(request)
                if probe:
                    await self._until_acked(seq)
                    probe = False
            self._wake.clear()
            await self._wake.wait()

    async def _until_unsent(self) -> None:
        """Returns once a sample or message waits to be sent."""
        while not self._unsent:
            self._wake.clear()
            await self._wake.wait()

    async def _until_acked(self, seq: int) -> None:
        while self._stream_acked < seq:
            self._acked.clear()
            await self._acked.wait()

    def _settle(self, durable_seq: int) -> None:
        self._stream_acked = durable_seq
        self._acked.set()
        while self._inflight and self._inflight[0].seq <= durable_seq:
            self._done(self._inflight.popleft())
            self.stats.durable += 1

    def _drop_refused(self, details: str) -> bool:
        """Dead-letters the in-flight sample poirotd named as refused; False if none is named."""
        match = _REFUSED_SEQ.match(details)
        if match is None:
            return False
        seq = int(match[1])
        refused = next((item for item in self._inflight if item.seq == seq), None)
        if refused is None:  # e.g. the session start itself: not droppable
            return False
        self._inflight.remove(refused)
        self._dead_letters.add("poirotd", details, refused.dead_letter())
        self.stats.rejected += 1
        self._done(refused)
        return True

    def _done(self, item: _Item) -> None:
        self._pending -= 1
        item.call.settle()
        self._room.set()

    def _fail(self, error: ForwardError) -> None:
        self._failure = error
        for item in (*self._inflight, *self._unsent):
            item.call.fail(error)
        self._room.set()


def _token(path: Path | None) -> str | None:
    return path.read_text(encoding="utf-8").strip() if path else None


def _client_tls(config: PoirotdTlsConfig | None) -> DaemonTls | None:
    if config is None:
        return None
    return DaemonTls.from_files(
        config.ca_file, config.cert_file, config.key_file, config.server_name
    )
