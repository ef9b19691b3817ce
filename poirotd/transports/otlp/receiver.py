"""What both OTLP transports (gRPC TraceService and LogsService, HTTP /v1/traces and /v1/logs) do
with an export: map its spans, or its GenAI log events joined to their spans (log_join), to
agent messages, number them in their sessions, start the sessions that are new, hand them to the
ingest pipeline and answer once they are durable, with the spans or log records that could not
be placed in OTLP's partial_success (a log record that waits for its span is answered as
accepted once it is parked in the store, in the commit of what the export placed; if it is
rejected later, only the metrics tell).

Sessions: a session the store does not have is started (system, the time of its first message,
labels input=otlp and the trace id) in the same batch as its first messages. Numbering: the
daemon's (ingest.numbering), in the order the mapping gives; a span exported after later spans
of its session were stored is numbered after them.
Exactly once: every message carries its span's key (`MappedMessage.key`; with authentication on,
scoped by who the exporter authenticated as), so an exporter's retry
of an export that was stored (its answer lost, a timeout) is dropped by the store's commit,
counted in poirot_ingest_duplicates_total and answered as success. A dropped copy was numbered
before the store knew it for one: its index stays unused (indexes need not be contiguous).
Back-pressure: at most `max_pending` messages of all exports wait for their commit; an export
beyond that is refused as throttled (RESOURCE_EXHAUSTED / 429 with a retry delay) before
anything of it is admitted, so the exporter resends all of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from poirotd.config import SystemSpec
from poirotd.errors import ResourceExhausted, Unavailable
from poirotd.ingest.pipeline import IngestPipeline, Refusal
from poirotd.model import CommitItem, validate_agent_message
from poirotd.observability.metrics import Metrics
from poirotd.store import Store
from poirotd.store.parked_logs import Parking
from poirotd.transports.otlp.log_join import LogJoin, Placed
from poirotd.transports.otlp.log_parking import LogParking
from poirotd.transports.otlp.log_records import LOG_REJECT_REASONS, read_logs
from poirotd.transports.otlp.mapping import (
    REJECT_REASONS,
    MappedMessage,
    Rejection,
    SessionBy,
    map_spans,
    read_spans,
)

log = structlog.get_logger(__name__)

TRANSPORTS = ("grpc", "http")
# What a throttled exporter is told to wait before it resends.
RETRY_AFTER_SECONDS = 1
# How often at most log events that waited their time are placed or rejected without an export.
SWEEP_SECONDS = 5.0


class Throttled(ResourceExhausted):
    """Too many messages wait for their commit; the export may be sent again later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="throttled")
        self.retry_after = RETRY_AFTER_SECONDS


@dataclass(frozen=True)
class _Refusals:
    """What one export held (spans or log records) and which of them were refused."""

    items: int
    rejected: tuple[Rejection, ...]

    def message(self, noun: str, first_is: str) -> str:
        """The partial-success message: how many were refused, and the first one's why."""
        first = self.rejected[0]
        return (
            f"{len(self.rejected)} of {self.items} {noun} rejected; first: {first_is} "
            f"{first.span_id} of trace {first.trace_id}: {first.reason}: {first.detail}"
        )


class ExportResult(_Refusals):
    def response(self) -> ExportTraceServiceResponse:
        if not self.rejected:
            return ExportTraceServiceResponse()
        partial = ExportTracePartialSuccess(
            rejected_spans=len(self.rejected), error_message=self.message("spans", "span")
        )
        return ExportTraceServiceResponse(partial_success=partial)


class LogsExportResult(_Refusals):
    def response(self) -> ExportLogsServiceResponse:
        if not self.rejected:
            return ExportLogsServiceResponse()
        partial = ExportLogsPartialSuccess(
            rejected_log_records=len(self.rejected),
            error_message=self.message("log records", "of span"),
        )
        return ExportLogsServiceResponse(partial_success=partial)


@dataclass(frozen=True)
class _Committed:
    """The messages the pipeline refused, by the span (or log record) they came from."""

    refused_spans: list[Rejection]
    refused_logged: list[Rejection]


class OtlpReceiver:
    def __init__(
        self,
        spec: SystemSpec,
        pipeline: IngestPipeline,
        metrics: Metrics,
        *,
        session_by: SessionBy,
        max_pending: int,
        join: LogJoin,
        parking: LogParking,
    ) -> None:
        self._agents = spec.agents_by_alias()
        self._pipeline = pipeline
        self._metrics = metrics
        self._session_by: SessionBy = session_by
        self._max_pending = max_pending
        self._scope = pipeline.scope()
        self._indexes = pipeline.indexes
        self._sessions = pipeline.implicit_sessions("otlp")
        self._join = join
        self._parking = parking
        self._pending = 0
        self._draining = False
        for transport in TRANSPORTS:
            metrics.otlp_spans.labels(transport)
            metrics.otlp_log_records.labels(transport)
        for reason in REJECT_REASONS:
            metrics.otlp_rejected_spans.labels(reason)
        for reason in LOG_REJECT_REASONS:
            metrics.otlp_rejected_log_records.labels(reason)

    async def reload(self, store: Store) -> None:
        """The log events this daemon parked and had not placed when it stopped wait again."""
        events = self._parking.reloaded(await store.parked_log_events(self._parking.owner))
        self._join.reload(events)
        self._metrics.otlp_waiting_log_records.set(self._join.waiting_records)
        if events:
            records = sum(map(len, events.values()))
            log.info("otlp log records reloaded", records=records, spans=len(events))

    async def sweep_forever(self, store: Store, interval: float) -> None:
        """`sweep` every `interval`; cancelled, it lets a sweep under way finish (a store
        transaction cut halfway costs its connection)."""
        while True:
            await asyncio.sleep(interval)
            sweeping = asyncio.ensure_future(self.sweep(store))
            try:
                await asyncio.shield(sweeping)
            except asyncio.CancelledError:
                await asyncio.wait([sweeping])
                if not sweeping.cancelled():
                    sweeping.exception()  # a failed sweep leaves the rows for the next start
                raise
            except Unavailable:
                pass  # the store's outage is logged once by the store; the next sweep retries
            except Exception:
                log.exception("otlp log records sweep failed")

    async def sweep(self, store: Store) -> None:
        """Places or rejects the log events that waited their time, without waiting for an
        export to bring their turn; first, over a shared store, takes over the parked events of
        replicas gone (`log_parking`), which have waited their time too."""
        after = self._parking.take_over_after
        if after is not None:
            now = time.time()
            found = await store.take_over_parked_log_events(
                self._parking.owner, round((now - after) * 1e6), round(now * 1e6)
            )
            if found:
                self._join.reload(self._parking.reloaded(found))
                self._metrics.otlp_taken_over_log_records.inc(len(found))
                replicas = sorted({p.owner for p in found})
                log.warning("otlp log records taken over", records=len(found), replicas=replicas)
        placed = self._join.place([])
        if not placed.taken:
            self._metrics.otlp_waiting_log_records.set(self._join.waiting_records)
            return
        parking = self._parking.release(placed.taken_events())
        committed = await self._commit_joined(placed.messages, placed, "", parking)
        self._rejected_logged([*placed.rejections, *committed.refused_logged], "sweep")

    def drain(self) -> None:
        """From now on exports are refused as UNAVAILABLE (an exporter retries elsewhere)."""
        self._draining = True

    async def export(
        self, request: ExportTraceServiceRequest, transport: str, caller: str = ""
    ) -> ExportResult:
        """Returns once the export's messages are durable; raises a ServiceError when nothing
        of it was stored (draining, throttled, the store failed). `caller`: who the exporter
        authenticated as ("via:name"; "" when authentication is off). Log events that waited
        for these spans are stored with them."""
        if self._draining:
            raise Unavailable("the daemon is draining", reason="draining")
        spans = read_spans(request)
        mapped = map_spans(spans, self._agents, session_by=self._session_by)
        self._metrics.otlp_spans.labels(transport).inc(mapped.spans)
        self._throttle(len(mapped.messages))
        joined = self._join.spans_in(spans, mapped)
        placed = joined.placed
        parking = self._parking.release(placed.taken_events())
        committed = await self._commit_joined(joined.messages, placed, caller, parking)
        self._rejected_logged([*placed.rejections, *committed.refused_logged], transport)
        rejected = (*joined.rejections, *committed.refused_spans)
        for rejection in rejected:
            self._metrics.otlp_rejected_spans.labels(rejection.reason).inc()
        if rejected:
            _warn("otlp spans rejected", transport, rejected, mapped.spans)
        return ExportResult(mapped.spans, rejected)

    async def export_logs(
        self, request: ExportLogsServiceRequest, transport: str, caller: str = ""
    ) -> LogsExportResult:
        """As `export`, for a logs export: its GenAI events whose span is known are stored
        before the answer; the others wait for their span (log_join), parked in the store in
        the same commit, and are answered as accepted."""
        if self._draining:
            raise Unavailable("the daemon is draining", reason="draining")
        read = read_logs(request)
        self._metrics.otlp_log_records.labels(transport).inc(read.records)
        waiting = self._join.waiting_records
        if waiting + self._join.would_wait(read) > self._join.max_waiting:
            raise Throttled(
                f"{waiting} log records wait for their spans, this export would add more than "
                f"the limit of {self._join.max_waiting}; retry in {RETRY_AFTER_SECONDS} s"
            )
        self._throttle(sum(map(len, read.events.values())))
        placed = self._join.logs_in(read)
        parking = self._parking.park(placed.waiting) + self._parking.release(placed.taken_events())
        committed = await self._commit_joined(placed.messages, placed, caller, parking)
        placed_rejected = [*placed.rejections, *committed.refused_logged]
        self._rejected_logged([*read.rejections, *placed_rejected], transport)
        # Records of earlier exports that waited their time were answered already.
        here = (r for r in placed_rejected if (r.trace_id, r.span_id) in read.events)
        return LogsExportResult(read.records, (*read.rejections, *here))

    def _throttle(self, arriving: int) -> None:
        if self._pending and self._pending + arriving > self._max_pending:
            raise Throttled(
                f"{self._pending} messages wait for their commit (the limit is "
                f"{self._max_pending}); retry in {RETRY_AFTER_SECONDS} s"
            )

    async def _commit_joined(
        self, messages: Sequence[MappedMessage], placed: Placed, caller: str, parking: Parking
    ) -> _Committed:
        """`_commit`, the waiting events `placed` took put back to wait again (their messages
        unstored) when the store fails; the waiting gauge set after, whatever came of it."""
        try:
            return await self._commit(messages, caller, parking)
        except Unavailable:
            self._join.unstored(messages)
            self._join.wait_again(placed.taken)
            raise
        finally:
            self._metrics.otlp_waiting_log_records.set(self._join.waiting_records)

    async def _commit(
        self, messages: Sequence[MappedMessage], caller: str, parking: Parking
    ) -> _Committed:
        await self._indexes.learn(m.session_id for m in messages)
        items, sources = self._numbered(messages)
        keys = [None if source is None else source.key(caller) for source in sources]
        admission = self._pipeline.accept(
            items, self._scope, skip_invalid=True, keys=keys, parking=parking
        )
        self._pending += len(items)
        try:
            await admission.wait()
        except Exception as exc:
            # The sessions this scope started may not be stored: ask the store again next time.
            self._scope = self._pipeline.scope()
            raise Unavailable(f"store write failed: {exc}", reason="store_error") from exc
        finally:
            self._pending -= len(items)
        logged: list[Rejection] = []
        from_spans: list[Refusal] = []
        for refusal in admission.refused:
            source = sources[refusal.index]
            if source is not None and source.logged_seq is not None:
                key = (source.trace_id, source.span_id)
                logged.append(Rejection(*key, refusal.error.reason, str(refusal.error)))
            else:
                from_spans.append(refusal)
        return _Committed(_refused_spans(from_spans, sources), logged)

    def _rejected_logged(self, rejected: Sequence[Rejection], transport: str) -> None:
        """Counts and tells log records rejected once placed (of this export or earlier ones)."""
        for rejection in rejected:
            self._metrics.otlp_rejected_log_records.labels(rejection.reason).inc()
        if rejected:
            _warn("otlp log records rejected", transport, rejected, len(rejected))

    def _numbered(
        self, messages: Sequence[MappedMessage]
    ) -> tuple[list[CommitItem], list[MappedMessage | None]]:
        """The items to ingest (a session start before a new session's first message) and, by
        position, the mapped message each came from (None for a session start)."""
        items: list[CommitItem] = []
        sources: list[MappedMessage | None] = []
        handled: set[str] = set()  # the sessions met in this export
        for m in messages:
            sent_at = datetime.fromtimestamp(m.at_ns / 1e9, UTC)
            if start := self._sessions.start(handled, m.session_id, sent_at, m.trace_id):
                items.append(start)
                sources.append(None)
            items.append(
                validate_agent_message(
                    {
                        "session_id": m.session_id,
                        "index": self._indexes.take(m.session_id),
                        "kind": m.kind,
                        "sender": m.sender,
                        "recipient": m.recipient,
                        "content": m.content,
                        "tool_calls": m.tool_calls,
                        "tool_name": m.tool_name,
                        "sent_at": sent_at,
                        "trace_id": m.trace_id,
                        "span_id": m.span_id,
                    }
                )
            )
            sources.append(m)
        return items, sources


def _warn(event: str, transport: str, rejected: Sequence[Rejection], of: int) -> None:
    first = rejected[0]
    log.warning(
        event,
        transport=transport,
        rejected=len(rejected),
        of=of,
        first_reason=first.reason,
        first_detail=first.detail,
        trace_id=first.trace_id,
        span_id=first.span_id,
    )


def _refused_spans(
    refused: Sequence[Refusal], sources: Sequence[MappedMessage | None]
) -> list[Rejection]:
    """The spans whose messages the pipeline refused (a time out of range, say), once each."""
    spans: dict[tuple[str, str], Rejection] = {}
    for refusal in refused:
        source = sources[refusal.index]
        if source is None:  # a session start refused: its messages are refused with it
            continue
        key = (source.trace_id, source.span_id)
        spans.setdefault(key, Rejection(*key, refusal.error.reason, str(refusal.error)))
    return list(spans.values())
