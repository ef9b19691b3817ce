"""The client SDK: record what a multi-agent system says and measures, ask for investigations and
follow them, confirm their outcome. `AsyncClient` for asyncio code, `Client` (blocking) for the
rest; both speak the daemon's gRPC API (proto/poirot/v1/poirot.proto) through the wire-level
`poirotd.client.wire.PoirotClient` (whose `trigger`, `get`, `watch` and `confirm` they offer),
and answer with its protobuf messages.

    with Client("127.0.0.1:50051", system="clinic") as poirot:
        poirot.start_session("run-42")
        poirot.record("run-42", [Message("doctor", "The offset is noise."),
                                 Sample("exo", "knee_left_deg", 12.5)])
        investigation = poirot.trigger("run-42", "the patient fell")
        for event in poirot.watch(investigation.investigation_id): ...

`record` returns once the daemon has the items durably. A message without an `index` is
numbered by the daemon after its session's last; a refused item raises grpc.aio.AioRpcError
naming it (what came before it is stored).

The package is every connection a user of poirotd opens: this SDK, the wire-level client
(`wire`), and the TLS (`tls`) and secrets (`secrets`) of the connections poirotd and hwbridge
open to a broker or an LLM server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncIterator,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.model import AgentMessage, MessageKind, Session, SessionEnd, TelemetrySample

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    """An agent message to record. `kind`: agent (the sender is an agent of the spec), human,
    system or tool (`tool_name` set, the recipient the agent that called it)."""

    sender: str
    content: str = ""
    recipient: str = ""
    kind: MessageKind = MessageKind.AGENT
    tool_calls: Sequence[str] = ()
    tool_name: str = ""
    sent_at: datetime | None = None  # None: now
    index: int | None = None  # None: the daemon numbers it


@dataclass(frozen=True)
class Sample:
    """A telemetry reading of a component of the spec."""

    component: str
    signal: str
    value: float
    measured_at: datetime | None = None  # None: now


def _request(session_id: str, item: Message | Sample, now: datetime) -> pb.IngestRequest:
    if isinstance(item, Sample):
        return convert.ingest_request(
            TelemetrySample(
                session_id=session_id,
                component=item.component,
                signal=item.signal,
                value=item.value,
                measured_at=item.measured_at or now,
            )
        )
    request = convert.ingest_request(
        AgentMessage(
            session_id=session_id,
            index=item.index or 0,
            kind=item.kind,
            sender=item.sender,
            recipient=item.recipient,
            content=item.content,
            tool_calls=tuple(item.tool_calls),
            tool_name=item.tool_name,
            sent_at=item.sent_at or now,
        )
    )
    request.agent_message.assign_index = item.index is None
    return request


class AsyncClient(PoirotClient):
    """The wire-level client, plus sessions and `record`. `system`: the name of the daemon's
    system spec, which every session is started under."""

    def __init__(self, target: str, *, system: str) -> None:
        super().__init__(target)
        self.system = system

    async def start_session(
        self,
        session_id: str,
        *,
        labels: Mapping[str, str] | None = None,
        started_at: datetime | None = None,
    ) -> None:
        """Starts the session (again: a no-op for one the daemon has)."""
        session = Session(
            session_id=session_id,
            system=self.system,
            started_at=started_at or datetime.now(UTC),
            labels=dict(labels or {}),
        )
        await self.send([convert.ingest_request(session)])

    async def record(self, session_id: str, items: Iterable[Message | Sample]) -> None:
        """Returns once the daemon has the items durably, in their order."""
        now = datetime.now(UTC)
        requests = [_request(session_id, item, now) for item in items]
        if requests:
            await self.send(requests)

    async def end_session(self, session_id: str, *, ended_at: datetime | None = None) -> None:
        end = SessionEnd(session_id=session_id, ended_at=ended_at or datetime.now(UTC))
        await self.send([convert.ingest_request(end)])


class Client:
    """The blocking `AsyncClient`: each call runs the async client's on an event loop of its
    own, in a thread (a grpc.aio channel belongs to one loop). Safe from any thread; called from
    an event loop's thread it blocks that loop while it waits."""

    def __init__(self, target: str, *, system: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="poirotd-client", daemon=True
        )
        self._thread.start()
        self._async = self._run(_connect(target, system))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._async.close())
        self._run(self._loop.shutdown_asyncgens())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def start_session(
        self,
        session_id: str,
        *,
        labels: Mapping[str, str] | None = None,
        started_at: datetime | None = None,
    ) -> None:
        self._run(self._async.start_session(session_id, labels=labels, started_at=started_at))

    def record(self, session_id: str, items: Iterable[Message | Sample]) -> None:
        self._run(self._async.record(session_id, list(items)))

    def end_session(self, session_id: str, *, ended_at: datetime | None = None) -> None:
        self._run(self._async.end_session(session_id, ended_at=ended_at))

    def trigger(self, session_id: str, reason: str, method: str = "") -> pb.Investigation:
        return self._run(self._async.trigger(session_id, reason, method))

    def get(self, investigation_id: str) -> pb.Investigation:
        return self._run(self._async.get(investigation_id))

    def watch(
        self, investigation_id: str = "", after_event_id: int = 0
    ) -> Iterator[pb.InvestigationEvent]:
        events = self._async.watch(investigation_id, after_event_id)
        try:
            while True:
                try:
                    yield self._run(_next(events))
                except StopAsyncIteration:
                    return
        finally:  # a watch left early is closed here, or by `close`
            if not self._loop.is_closed():
                self._run(events.aclose())

    def confirm(
        self, investigation_id: str, region_ids: Iterable[str], note: str = ""
    ) -> pb.ConfirmOutcomeResponse:
        return self._run(self._async.confirm(investigation_id, list(region_ids), note))

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()


async def _connect(target: str, system: str) -> AsyncClient:
    """Made in the client's loop, which its channel then belongs to."""
    return AsyncClient(target, system=system)


async def _next(events: AsyncIterator[T]) -> T:
    return await anext(events)
