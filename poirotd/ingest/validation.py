"""Checks what is ingested against the system spec: the domain rules, the same on every transport.

Stream rules (a seq that increases, an item's size on the wire) belong to the transports that
have streams. A scope is one producer's view (a gRPC stream, a run of the MQTT input): the
sessions it started that may not be committed yet, so a session start and its first messages
can share a batch, and the telemetry streams whose samples already passed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from poirotd.config import SystemSpec
from poirotd.errors import InvalidArgument, NotFound, ResourceExhausted, ServiceError, quote
from poirotd.model import (
    MAX_INTEGER,
    AgentMessage,
    IngestItem,
    MessageKind,
    SampleRow,
    Session,
    TelemetrySample,
)
from poirotd.store import Store

# The most telemetry streams a scope remembers as passed; then it starts over.
_PASSED_STREAMS = 4096
# The times a producer may give. Outside them a time is a fault: year 1 with a +01:00 offset
# cannot even be converted to UTC, and a time far ahead would drag the rules' windows with it.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
MAX_AHEAD = timedelta(days=1)
# The longest session id or signal name. The daemon keeps both in memory for as long as it runs
# (the sessions it knows, the names each component has had), so their length is bounded like
# their number: at the item size limit, 1,024 names of one component would hold a gigabyte.
MAX_NAME_CHARS = 256


class SignalNames:
    """The distinct signal names each component has had, shared by every producer and bounded:
    a topic template maps whatever a publisher writes into a name, and each new name is a
    stream the store and the rules keep (and, through rules, may become a label)."""

    def __init__(self, per_component: int) -> None:
        self.per_component = per_component
        self._names: dict[str, set[str]] = {}

    def admit(self, component: str, signal: str) -> bool:
        names = self._names.setdefault(component, set())
        if signal in names:
            return True
        if len(names) >= self.per_component:
            return False
        names.add(signal)
        return True


class ValueRanges:
    """The range each signal's readings must lie in: the one its component declares (``signals``
    in the spec), else [-default, default]. A reading outside is refused: one reading near the
    float limit is a sensor's fault, not a measurement, and it would only make the rules'
    windows measure nothing while it is in them."""

    def __init__(self, spec: SystemSpec, default: float) -> None:
        self._declared = {
            (c.id, signal): (bounds.min, bounds.max)
            for c in spec.components
            for signal, bounds in c.signals.items()
        }
        self._default = (-default, default)

    def of(self, component: str, signal: str) -> tuple[float, float]:
        return self._declared.get((component, signal), self._default)

    def refusal(self, component: str, signal: str, value: float) -> InvalidArgument:
        low, high = self.of(component, signal)
        origin = (
            "the range its component declares"
            if (component, signal) in self._declared
            else "the default range (POIROTD_TELEMETRY_MAX_ABS_VALUE; declare the signal's "
            "min and max under its component's `signals` in the spec to change it)"
        )
        return InvalidArgument(
            f"telemetry value {value:g} of {quote(component)} signal {quote(signal)} is "
            f"outside [{low:g}, {high:g}], {origin}",
            reason="value_out_of_range",
        )


# What an unchecked stream's range is taken to be: empty, so its first reading gets every check.
_UNCHECKED = (math.inf, -math.inf)


class IngestScope:
    def __init__(
        self, spec: SystemSpec, store: Store, signals: SignalNames, ranges: ValueRanges
    ) -> None:
        self._spec = spec
        self._store = store
        self._signals = signals
        self._ranges = ranges
        self._agents = frozenset(spec.agent_ids)
        self._parties = self._agents | {c.id for c in spec.components}
        self._opened: set[str] = set()
        # (component, signal) streams whose readings passed, with their ranges. Apart from the
        # value, a reading's checks depend only on its stream (a session stays known, the spec
        # is fixed), so a passed stream's later readings are only checked for a value in range.
        self._passed: dict[tuple[str, ...], tuple[float, float]] = {}
        self._latest = datetime.now(UTC) + MAX_AHEAD

    def refresh_clock(self) -> None:
        """Moves the latest time allowed on; called once per batch, not per item."""
        self._latest = datetime.now(UTC) + MAX_AHEAD

    def check(self, item: IngestItem) -> None:
        """Raises a ServiceError saying what is wrong with the item."""
        if not item.session_id:
            raise InvalidArgument("session_id is empty", reason="invalid")
        _check_name("session_id", item.session_id)
        if isinstance(item, Session):
            self._check_session(item)
            return
        self.check_known_session(item.session_id)
        if isinstance(item, AgentMessage):
            self._check_time("sent_at", item.sent_at)
            self._check_message(item)
        elif isinstance(item, TelemetrySample):
            self._check_reading(item.component, item.signal, item.value, item.measured_at)
        else:
            self._check_time("ended_at", item.ended_at)

    def knows(self, session_id: str) -> bool:
        """Started by this producer (perhaps not committed yet) or known to the store's memory."""
        return session_id in self._opened or self._store.has_session(session_id)

    def check_known_session(self, session_id: str) -> None:
        if not self.knows(session_id):
            raise NotFound(
                f"session {quote(session_id)} is not known; send session_start first",
                reason="unknown_session",
            )

    def check_rows(
        self, rows: Sequence[SampleRow]
    ) -> tuple[list[SampleRow], list[tuple[int, ServiceError]]]:
        """A telemetry batch's rows (of a known session): those that pass, and the position and
        refusal of each that does not. The hot path of an MQTT input: a passed stream's reading
        costs a dict lookup and a range test (which NaN and ±inf fail)."""
        passed, earliest, latest = self._passed, EARLIEST, self._latest
        accepted: list[SampleRow] = []
        refused: list[tuple[int, ServiceError]] = []
        for position, row in enumerate(rows):
            stream = row[:2]
            value = row[2]
            at = row[3]
            low, high = passed.get(stream, _UNCHECKED)
            if not (low <= value <= high and earliest <= at <= latest):
                try:
                    self._check_reading(row[0], row[1], value, at)
                except ServiceError as refusal:
                    refused.append((position, refusal))
                    continue
                if len(passed) >= _PASSED_STREAMS:
                    passed.clear()
                passed[stream] = self._ranges.of(row[0], row[1])
            accepted.append(row)
        return accepted, refused

    def _check_session(self, session: Session) -> None:
        self._check_time("started_at", session.started_at)
        if session.ended_at is not None:
            self._check_time("ended_at", session.ended_at)
        if session.system != self._spec.system.name:
            raise InvalidArgument(
                f"session {quote(session.session_id)} is for system {quote(session.system)}, "
                f"this daemon monitors {self._spec.system.name!r}",
                reason="unknown_system",
            )
        self._opened.add(session.session_id)

    def _check_message(self, message: AgentMessage) -> None:
        if message.index > MAX_INTEGER:
            raise InvalidArgument(
                f"message index {message.index} is beyond {MAX_INTEGER}", reason="invalid"
            )
        if message.kind is MessageKind.AGENT and message.sender not in self._agents:
            raise InvalidArgument(
                f"sender {quote(message.sender)} is not an agent of system "
                f"{self._spec.system.name!r} (agents: {', '.join(self._spec.agent_ids)})",
                reason="unknown_agent",
            )
        if message.kind is MessageKind.TOOL:
            if not message.tool_name:
                raise InvalidArgument("a tool message needs tool_name", reason="invalid")
            # Empty recipient: a shared executor's output broadcast to a group chat.
            if message.recipient and message.recipient not in self._agents:
                raise InvalidArgument(
                    f"tool result recipient {quote(message.recipient)} is not an agent "
                    f"(agents: {', '.join(self._spec.agent_ids)})",
                    reason="unknown_agent",
                )
        if message.recipient and message.recipient not in self._parties:
            raise InvalidArgument(
                f"recipient {quote(message.recipient)} is neither an agent nor a component "
                f"of system {self._spec.system.name!r}",
                reason="unknown_agent",
            )

    def _check_time(self, field: str, at: datetime) -> None:
        """Naive times are taken as UTC, as the store takes them."""
        if not EARLIEST <= (at if at.tzinfo else at.replace(tzinfo=UTC)) <= self._latest:
            raise InvalidArgument(
                f"{field} {at.isoformat()} is outside {EARLIEST.date()} .. now + {MAX_AHEAD}",
                reason="time_out_of_range",
            )

    def _check_reading(self, component: str, signal: str, value: float, at: datetime) -> None:
        if component not in self._parties:
            raise InvalidArgument(
                f"telemetry component {quote(component)} is not declared in the spec",
                reason="unknown_component",
            )
        if not signal:
            raise InvalidArgument("telemetry signal is empty", reason="invalid")
        _check_name("telemetry signal", signal)
        if not self._signals.admit(component, signal):
            raise ResourceExhausted(
                f"component {quote(component)} has {self._signals.per_component} signals "
                f"already; a new one, {quote(signal)}, is refused",
                reason="too_many_signals",
            )
        if not math.isfinite(value):
            raise InvalidArgument(
                f"telemetry value {value} is not a finite number", reason="invalid"
            )
        low, high = self._ranges.of(component, signal)
        if not low <= value <= high:
            raise self._ranges.refusal(component, signal, value)
        self._check_time("measured_at", at)


def _check_name(field: str, name: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgument(
            f"{field} is {len(name)} characters, the limit is {MAX_NAME_CHARS}", reason="too_long"
        )
