"""The rule engine: sends samples and messages to the rules that watch them, keeps per-session
state, and turns the hits that pass a rule's gate into HazardEvents.

It is pure and synchronous: no I/O, no wall clock, no locks. Time is the data's own time
(``measured_at``, ``sent_at``, the ``now`` passed to ``tick``), so a replayed session fires
exactly as the live one did. The caller owns concurrency and calls from one task.

Each (session, component, signal) stream that some rule watches gets a window. A batch is
split per stream, and each rule evaluates a stream's new samples (in chunks of at most
``CHUNK``) as whole arrays. A stream watched only by value rules (threshold, range) first checks
the chunk on plain floats: when no value hits and no rule waits for a clear, nothing can happen,
and the arrays (whose per-call cost dominates the one-sample chunks of a sensor frame) are
skipped. A late sample (older than its stream's newest) is evaluated as if it arrived at the
stream's newest time, so that windows and cooldowns never run backwards. It is not dropped.

State is kept per session until ``end_session`` is called.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter, itemgetter

import numpy as np

from poirotd.hazards.composite import Combination, Hits
from poirotd.hazards.gate import Gate
from poirotd.hazards.messages import Matcher, RepeatMatcher, ReplyWatch, matcher_for
from poirotd.hazards.signals import (
    Condition,
    Reading,
    ValueCondition,
    condition_for,
    consecutive,
)
from poirotd.hazards.spec import (
    AllRule,
    AnyRule,
    CompositeRuleSpec,
    MessageRuleSpec,
    RuleSpec,
    SignalRuleSpec,
    StaleRule,
    parse_rules,
)
from poirotd.hazards.window import CHUNK, SignalWindow
from poirotd.model import (
    AgentMessage,
    CommitItem,
    HazardEvent,
    SampleRow,
    SessionEnd,
    TelemetryBatch,
    TelemetrySample,
    row_of,
)

Signal = tuple[str, str]
_NO_INDICES = np.empty(0, dtype=np.intp)
# _grouped's marker for a stream not met yet in a batch (None marks one no rule watches).
_NOT_MET: list[SampleRow] = []
# A stream's key: (session, component, signal), or (component, signal) within one session.
_Key = tuple[str, ...]
_STREAM_OF = attrgetter("session_id", "component", "signal")
_SIGNAL_OF = itemgetter(0, 1)
_EVENT_TIME = attrgetter("at")


@dataclass(slots=True)
class _RuleState:
    """One per-signal rule in one stream, that is in one session."""

    rule: SignalRuleSpec
    condition: Condition
    gate: Gate
    run: int = 0


class _Stream:
    """One (session, component, signal): its window and the rules that watch it."""

    def __init__(
        self,
        session_id: str,
        rules: Sequence[tuple[SignalRuleSpec, Condition]],
        evidence_limit: int,
    ) -> None:
        lookback = max((c.lookback for _, c in rules), default=0)
        self.window = SignalWindow(session_id, lookback, evidence_limit)
        self.states = [
            _RuleState(rule, condition, Gate(rule.cooldown_seconds, latching=True))
            for rule, condition in rules
        ]
        # Only rules on the value itself (threshold, range): a chunk that none of them hits
        # while none is latched needs no arrays at all (see _quiet).
        self.values_only = all(isinstance(c, ValueCondition) for _, c in rules)


@dataclass
class _Round:
    """What one observe/tick call produced: events, and hits of rules that composites use."""

    events: list[tuple[float, HazardEvent]] = field(default_factory=list)
    hits: dict[str, dict[str, list[Hits]]] = field(default_factory=dict)

    def add_hits(self, rule: str, session: str, hits: Hits) -> None:
        self.hits.setdefault(rule, {}).setdefault(session, []).append(hits)

    def sorted_events(self) -> list[HazardEvent]:
        return [e for _, e in sorted(self.events, key=lambda pair: pair[0])]


class RuleEngine:
    def __init__(self, rules: Sequence[RuleSpec], *, evidence_limit: int = 32) -> None:
        """Raises pydantic.ValidationError if the rules are not a valid set."""
        if evidence_limit < 0:
            raise ValueError(f"evidence_limit must be >= 0, got {evidence_limit}")
        self.rules = parse_rules(rules)
        self._evidence_limit = evidence_limit
        self._on_signal: dict[Signal, list[tuple[SignalRuleSpec, Condition]]] = {}
        self._stale_on_signal: dict[Signal, list[StaleRule]] = {}
        self._matchers: list[tuple[RuleSpec, Matcher]] = []
        by_name = {rule.name: rule for rule in self.rules}
        for rule in self.rules:
            if isinstance(rule, StaleRule):
                self._stale_on_signal.setdefault((rule.component, rule.signal), []).append(rule)
            elif isinstance(rule, MessageRuleSpec):
                self._matchers.append((rule, matcher_for(rule)))
            elif not isinstance(rule, AllRule | AnyRule):
                self._on_signal.setdefault((rule.component, rule.signal), []).append(
                    (rule, condition_for(rule))
                )
        self._stale = [r for rules in self._stale_on_signal.values() for r in rules]
        self._watched_signals = self._on_signal.keys() | self._stale_on_signal.keys()
        self._composites = [
            (rule, Combination(rule), _signals_under(rule, by_name))
            for rule in _children_first(self.rules, by_name)
        ]
        self._used_by_composites = {p for rule, _, _ in self._composites for p in rule.rules}
        self._streams: dict[_Key, _Stream] = {}
        self._sessions: dict[str, float] = {}  # session -> first time seen
        self._gates: dict[tuple[str, str], Gate] = {}  # (rule, session), non-signal rules
        self._last_hit: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------------ inputs

    def observe(self, items: Sequence[CommitItem]) -> list[HazardEvent]:
        """A batch of ingested items, in order, by kind; a session end frees its state last.
        Events come sorted by their time."""
        events: list[HazardEvent] = []
        if samples := [i for i in items if isinstance(i, TelemetrySample)]:
            events += self.observe_telemetry(samples)
        for batch in items:
            if isinstance(batch, TelemetryBatch):
                events += self.observe_batch(batch)
        if messages := [i for i in items if isinstance(i, AgentMessage)]:
            events += self.observe_messages(messages)
        for item in items:
            if isinstance(item, SessionEnd):
                events += self.observe_end(item)
        return sorted(events, key=_EVENT_TIME)

    def observe_telemetry(self, samples: Sequence[TelemetrySample]) -> list[HazardEvent]:
        rows = map(row_of, samples)
        return self._observe(self._grouped(rows, map(_STREAM_OF, samples)))

    def observe_batch(self, batch: TelemetryBatch) -> list[HazardEvent]:
        """An input's rows: all of one session, so (component, signal) tells streams apart."""
        session, rows = batch.session_id, batch.rows
        groups = self._grouped(rows, map(_SIGNAL_OF, rows))
        return self._observe({(session, *key): group for key, group in groups.items()})

    def _grouped(
        self, rows: Iterable[SampleRow], keys: Iterable[_Key]
    ) -> dict[_Key, list[SampleRow]]:
        """Rows by stream key, in order, for streams some rule watches: one dict lookup per
        row, whether a rule watches its stream or not. A key ends with (component, signal)."""
        groups: dict[_Key, list[SampleRow] | None] = {}
        watched = self._watched_signals
        for row, key in zip(rows, keys, strict=True):
            group = groups.get(key, _NOT_MET)
            if group is _NOT_MET:
                group = groups[key] = [] if key[-2:] in watched else None
            if group is not None:
                group.append(row)
        return {key: group for key, group in groups.items() if group is not None}

    def _observe(self, groups: dict[_Key, list[SampleRow]]) -> list[HazardEvent]:
        """Each stream's rows (keyed by session, component, signal), then the composites.

        numpy's floating-point warnings are off meanwhile: a reading near the float limit
        overflows into an inf or NaN measure, which the rules handle (see signals), and which
        must not print a warning per chunk."""
        out = _Round()
        with np.errstate(all="ignore"):
            for key, group in groups.items():
                stream = self._round_of(key)
                if len(group) <= CHUNK:
                    self._observe_chunk(key, stream, group, out)
                    continue
                for start in range(0, len(group), CHUNK):
                    self._observe_chunk(key, stream, group[start : start + CHUNK], out)
        self._combine(out)
        return out.sorted_events()

    def observe_message(self, message: AgentMessage) -> list[HazardEvent]:
        return self.observe_messages([message])

    def observe_messages(self, messages: Sequence[AgentMessage]) -> list[HazardEvent]:
        """Messages in order, as one round: composites combine once per batch, as for samples."""
        out = _Round()
        for message in messages:
            session, at = message.session_id, message.sent_at
            if session not in self._sessions:
                self._sessions[session] = at.timestamp()
            for rule, matcher in self._matchers:
                summary = matcher.match(message)
                if summary is not None:  # the usual case is None: no time needed
                    self._message_hit(rule, session, at, summary, out)
        self._combine(out)
        return out.sorted_events()

    def observe_end(self, end: SessionEnd) -> list[HazardEvent]:
        """A session's end: the replies it still waited on fire, then its state is freed."""
        out = _Round()
        session = end.session_id
        for rule, matcher in self._matchers:
            if isinstance(matcher, ReplyWatch) and (summary := matcher.ended(session)):
                self._message_hit(rule, session, end.ended_at, summary, out)
        self._combine(out)
        self.end_session(session)
        return out.sorted_events()

    def tick(self, now: datetime) -> list[HazardEvent]:
        """Check the stale rules at ``now``. Call it periodically, for example once a second."""
        t = now.timestamp()
        out = _Round()
        for rule in self._stale:
            for session, first_seen in self._sessions.items():
                stream = self._streams.get((session, rule.component, rule.signal))
                silent = t - (stream.window.last_time if stream else first_seen)
                if silent <= rule.timeout_seconds or not self._single_hit(
                    rule, session, t, now, out
                ):
                    continue
                since = "since its last sample" if stream else "since the session began"
                summary = (
                    f"{rule.label} silent for {silent:.3g} s {since} "
                    f"(timeout {rule.timeout_seconds:g} s)"
                )
                evidence = stream.window.evidence_at(t, self._evidence_limit) if stream else ()
                out.events.append((t, _event(rule, session, now, summary, evidence)))
        self._combine(out)
        return out.sorted_events()

    def end_session(self, session_id: str) -> None:
        """Free everything kept for a finished session. Its stale rules stop firing."""
        for component, signal in self._watched_signals:
            self._streams.pop((session_id, component, signal), None)
        for rule in self.rules:
            self._gates.pop((rule.name, session_id), None)
            self._last_hit.pop((rule.name, session_id), None)
        self._sessions.pop(session_id, None)
        for _, matcher in self._matchers:
            if isinstance(matcher, RepeatMatcher | ReplyWatch):
                matcher.forget(session_id)

    # ------------------------------------------------------------------ evaluation

    def _round_of(self, key: _Key) -> _Stream:
        """The stream, ready for a round of its samples: its stale rules re-armed, and its
        evidence trimmed to what the round's first sample may reach back to. Trimmed once per
        round, not per chunk, so composites (combined after every chunk) find the evidence of
        a hit in any chunk of the round."""
        session, component, signal = key
        stream = self._streams.get(key)
        if stream is None:
            rules = self._on_signal.get((component, signal), ())
            stream = _Stream(session, rules, self._evidence_limit)
            self._streams[key] = stream
        for stale in self._stale_on_signal.get((component, signal), ()):
            gate = self._gates.get((stale.name, session))
            if gate is not None:
                gate.latched = False
        stream.window.trim()
        return stream

    def _observe_chunk(
        self,
        key: _Key,
        stream: _Stream,
        chunk: Sequence[SampleRow],
        out: _Round,
    ) -> None:
        session = key[0]
        clamped = stream.window.record(chunk)
        self._sessions.setdefault(session, clamped[0])
        values = [row[2] for row in chunk]
        if stream.values_only and _quiet(stream, values):
            return
        view = stream.window.view(clamped, values)
        times = view.t[view.first :]
        for state in stream.states:
            rule, condition = state.rule, state.condition
            reading = condition.read(view)
            hit = condition.levels.hits(reading.measure)
            if rule.for_samples > 1:
                run = consecutive(hit, state.run)
                state.run = int(run[-1])
                hit = run >= rule.for_samples
            any_hit = np.count_nonzero(hit) > 0  # a third of hit.any()'s cost on small chunks
            if not (any_hit or state.gate.latched):
                continue
            hits = np.flatnonzero(hit)
            if any_hit and rule.name in self._used_by_composites:
                stamps = tuple(chunk[j][3] for j in hits.tolist())
                out.add_hits(rule.name, session, Hits(times[hits], stamps))
            if not rule.emit:
                continue
            clears = np.flatnonzero(condition.levels.clears(reading.measure))
            for j in state.gate.admit(times, hits, clears):
                summary = _signal_summary(rule, condition, reading, j)
                evidence = stream.window.evidence_at(float(times[j]), self._evidence_limit)
                at = chunk[j][3]
                out.events.append((float(times[j]), _event(rule, session, at, summary, evidence)))

    def _message_hit(
        self, rule: RuleSpec, session: str, at: datetime, summary: str, out: _Round
    ) -> None:
        t = at.timestamp()
        if self._single_hit(rule, session, t, at, out):
            out.events.append((t, _event(rule, session, at, summary)))

    def _single_hit(
        self, rule: RuleSpec, session: str, t: float, at: datetime, out: _Round
    ) -> bool:
        """Record a one-off hit (message, stale check) and say whether it fires."""
        if rule.name in self._used_by_composites:
            out.add_hits(rule.name, session, Hits(np.array([t]), (at,)))
        if not rule.emit:
            return False
        return self._gate(rule, session).admit_one(t)

    def _gate(self, rule: RuleSpec, session: str) -> Gate:
        gate = self._gates.get((rule.name, session))
        if gate is None:
            gate = Gate(rule.cooldown_seconds, latching=isinstance(rule, StaleRule))
            self._gates[(rule.name, session)] = gate
        return gate

    def _combine(self, out: _Round) -> None:
        """Evaluate composites on this round's hits, parts before the composites that use them."""
        for rule, combination, signals in self._composites:
            sessions = {s for part in rule.rules for s in out.hits.get(part, {})}
            for session in sessions:
                new = {
                    part: Hits.merge(out.hits[part][session])
                    for part in rule.rules
                    if session in out.hits.get(part, {})
                }
                last = {p: self._last_hit.get((p, session), -math.inf) for p in rule.rules}
                hits, completed_by = combination.combine(new, last)
                if not hits.times.size:
                    continue
                if rule.name in self._used_by_composites:
                    out.add_hits(rule.name, session, hits)
                if not rule.emit:
                    continue
                gate = self._gate(rule, session)
                for j in gate.admit(hits.times, np.arange(len(hits.times)), _NO_INDICES):
                    t = float(hits.times[j])
                    evidence = self._evidence_across(session, signals, t)
                    summary = combination.describe(completed_by[j])
                    out.events.append((t, _event(rule, session, hits.stamps[j], summary, evidence)))
        for name, by_session in out.hits.items():
            for session, parts in by_session.items():
                newest = max(float(p.times[-1]) for p in parts)
                key = (name, session)
                self._last_hit[key] = max(self._last_hit.get(key, -math.inf), newest)

    def _evidence_across(
        self, session: str, signals: Sequence[Signal], t: float
    ) -> tuple[TelemetrySample, ...]:
        """Evidence for a composite: the tails of its signals' streams, sharing the limit."""
        limit = self._evidence_limit
        if not signals or not limit:
            return ()
        each = max(1, limit // len(signals))
        evidence: list[TelemetrySample] = []
        for component, signal in signals:
            stream = self._streams.get((session, component, signal))
            if stream is not None:
                evidence.extend(stream.window.evidence_at(t, each))
        return tuple(evidence[:limit])


def _quiet(stream: _Stream, values: Sequence[float]) -> bool:
    """Whether a chunk changes nothing for a values-only stream: no rule is latched (waiting
    for a clear) and no value hits. Then every rule's run of consecutive hits is over. Decided
    on plain floats; the arrays are built only when something happens."""
    for state in stream.states:
        if state.gate.latched or state.condition.levels.hit_any(values):
            return False
    for state in stream.states:
        state.run = 0
    return True


def _event(
    rule: RuleSpec,
    session: str,
    at: datetime,
    summary: str,
    evidence: tuple[TelemetrySample, ...] = (),
) -> HazardEvent:
    return HazardEvent(
        rule=rule.name,
        severity=rule.severity,
        session_id=session,
        at=at,
        summary=summary,
        evidence=evidence,
    )


def _signal_summary(rule: SignalRuleSpec, condition: Condition, reading: Reading, i: int) -> str:
    summary = f"{rule.label} {condition.describe(reading, i)}"
    if rule.for_samples > 1:
        summary += f" for {rule.for_samples} samples"
    return summary


def _children_first(
    rules: Iterable[RuleSpec], by_name: dict[str, RuleSpec]
) -> list[CompositeRuleSpec]:
    """Composites in an order where every composite comes after the composites it uses."""
    ordered: list[CompositeRuleSpec] = []
    seen: set[str] = set()

    def visit(rule: RuleSpec) -> None:
        if rule.name in seen or not isinstance(rule, AllRule | AnyRule):
            return
        seen.add(rule.name)
        for part in rule.rules:
            visit(by_name[part])
        ordered.append(rule)

    for rule in rules:
        visit(rule)
    return ordered


def _signals_under(rule: RuleSpec, by_name: dict[str, RuleSpec]) -> tuple[Signal, ...]:
    """The telemetry signals a composite depends on, directly or through other composites."""
    if isinstance(rule, AllRule | AnyRule):
        found = (s for part in rule.rules for s in _signals_under(by_name[part], by_name))
        return tuple(dict.fromkeys(found))
    if isinstance(rule, MessageRuleSpec):
        return ()
    return ((rule.component, rule.signal),)
