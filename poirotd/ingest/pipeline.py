"""The one ingest pipeline: every transport hands what it received to `accept` (or `consume`).

validate (domain rules, per producer scope) -> hazard rules on arrival -> group commit -> open the
investigations the rules call for -> count. `accept` does the first two at once, on the event
loop, so a hazard event's latency is decoding and rule evaluation, not an fsync; it returns a
future that resolves once the items are durable, the point where a transport acknowledges them
(a gRPC ack, an MQTT PUBACK).

Group commit: what every producer admits while a transaction is in flight is committed together
in the next one, in admission order (hence each producer's items in its own order). A round
closes once it holds `batch_max` items (an admission is never split), so a transaction is
bounded; every commit is an fsync, and the rule engine's cost is mostly per batch, so at a few
thousand items a second one transaction per producer call would cost more than the data.
If a commit fails, its round's futures raise and its events are dropped: the producers still hold
those items, unacknowledged. What a commit leaves out is counted: copies of stored items
(poirot_ingest_duplicates_total, at INFO), and conflicts, items whose key or index other content
held, which the store keeps for an operator (poirot_ingest_conflicts_total, a WARNING).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import ServiceError
from poirotd.hazards import RuleEngine
from poirotd.ingest.numbering import SessionIndexes
from poirotd.ingest.sessions import ImplicitSessions
from poirotd.ingest.validation import IngestScope, SignalNames, ValueRanges
from poirotd.model import (
    CONFLICT_REASONS,
    AgentMessage,
    CommitItem,
    HazardEvent,
    ItemKey,
    Session,
    SessionEnd,
    TelemetryBatch,
    TelemetrySample,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import Store
from poirotd.store.common import unknown_sessions
from poirotd.store.faults import StoreUnreachable
from poirotd.store.idempotency import LeftOut
from poirotd.store.parked_logs import NO_PARKING, Parking

log = structlog.get_logger(__name__)

_KIND_LABELS: dict[type, str] = {
    Session: "session_start",
    SessionEnd: "session_end",
    AgentMessage: "agent_message",
    TelemetrySample: "telemetry",
    TelemetryBatch: "telemetry",
}
# A conflict's kind label, by whether it holds a message (else a sample).
_CONFLICT_KINDS = {True: "agent_message", False: "telemetry"}


class InvestigationOpener(Protocol):
    """Opens what hazard events call for, once their evidence is committed (investigations)."""

    async def open(self, events: Sequence[HazardEvent]) -> None: ...


@dataclass(frozen=True)
class Refusal:
    """An item (or a row of a telemetry batch) the pipeline refused, by its position."""

    index: int
    error: ServiceError
    row: int | None = None


@dataclass(frozen=True)
class Admission:
    """What `accept` took: `accepted` items from the start of the batch (all of them, but for
    items after a refusal when invalid items stop the batch), durable once `durable` resolves
    (with what the round's commit left out: this admission's are its items at positions `span`
    of the round)."""

    accepted: int
    refused: tuple[Refusal, ...]
    durable: asyncio.Future[LeftOut]
    span: range = range(0)

    async def wait(self) -> int:
        """Until durable; returns how many of its items (telemetry: samples) were dropped as
        copies of items already stored. Raises what the commit raised. A producer cancelled
        while it waits leaves the future alone: its round, other producers' items included,
        goes on."""
        await asyncio.shield(self.durable)
        return self.duplicates()

    def duplicates(self) -> int:
        """Once durable: how many of its items (telemetry: samples) were copies."""
        dropped = self.durable.result().duplicates
        return sum(count for position, count in dropped.items() if position in self.span)

    def conflicts(self) -> int:
        """Once durable: how many of its items (telemetry: samples) were set aside as
        conflicts."""
        return sum(1 for c in self.durable.result().conflicts if c.position in self.span)


@dataclass
class _Round:
    items: list[CommitItem] = field(default_factory=list)
    # Each item's idempotency key (a telemetry batch's rows carry their own).
    keys: list[ItemKey | None] = field(default_factory=list)
    events: list[HazardEvent] = field(default_factory=list)
    # The parked log events the round's commit parks and releases (the OTLP log join's).
    parking: Parking = NO_PARKING
    size: int = 0
    done: asyncio.Future[LeftOut] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class IngestPipeline:
    def __init__(
        self,
        spec: SystemSpec,
        store: Store,
        opener: InvestigationOpener,
        metrics: Metrics,
        *,
        batch_max: int,
        signals_per_component: int,
        max_abs_value: float,
    ) -> None:
        self._spec = spec
        self._store = store
        self._opener = opener
        self._metrics = metrics
        self._batch_max = batch_max
        self._rules = RuleEngine(spec.rules)
        self._signals = SignalNames(signals_per_component)
        self._ranges = ValueRanges(spec, max_abs_value)
        # For the transports whose producers leave numbering to the daemon: one count for them all.
        self.indexes = SessionIndexes(store)
        self._rounds: deque[_Round] = deque()
        self._committer: asyncio.Task[None] | None = None
        # Hazard events of rounds the store failed: their rules' cooldowns keep them from firing
        # again on the data resent, so they are opened with the next round committed.
        self._carried: list[HazardEvent] = []
        for kind in sorted(set(_KIND_LABELS.values())):
            # Served at 0 from the start: an alert on copies needs the series before the first.
            metrics.duplicates.labels(kind)
        for kind in _CONFLICT_KINDS.values():
            for reason in CONFLICT_REASONS:
                metrics.conflicts.labels(kind, reason)

    def implicit_sessions(self, input_name: str) -> ImplicitSessions:
        """For a transport whose producers do not start their sessions (OTLP, MQTT agent
        messages)."""
        return ImplicitSessions(self._store, self._spec.system.name, input_name)

    def scope(self) -> IngestScope:
        """A producer's scope: one per gRPC stream, per MQTT input run, per replay."""
        return IngestScope(self._spec, self._store, self._signals, self._ranges)

    async def find_sessions(self, items: Sequence[CommitItem], scope: IngestScope) -> None:
        """Asks the store for the sessions of `items` that neither the scope nor the store's
        memory knows, before `accept` checks them: over a database several daemons share, a
        session may have been started through another one (`Store.find_session`). Nothing to
        ask on the usual path; a session the store does not have is then refused by `accept`."""
        for session_id in unknown_sessions(items, scope.knows):
            await self._store.find_session(session_id)

    def accept(
        self,
        items: Sequence[CommitItem],
        scope: IngestScope,
        *,
        skip_invalid: bool = False,
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> Admission:
        """Validates the items in order and runs the hazard rules over those admitted. An
        invalid item stops the batch there (the items before it are admitted), or with
        `skip_invalid` is left out; a telemetry batch's invalid rows are always left out.
        `keys[i]`: item i's idempotency key, if it has one (see `poirotd.store.idempotency`).
        `parking`: changes to the parked log events, committed in the items' transaction (a
        round is committed for them even when no item is admitted)."""
        admitted: list[CommitItem] = []
        admitted_keys: list[ItemKey | None] = []
        refused: list[Refusal] = []
        accepted = len(items)
        scope.refresh_clock()
        for index, item in enumerate(items):
            try:
                if isinstance(item, TelemetryBatch):
                    scope.check_known_session(item.session_id)
                    rows, bad_rows = scope.check_rows(item.rows)
                    refused += [Refusal(index, error, row) for row, error in bad_rows]
                    if bad_rows:
                        item = _without_rows(item, {row for row, _ in bad_rows})
                    if not rows:
                        continue
                else:
                    scope.check(item)
                    if isinstance(item, AgentMessage):
                        self.indexes.observe(item.session_id, item.index)
            except ServiceError as error:
                refused.append(Refusal(index, error))
                if skip_invalid:
                    continue
                accepted = index
                break
            admitted.append(item)
            admitted_keys.append(keys[index] if index < len(keys) else None)
        for refusal in refused:
            kind = _KIND_LABELS[type(items[refusal.index])]
            self._metrics.ingest_refused.labels(kind, refusal.error.reason).inc()
        durable, span = self._admit(admitted, admitted_keys, parking)
        return Admission(accepted, tuple(refused), durable, span)

    async def consume(
        self,
        items: Sequence[CommitItem],
        scope: IngestScope,
        *,
        skip_invalid: bool = False,
        keys: Sequence[ItemKey | None] = (),
    ) -> Admission:
        """`find_sessions` and `accept`, then waits until the admitted items are durable."""
        await self.find_sessions(items, scope)
        admission = self.accept(items, scope, skip_invalid=skip_invalid, keys=keys)
        await admission.wait()
        return admission

    async def tick_forever(self, interval: float = 1.0) -> None:
        """Evaluates time-based rules (no data within a timeout) once per interval."""
        while True:
            await asyncio.sleep(interval)
            await self._opener.open(self._rules.tick(datetime.now(UTC)))

    async def drain(self) -> None:
        """Returns once everything admitted so far is committed (or its commit failed)."""
        while self._committer is not None:
            await asyncio.wait([self._committer])

    def _admit(
        self, items: list[CommitItem], keys: list[ItemKey | None], parking: Parking
    ) -> tuple[asyncio.Future[LeftOut], range]:
        if not items and not parking:
            done: asyncio.Future[LeftOut] = asyncio.get_running_loop().create_future()
            done.set_result(LeftOut())
            return done, range(0)
        if not self._rounds or self._rounds[-1].size >= self._batch_max:
            self._rounds.append(_Round())
        current = self._rounds[-1]
        current.events += self._rules.observe(items)
        span = range(len(current.items), len(current.items) + len(items))
        current.items += items
        current.keys += keys
        current.parking += parking
        current.size += sum(len(i.rows) if isinstance(i, TelemetryBatch) else 1 for i in items)
        if self._committer is None:
            self._committer = asyncio.create_task(self._commit_rounds(), name="ingest-commit")
        return current.done, span

    async def _commit_rounds(self) -> None:
        try:
            while self._rounds:
                await self._commit(self._rounds.popleft())
        finally:
            self._committer = None

    async def _commit(self, current: _Round) -> None:
        done = current.done
        # A producer that went away never reads its round's outcome.
        done.add_done_callback(_retrieve)
        try:
            keys = current.keys if any(current.keys) else ()
            left_out = await self._store.commit_ingest(current.items, keys, current.parking)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception as exc:
            if not isinstance(exc, StoreUnreachable):  # whose outage the store logs once
                log.exception("ingest commit failed", items=len(current.items))
            self._carried += current.events
            done.set_exception(exc)
            return
        events, self._carried = [*self._carried, *current.events], []
        try:
            # Before the acks: a producer that sees its ack finds the investigations opened.
            await self._opener.open(sorted(events, key=_event_time))
        except Exception:
            log.exception("opening investigations for committed items failed")
        self._count(current.items, left_out)
        done.set_result(left_out)

    def _count(self, items: Sequence[CommitItem], left_out: LeftOut) -> None:
        counts: Counter[str] = Counter()
        dropped: Counter[str] = Counter()
        duplicates, conflicted = left_out.duplicates, left_out.conflicted()
        for position, item in enumerate(items):
            kind = _KIND_LABELS[type(item)]
            size = len(item.rows) if isinstance(item, TelemetryBatch) else 1
            copies = duplicates.get(position, 0)
            counts[kind] += size - copies - conflicted.get(position, 0)
            dropped[kind] += copies
        for kind, count in counts.items():
            if count:
                self._metrics.ingested.labels(kind).inc(count)
                self._metrics.last_ingest.labels(kind).set_to_current_time()
        for kind, count in dropped.items():
            if count:
                self._metrics.duplicates.labels(kind).inc(count)
                log.info("ingest duplicates dropped", kind=kind, count=count)
        if left_out.conflicts:
            self._count_conflicts(left_out)

    def _count_conflicts(self, left_out: LeftOut) -> None:
        """Counted by kind and reason; one WARNING a commit, naming the first."""
        for _, _, record in left_out.conflicts:
            kind = _CONFLICT_KINDS[record.message is not None]
            self._metrics.conflicts.labels(kind, record.reason).inc()
        _, conflict_id, first = left_out.conflicts[0]
        log.warning(
            "ingest conflicts set aside",
            count=len(left_out.conflicts),
            first_id=conflict_id,
            first_reason=first.reason,
            session_id=first.session_id,
            producer=first.producer,
            seq=first.seq,
            index=None if first.message is None else first.message.index,
            see="poirotd audit conflicts",
        )


def _without_rows(batch: TelemetryBatch, bad: set[int]) -> TelemetryBatch:
    """The batch without the rows at positions `bad` (and their keys)."""
    rows = [row for i, row in enumerate(batch.rows) if i not in bad]
    keys = None if batch.keys is None else [k for i, k in enumerate(batch.keys) if i not in bad]
    return TelemetryBatch(batch.session_id, rows, keys)


def _event_time(event: HazardEvent) -> datetime:
    return event.at


def _retrieve(done: asyncio.Future[LeftOut]) -> None:
    if not done.cancelled():
        done.exception()
