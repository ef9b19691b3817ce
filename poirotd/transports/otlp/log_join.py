"""Log records joined to their spans across exports. A GenAI log event names its span (trace and
span id) and nothing else: its agent and conversation are the span tree's. Exporters send spans
and logs on their own schedules (the SDK's batch processors: logs every second, spans every
five), and a model call's span, and the agent's span above it, end after its events: so the
events usually come first and wait here for their span, and events exported after their span
find it remembered here.

What is kept, all bounded: the spans of recent trace exports (their place in the tree and what
names agent and conversation, `mapping.remembered`), the events waiting for their span (at most
`max_waiting` records, each at most `wait_seconds`; past it they are placed with what is known,
or rejected), and, per recent session, what was stored (`MappedMessage.said`), so a message a
span and its log records both carry, or two model calls' records repeat, is stored once.
Waiting events are also parked in the store (`log_parking`, by the receiver, with what it
commits): a daemon started again reloads them (`reload`), each waiting what is left of its wait.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from poirotd.transports.otlp.log_parking import WaitingEvent, waiting_events
from poirotd.transports.otlp.log_records import ReadLogs, SpanKey
from poirotd.transports.otlp.mapping import (
    MESSAGE_ORDER,
    MappedExport,
    MappedMessage,
    ReadSpan,
    Rejection,
    SessionBy,
    SpanTree,
    map_logged,
    remembered,
    settled,
)

# Sessions whose stored messages are remembered (the rest are forgotten, oldest first).
_SAID_SESSIONS = 1024


@dataclass
class Waiting:
    """A span's events waiting for it."""

    # When the span's first waiting event arrived (the join's clock).
    since: float
    # By event id: an event resent (an exporter's retry) waits once.
    events: dict[str, WaitingEvent] = field(default_factory=dict)


@dataclass(frozen=True)
class Placed:
    """What the waiting events that could be placed say (each message new to its session),
    what was rejected, and the events taken (placed or rejected: their parked rows are released
    with the commit, or they wait again if it fails). Of a logs export, its events that wait on
    (`waiting`: parked with the commit)."""

    messages: list[MappedMessage]
    rejections: list[Rejection]
    taken: dict[SpanKey, Waiting]
    waiting: dict[SpanKey, list[WaitingEvent]] = field(default_factory=dict)

    def taken_events(self) -> dict[SpanKey, list[WaitingEvent]]:
        return {key: list(w.events.values()) for key, w in self.taken.items()}


@dataclass(frozen=True)
class Joined:
    """A trace export's messages with those of the log events that waited for its spans (in
    session order), its spans' rejections, and what was placed of the waiting events."""

    messages: list[MappedMessage]
    rejections: tuple[Rejection, ...]
    placed: Placed


class LogJoin:
    def __init__(
        self,
        agents: Mapping[str, str],
        session_by: SessionBy,
        *,
        max_spans: int,
        max_waiting: int,
        wait_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._agents = agents
        self._session_by: SessionBy = session_by
        self._max_spans = max_spans
        self.max_waiting = max_waiting
        self._wait_seconds = wait_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._spans: OrderedDict[SpanKey, ReadSpan] = OrderedDict()
        self._by_trace: dict[str, dict[str, ReadSpan]] = {}
        self._waiting: OrderedDict[SpanKey, Waiting] = OrderedDict()
        self._said: OrderedDict[str, set[bytes]] = OrderedDict()
        self.waiting_records = 0

    def spans_in(self, spans: Sequence[ReadSpan], mapped: MappedExport) -> Joined:
        """A trace export came (`mapped` from `spans`): its spans are remembered, its messages
        noted as stored, and the events waiting for its spans placed. A model call without
        content whose log events wait here is not rejected: they speak for it."""
        self.remember(spans)
        self.stored(mapped.messages)
        rejections = tuple(
            r
            for r in mapped.rejections
            if r.reason != "no_content" or (r.trace_id, r.span_id) not in self._waiting
        )
        placed = self.place(self.waiting_in({span.trace_id for span in spans}))
        messages = list(mapped.messages)
        if placed.messages:
            messages = sorted([*messages, *placed.messages], key=MESSAGE_ORDER)
        return Joined(messages, rejections, placed)

    def logs_in(self, read: ReadLogs) -> Placed:
        """A logs export came: its events wait, and those whose span is known are placed; the
        others wait on (`Placed.waiting`)."""
        arrived = self._wall_clock()
        events = {key: waiting_events(key, more, arrived) for key, more in read.events.items()}
        self.wait(events)
        placed = self.place(events)
        waiting = {key: more for key, more in events.items() if key in self._waiting}
        return Placed(placed.messages, placed.rejections, placed.taken, waiting)

    def reload(self, events: Mapping[SpanKey, list[WaitingEvent]]) -> None:
        """Events parked before this daemon started wait again, each span's for what is left
        of its wait since its first event arrived (wall clock: the monotonic clock restarts)."""
        now, wall_now = self._clock(), self._wall_clock()
        for key, more in events.items():
            waited = max(0.0, wall_now - min(w.arrived for w in more))
            self._add(key, Waiting(now - waited, {w.event_id: w for w in more}))

    def would_wait(self, read: ReadLogs) -> int:
        """How many of the export's events would wait: those whose span is not known yet."""
        return sum(len(events) for key, events in read.events.items() if key not in self._spans)

    def remember(self, spans: Sequence[ReadSpan]) -> None:
        for span in spans:
            key = (span.trace_id, span.span_id)
            kept = remembered(span)
            self._spans[key] = kept
            self._spans.move_to_end(key)
            self._by_trace.setdefault(span.trace_id, {})[span.span_id] = kept
        while len(self._spans) > self._max_spans:
            (trace_id, span_id), _ = self._spans.popitem(last=False)
            trace = self._by_trace[trace_id]
            del trace[span_id]
            if not trace:
                del self._by_trace[trace_id]

    def wait(self, events: Mapping[SpanKey, list[WaitingEvent]]) -> None:
        """The events wait for their span (and the tree above it); `place` takes them."""
        now = self._clock()
        for key, more in events.items():
            self._add(key, Waiting(now, {w.event_id: w for w in more}))

    def _add(self, key: SpanKey, more: Waiting) -> None:
        """Events join their span's waiting ones (which waited since the earlier of both)."""
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = Waiting(more.since)
        waiting.since = min(waiting.since, more.since)
        before = len(waiting.events)
        waiting.events.update(more.events)
        self.waiting_records += len(waiting.events) - before

    def waiting_in(self, trace_ids: Iterable[str]) -> list[SpanKey]:
        traces = set(trace_ids)
        return [key for key in self._waiting if key[0] in traces]

    def place(self, keys: Iterable[SpanKey]) -> Placed:
        """Places the waiting events of `keys` whose span tree is settled, and every event that
        waited its time; the others wait on."""
        now = self._clock()
        due = [key for key, w in self._waiting.items() if now - w.since >= self._wait_seconds]
        messages: list[MappedMessage] = []
        rejections: list[Rejection] = []
        taken: dict[SpanKey, Waiting] = {}
        for key in dict.fromkeys([*keys, *due]):
            waiting = self._waiting.get(key)
            if waiting is None:
                continue
            expired = now - waiting.since >= self._wait_seconds
            span = self._spans.get(key)
            if span is None:
                if expired:
                    detail = f"its span did not come within {self._wait_seconds:g} s"
                    taken[key] = self._take(key)
                    rejections += [Rejection(*key, "no_span", detail)] * len(waiting.events)
                continue
            tree = SpanTree(list(self._by_trace[span.trace_id].values()), self._session_by)
            if not expired and not settled(span, tree, self._agents):
                continue
            taken[key] = self._take(key)
            events = [w.event for w in waiting.events.values()]
            said, rejection = map_logged(span, events, tree, self._agents)
            if rejection is not None:
                rejections += [rejection] * len(events)
            messages += said
        messages.sort(key=MESSAGE_ORDER)  # the earliest of a message said twice is kept
        return Placed(self.new(messages), rejections, taken)

    def wait_again(self, taken: Mapping[SpanKey, Waiting]) -> None:
        """Events taken for a commit that failed: they wait as if never taken (since they
        first did; a rejection is made again, and counted, with a commit that succeeds)."""
        for key, waiting in taken.items():
            self._add(key, waiting)

    def new(self, messages: Sequence[MappedMessage]) -> list[MappedMessage]:
        """The messages their session has not stored yet (each noted as stored now)."""
        fresh = []
        for m in messages:
            said = self._session(m.session_id)
            digest = m.said()
            if digest not in said:
                said.add(digest)
                fresh.append(m)
        return fresh

    def stored(self, messages: Sequence[MappedMessage]) -> None:
        """Notes messages stored from spans (a log record saying one of them again is not)."""
        for m in messages:
            self._session(m.session_id).add(m.said())

    def unstored(self, messages: Sequence[MappedMessage]) -> None:
        """Messages noted as stored whose commit failed: their resend is new again."""
        for m in messages:
            said = self._said.get(m.session_id)
            if said is not None:
                said.discard(m.said())

    def _take(self, key: SpanKey) -> Waiting:
        waiting = self._waiting.pop(key)
        self.waiting_records -= len(waiting.events)
        return waiting

    def _session(self, session_id: str) -> set[bytes]:
        said = self._said.get(session_id)
        if said is None:
            said = self._said[session_id] = set()
            if len(self._said) > _SAID_SESSIONS:
                self._said.popitem(last=False)
        else:
            self._said.move_to_end(session_id)
        return said
