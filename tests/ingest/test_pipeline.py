"""The ingest pipeline on a real SQLite store: what is admitted, how rounds are committed, and
what producers see when a commit fails or one of them goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from poirotd.config import SystemSpec
from poirotd.devtools.clinic import CLINIC, clinic
from poirotd.errors import InvalidArgument, NotFound
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.model import (
    DEFAULT_MAX_ABS_VALUE,
    AgentMessage,
    CommitItem,
    HazardEvent,
    ItemKey,
    MessageKind,
    Session,
    SessionEnd,
    TelemetryBatch,
    TelemetrySample,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore
from poirotd.store.idempotency import LeftOut
from poirotd.store.parked_logs import NO_PARKING, Parking

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = clinic(
    rules=[
        {
            "kind": "threshold",
            "name": "hot",
            "severity": "critical",
            "component": "exo",
            "signal": "temp",
            "above": 50,
        }
    ]
)


class GatedStore(SqliteStore):
    """Records each commit's items; a commit may be held until the test releases it."""

    commits: list[list[CommitItem]]
    gate: asyncio.Event
    failures: list[Exception]

    async def commit_ingest(
        self,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> LeftOut:
        self.commits.append(list(items))
        await self.gate.wait()
        if self.failures:
            raise self.failures.pop()
        return await super().commit_ingest(items, keys, parking)


class Opener:
    """Records what the pipeline asked to open, and whether its evidence was stored by then."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.opened: list[tuple[str, bool]] = []
        self.events: list[HazardEvent] = []

    async def open(self, events: Sequence[HazardEvent]) -> None:
        self.events += events
        for event in events:
            readings = await self.store.newest_readings(event.session_id)
            self.opened.append((event.rule, any(r.value > 50 for r in readings)))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[GatedStore]:
    opened = await GatedStore.open(tmp_path / "p.db")
    assert isinstance(opened, GatedStore)
    opened.commits, opened.gate, opened.failures = [], asyncio.Event(), []
    opened.gate.set()
    yield opened
    await opened.close()


def pipeline_on(
    store: SqliteStore,
    opener: Opener | None = None,
    *,
    batch_max: int = 512,
    signals: int = 8,
    spec: SystemSpec = SPEC,
    metrics: Metrics | None = None,
) -> IngestPipeline:
    return IngestPipeline(
        spec,
        store,
        opener or Opener(store),
        metrics or Metrics(spec.system.name),
        batch_max=batch_max,
        signals_per_component=signals,
        max_abs_value=DEFAULT_MAX_ABS_VALUE,
    )


def session(session_id: str = "s1") -> Session:
    return Session(session_id=session_id, system="clinic", started_at=T0)


def message(index: int, sender: str = "doctor", session_id: str = "s1") -> AgentMessage:
    return AgentMessage(
        session_id=session_id,
        index=index,
        kind=MessageKind.AGENT,
        sender=sender,
        content=f"turn {index}",
        sent_at=T0,
    )


def reading(
    value: float, session_id: str = "s1", *, signal: str = "temp", at: datetime = T0
) -> TelemetrySample:
    return TelemetrySample(
        session_id=session_id, component="exo", signal=signal, value=value, measured_at=at
    )


async def test_producers_admitting_during_a_commit_share_the_next_one(store: GatedStore) -> None:
    pipeline = pipeline_on(store)
    first, second = pipeline.scope(), pipeline.scope()
    await pipeline.consume([session("s1"), session("s2")], first)
    store.gate.clear()
    held = pipeline.accept([message(0)], first)
    await asyncio.sleep(0.01)  # the commit of `held` is in flight, waiting at the gate
    a = pipeline.accept([message(1)], first)
    b = pipeline.accept([message(0, session_id="s2")], second)
    store.gate.set()
    await asyncio.gather(held.wait(), a.wait(), b.wait())
    assert [len(items) for items in store.commits] == [2, 1, 2]
    assert [m.index for m in await store.session_messages("s1")] == [0, 1]


async def test_a_round_closes_at_batch_max_without_splitting_an_admission(
    store: GatedStore,
) -> None:
    pipeline = pipeline_on(store, batch_max=3)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    store.gate.clear()
    held = pipeline.accept([message(0)], scope)
    await asyncio.sleep(0.01)
    admissions = [pipeline.accept([message(i), message(i + 1)], scope) for i in (1, 3, 5)]
    store.gate.set()
    await asyncio.gather(held.wait(), *(a.wait() for a in admissions))
    assert [len(items) for items in store.commits[1:]] == [1, 4, 2]


async def test_an_invalid_item_stops_the_batch_or_is_skipped(store: GatedStore) -> None:
    pipeline = pipeline_on(store)
    scope = pipeline.scope()
    stopped = await pipeline.consume(
        [session(), message(0), message(1, "ghost"), message(2)], scope
    )
    assert stopped.accepted == 2
    [refusal] = stopped.refused
    assert (refusal.index, refusal.error.reason) == (2, "unknown_agent")
    assert isinstance(refusal.error, InvalidArgument) and "'ghost'" in str(refusal.error)
    skipped = await pipeline.consume(
        [message(3, "ghost"), message(4), message(0, session_id="nowhere")],
        scope,
        skip_invalid=True,
    )
    assert [(r.index, type(r.error)) for r in skipped.refused] == [
        (0, InvalidArgument),
        (2, NotFound),
    ]
    assert [m.index for m in await store.session_messages("s1")] == [0, 4]


async def test_a_telemetry_batch_loses_only_its_invalid_rows(store: GatedStore) -> None:
    pipeline = pipeline_on(store)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    rows = [("exo", "temp", 20.0, T0), ("ghost", "temp", 1.0, T0), ("exo", "temp", 21.0, T0)]
    admission = await pipeline.consume([TelemetryBatch("s1", rows)], scope)
    assert admission.accepted == 1
    assert [(r.index, r.row, r.error.reason) for r in admission.refused] == [
        (0, 1, "unknown_component")
    ]
    assert sorted(r.value for r in await store.newest_readings("s1")) == [20.0, 21.0]


async def test_a_failed_commit_fails_its_round_and_the_next_round_commits(
    store: GatedStore,
) -> None:
    pipeline = pipeline_on(store)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    store.failures.append(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        await pipeline.consume([message(0)], scope)
    await pipeline.consume([message(0)], scope)
    assert [m.index for m in await store.session_messages("s1")] == [0]


async def test_a_producer_that_goes_away_leaves_its_round_to_the_others(
    store: GatedStore,
) -> None:
    pipeline = pipeline_on(store)
    first, second = pipeline.scope(), pipeline.scope()
    await pipeline.consume([session("s1"), session("s2")], first)
    store.gate.clear()
    leaving = asyncio.create_task(pipeline.consume([message(0)], first))
    staying = asyncio.create_task(pipeline.consume([message(0, session_id="s2")], second))
    await asyncio.sleep(0.01)
    leaving.cancel()
    store.gate.set()
    await staying
    assert [m.index for m in await store.session_messages("s2")] == [0]
    await pipeline.drain()
    # Admitted before it went away: committed, though no one acknowledges it.
    assert [m.index for m in await store.session_messages("s1")] == [0]


async def test_rules_fire_on_arrival_and_open_once_the_evidence_is_stored(
    store: GatedStore,
) -> None:
    opener = Opener(store)
    pipeline = pipeline_on(store, opener)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    await pipeline.consume([reading(20.0), reading(60.0)], scope)
    assert opener.opened == [("hot", True)]


async def test_a_reply_still_awaited_when_its_session_ends_fires_as_the_end_is_stored(
    store: GatedStore,
) -> None:
    """The end of a session reaches the rules like any item: what it leaves unanswered fires."""
    waits = {"kind": "reply_expected", "name": "unanswered", "severity": "critical",
             "after": {"sender": "doctor"}, "expect": {"sender": "chief"},
             "within_seconds": 60}  # fmt: skip
    opener = Opener(store)
    pipeline = pipeline_on(store, opener, spec=clinic(rules=[waits]))
    scope = pipeline.scope()
    await pipeline.consume(
        [session("s1"), session("s2"), message(0), message(0, "doctor", "s2")], scope
    )
    await pipeline.consume([message(1, "chief", "s2"), message(1, "physio")], scope)
    assert opener.events == []
    end = SessionEnd(session_id="s1", ended_at=T0 + timedelta(seconds=5))
    await pipeline.consume([end, SessionEnd(session_id="s2", ended_at=T0)], scope)
    [event] = opener.events
    assert (event.rule, event.session_id, event.at) == ("unanswered", "s1", end.ended_at)
    assert event.summary == (
        "message #0 from doctor got no reply (message from chief) before the session ended"
    )


async def test_times_outside_the_window_are_refused_never_stored(store: GatedStore) -> None:
    pipeline = pipeline_on(store)
    scope = pipeline.scope()
    year_one = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    ahead = datetime.now(UTC) + timedelta(days=2)
    refused = await pipeline.consume([session().model_copy(update={"started_at": year_one})], scope)
    assert [r.error.reason for r in refused.refused] == ["time_out_of_range"]
    await pipeline.consume([session()], scope)
    naive = message(0).model_copy(update={"sent_at": datetime(2026, 1, 1)})
    late = message(1).model_copy(update={"sent_at": ahead})
    admission = await pipeline.consume([naive, late], scope, skip_invalid=True)
    assert [(r.index, r.error.reason) for r in admission.refused] == [(1, "time_out_of_range")]
    rows = [("exo", "temp", 20.0, T0), ("exo", "temp", 21.0, ahead), ("exo", "temp", 22.0, T0)]
    admission = await pipeline.consume([TelemetryBatch("s1", rows)], scope)
    assert [(r.row, r.error.reason) for r in admission.refused] == [(1, "time_out_of_range")]
    assert "measured_at" in str(admission.refused[0].error)
    assert sorted(r.value for r in await store.newest_readings("s1")) == [20.0, 22.0]
    assert [m.index for m in await store.session_messages("s1")] == [0]


async def test_a_component_gets_a_bounded_number_of_signal_names(store: GatedStore) -> None:
    """Found by fuzzing: a topic template let a publisher mint 2,387 signal names in one run."""
    pipeline = pipeline_on(store, signals=2)
    first, second = pipeline.scope(), pipeline.scope()
    await pipeline.consume([session()], first)
    rows = [("exo", name, 1.0, T0) for name in ("a", "b", "c", "a")]
    admission = await pipeline.consume([TelemetryBatch("s1", rows)], first)
    assert [(r.row, r.error.reason) for r in admission.refused] == [(2, "too_many_signals")]
    # The bound is the daemon's, not a producer's.
    other = await pipeline.consume([TelemetryBatch("s1", [("exo", "d", 1.0, T0)])], second)
    assert [r.error.reason for r in other.refused] == ["too_many_signals"]


async def test_session_ids_and_signal_names_are_bounded_in_length(store: GatedStore) -> None:
    """Found by fuzzing (issue 20): a 300,000-character session id was stored and kept in the
    daemon's set of known sessions for good, and 1,024 such signal names would each have been
    kept too; the daemon's memory grew with every one."""
    pipeline = pipeline_on(store, signals=2)
    scope = pipeline.scope()
    limit = 256  # MAX_NAME_CHARS, as docs/operating/replicas.md gives it
    long_name = "x" * (limit + 1)
    refused = await pipeline.consume([session(long_name)], scope)
    assert [r.error.reason for r in refused.refused] == ["too_long"]
    assert "session_id is 257 characters, the limit is 256" in str(refused.refused[0].error)
    assert not store.has_session(long_name)
    await pipeline.consume([session("x" * limit)], scope)
    rows = [("exo", long_name, 1.0, T0), ("exo", "a", 1.0, T0), ("exo", "b", 1.0, T0)]
    admission = await pipeline.consume([TelemetryBatch("x" * limit, rows)], scope)
    # Refused before it took one of the component's two names.
    assert [(r.row, r.error.reason) for r in admission.refused] == [(0, "too_long")]


def exo_signals(signals: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """The clinic's components, its exoskeleton declaring these signal ranges (if any)."""
    [exo] = CLINIC.model_dump(mode="json")["components"]
    return [{**exo, "signals": signals} if signals else exo]


async def test_readings_outside_their_signals_range_are_refused_and_counted(
    store: GatedStore,
) -> None:
    """Issue 28: readings of ±1.797e308 were admitted, and made a session's windowed rules
    blind for good. A value outside the range the component declares for its signal, or past
    the default bound for a signal it does not declare, is refused with its reason."""
    metrics = Metrics("clinic")
    spec = clinic(components=exo_signals({"temp": {"min": -40, "max": 125}}))
    pipeline = pipeline_on(store, spec=spec, metrics=metrics)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    samples = [
        reading(130.0),
        reading(125.0),
        reading(1.797e308, signal="pressure"),
        reading(-DEFAULT_MAX_ABS_VALUE, signal="pressure"),
    ]
    admission = await pipeline.consume(samples, scope, skip_invalid=True)
    assert [(r.index, r.error.reason) for r in admission.refused] == [
        (0, "value_out_of_range"),
        (2, "value_out_of_range"),
    ]
    declared, default = (str(r.error) for r in admission.refused)
    assert "'exo' signal 'temp' is outside [-40, 125], the range its component declares" in declared
    bound = DEFAULT_MAX_ABS_VALUE
    assert f"outside [{-bound:g}, {bound:g}], the default range (POIROTD_TELEMETRY_MAX" in default
    # A batch's rows: a stream whose readings passed still has each value checked.
    rows = [
        ("exo", "temp", 20.0, T0),
        ("exo", "temp", -40.5, T0),
        ("exo", "pressure", -1.797e308, T0),
        ("exo", "pressure", 3.0, T0),
    ]
    admission = await pipeline.consume([TelemetryBatch("s1", rows)], scope)
    assert [(r.row, r.error.reason) for r in admission.refused] == [
        (1, "value_out_of_range"),
        (2, "value_out_of_range"),
    ]
    stored = sorted(r.value for r in await store.newest_readings("s1"))
    assert stored == [-DEFAULT_MAX_ABS_VALUE, 3.0, 20.0, 125.0]
    refused = metrics.registry.get_sample_value(
        "poirot_ingest_refused_total", {"kind": "telemetry", "reason": "value_out_of_range"}
    )
    assert refused == 4


# Issue 28's rules: a spike and an offset on the exoskeleton's pressure.
WINDOWED_RULES = [
    {
        "kind": "zscore",
        "name": "spike",
        "window_samples": 50,
        "threshold": 5.0,
        "min_samples": 20,
    },
    {
        "kind": "rolling_mean",
        "name": "offset",
        "window_samples": 20,
        "min_samples": 10,
        "above": 5.0,
    },
]


@pytest.mark.parametrize(
    ("ranges", "extremes"),
    [
        ({}, (1.797e308, -1.797e308)),  # refused: past the default bound
        ({"pressure": {"min": -1e150, "max": 1e150}}, (1e150, -1e150)),  # admitted: declared
    ],
)
async def test_windowed_rules_fire_after_extreme_readings(
    store: GatedStore, ranges: dict[str, dict[str, float]], extremes: tuple[float, float]
) -> None:
    """Issue 28 through the pipeline, one reading per request as a sensor frame sends them:
    after two extreme readings, a spike and an offset still open what they call for."""
    on_pressure = {"component": "exo", "signal": "pressure", "cooldown_seconds": 0.0}
    rules = [r | {"severity": "critical"} | on_pressure for r in WINDOWED_RULES]
    spec = clinic(components=exo_signals(ranges), rules=rules)
    opener = Opener(store)
    pipeline = pipeline_on(store, opener, spec=spec)
    scope = pipeline.scope()
    await pipeline.consume([session()], scope)
    values = np.random.default_rng(5).normal(0.0, 1.0, 300)
    values[100:102] = extremes
    values[200] = 10.0  # a spike
    values[260:] = 8.0  # an offset
    for i, value in enumerate(values.tolist()):
        at = T0 + timedelta(seconds=i * 0.01)
        await pipeline.consume([reading(value, signal="pressure", at=at)], scope, skip_invalid=True)
    fired = [(e.rule, (e.at - T0).total_seconds()) for e in opener.events]
    assert ("spike", 2.0) in fired  # once the extremes have left its window
    [offset] = [t for rule, t in fired if rule == "offset" and t > 1.01]
    assert 2.6 < offset < 2.75
