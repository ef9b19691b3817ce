"""Canaries: a labelled case replayed into a shadow session, investigated and scored, touching
no real alert, no β, no place of the investigation queue; on both store adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from poirotd.campaigns.canary import Canaries, load_cases
from poirotd.campaigns.schedule import QuietHours, seconds_until_due
from poirotd.config import SystemSpec
from poirotd.config.spec import CanarySpec
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import clinic
from poirotd.investigations.admission import QueueShares
from poirotd.investigations.recorder import now
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import (
    CanaryLabel,
    Investigation,
    InvestigationState,
    LLMUsage,
    TelemetrySample,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import Admission, Store
from poirotd.store.audit import verify
from tests.support.canary import labelled, write_case
from tests.support.store import investigation, queue, triggered
from tests.support.stores import StoreDb

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def canary_spec(cases: Path, **fields: Any) -> SystemSpec:
    return clinic(canary={"cases": str(cases), "interval_seconds": 1, **fields})


def finished_canary(iid: str, created_at: datetime, tokens: int = 0) -> Investigation:
    """A canary's stored record, as another replica (or an earlier start) left it."""
    label = CanaryLabel(case_id="c1", dataset="campaign", truth=("doctor",))
    record = investigation(iid, state=InvestigationState.FAILED, created_at=created_at)
    usage = LLMUsage(prompt_tokens=tokens, completion_tokens=0)
    return record.model_copy(update={"canary": label, "usage": usage})


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"system": "clinic", **labels})


async def test_a_canary_is_scored_marked_and_leaves_alerts_betas_and_memory_alone(
    store_db: StoreDb, tmp_path: Path
) -> None:
    write_case(tmp_path / "cases", labelled("right", ("doctor",)), fault={"kind": "drop"})
    write_case(tmp_path / "cases", labelled("wrong", ("exo",)))
    spec = canary_spec(tmp_path / "cases")
    metrics = Metrics("clinic")
    store = await store_db.open()
    try:
        cases = load_cases(spec, metrics)
        assert [c.case_id for c in cases] == ["right", "wrong"]
        canaries = Canaries(spec, store, ScriptedBackend(schema_answer), metrics, cases)
        right = await canaries.run_next()
        wrong = await canaries.run_next()
        assert right is not None and wrong is not None
        assert (right.correct, wrong.correct) == (True, False)

        stored = await store.get_investigation(right.investigation.investigation_id)
        assert stored is not None and stored.canary is not None
        assert (stored.canary.case_id, stored.canary.truth) == ("right", ("doctor",))
        assert stored.canary.correct
        assert stored.state is InvestigationState.SUCCEEDED
        assert stored.session_id.startswith("canary-") and "right" in stored.reason
        assert await store.exchanges(stored.investigation_id), "its LLM calls are audited"
        # No Watch event, no real attribution metric, no β, no memory entry.
        assert await store.events_after(0, investigation_id=None) == []
        assert sample(metrics, "poirot_attribution_score", component="doctor") is None
        assert (
            sample(metrics, "poirot_investigations_total", outcome="succeeded", method="poirot")
            is None
        )
        assert await store.reputations("clinic") == {}
        assert await store.confirmed_investigations("clinic") == []
        assert await store.memory_entries("clinic", include_deleted=True) == []
        assert not store.has_session(stored.session_id)
        assert await store.list_investigations() == ([], None)
        listed, _ = await store.list_investigations(canaries=True)
        assert {i.investigation_id for i in listed} == {
            right.investigation.investigation_id,
            wrong.investigation.investigation_id,
        }

        assert sample(metrics, "poirot_canary_runs_total", method="poirot", outcome="correct") == 1
        assert sample(metrics, "poirot_canary_runs_total", method="poirot", outcome="wrong") == 1
        assert sample(metrics, "poirot_canary_accuracy", method="poirot") == 0.5
        assert sample(metrics, "poirot_canary_accuracy_floor") == 0.5
        assert sample(metrics, "poirot_canary_cases") == 2

        # A restarted daemon reads each method's accuracy window back from the store.
        restarted = Metrics("clinic")
        again = Canaries(spec, store, ScriptedBackend(schema_answer), restarted, cases)
        assert sample(restarted, "poirot_canary_accuracy", method="poirot") is None
        await again.restore()
        assert sample(restarted, "poirot_canary_accuracy", method="poirot") == 0.5
        assert sample(metrics, "poirot_canary_llm_tokens_total") == (
            right.investigation.usage.prompt_tokens
            + right.investigation.usage.completion_tokens
            + wrong.investigation.usage.prompt_tokens
            + wrong.investigation.usage.completion_tokens
        )
    finally:
        await store.close()
    assert verify(store_db.target).ok
    marked = store_db.query(
        "SELECT count(*) FROM audit WHERE kind = 'investigation' AND payload LIKE ?",
        '%"canary":{"case_id":%',
    )
    assert marked == [(2,)], "the audit chain keeps each canary's record as a canary's"


@pytest.mark.parametrize("method", ["poirot", "errorprobe"])
async def test_a_canary_shows_the_case_s_telemetry_as_a_real_run_would(
    store_db: StoreDb, tmp_path: Path, method: str
) -> None:
    """A hardware fault's evidence is its telemetry: the canary's incident summarises the case's
    samples (its newest, as a real run reads them from the store), which every method sees."""
    hr = [
        TelemetrySample(
            session_id="original",
            component="exo",
            signal="heart_rate_bpm",
            value=value,
            measured_at=T0 + timedelta(seconds=i),
        )
        for i, value in enumerate([80.0, 81.0, 187.5])
    ]
    case = labelled("hot", ("exo",)).model_copy(update={"telemetry": tuple(hr)})
    write_case(tmp_path / "cases", case)
    spec = canary_spec(tmp_path / "cases", methods=[method])
    metrics = Metrics("clinic")
    backend = ScriptedBackend(schema_answer)
    store = await store_db.open()
    try:
        canaries = Canaries(spec, store, backend, metrics, load_cases(spec, metrics))
        result = await canaries.run_next()
        assert result is not None
        assert "heart_rate_bpm" in result.investigation.incident
        assert "187.5" in result.investigation.incident
        prompts = ["\n".join(m.content for m in call.messages) for call in backend.calls]
        assert any("Hardware telemetry" in p and "187.5" in p for p in prompts)
    finally:
        await store.close()


async def test_replicas_of_one_store_share_the_interval(store_db: StoreDb, tmp_path: Path) -> None:
    """A canary another replica ran (stored with the shared store) starts this daemon's interval
    again, so replicas together run about one canary per interval, not one each."""
    write_case(tmp_path / "cases", labelled())
    spec = canary_spec(tmp_path / "cases", interval_seconds=600)
    metrics = Metrics("clinic")
    store = await store_db.open()
    try:
        canaries = Canaries(spec, store, ScriptedBackend(schema_answer), metrics, [])
        started = now()
        later = started + timedelta(seconds=1200)
        assert await canaries.seconds_until_next(later) == 0.0, "its own interval has passed"
        elsewhere = finished_canary("elsewhere", started + timedelta(seconds=900))
        await store.save_investigation(elsewhere)
        assert await canaries.seconds_until_next(later) == pytest.approx(300)
    finally:
        await store.close()


async def test_a_canary_waits_while_the_queue_holds_work(store_db: StoreDb, tmp_path: Path) -> None:
    write_case(tmp_path / "cases", labelled())
    spec = canary_spec(tmp_path / "cases")
    metrics = Metrics("clinic")
    store = await store_db.open()
    try:
        backend = ScriptedBackend(schema_answer)
        canaries = Canaries(spec, store, backend, metrics, load_cases(spec, metrics))
        await _queue_one_trigger(store)
        assert await canaries.run_next() is None
        assert backend.calls == []
        assert sample(metrics, "poirot_canary_skipped_total", reason="queue_busy") == 1
        assert (
            sample(metrics, "poirot_canary_runs_total", method="poirot", outcome="correct") is None
        )
    finally:
        await store.close()


async def test_a_restart_keeps_what_the_day_s_canaries_spent(
    store_db: StoreDb, tmp_path: Path
) -> None:
    """A daemon restarted in a loop gets no fresh token budget and does not start the plan
    over: the restarted canaries read today's spending and the last case back from the store."""
    write_case(tmp_path / "cases", labelled("a"))
    write_case(tmp_path / "cases", labelled("b"))
    store = await store_db.open()
    try:
        first = canary_spec(tmp_path / "cases")
        metrics = Metrics("clinic")
        ran = await Canaries(
            first, store, ScriptedBackend(schema_answer), metrics, load_cases(first, metrics)
        ).run_next()
        assert ran is not None and ran.case.case_id == "a"
        spent = ran.investigation.usage.prompt_tokens + ran.investigation.usage.completion_tokens
        assert spent > 0

        exactly_spent = canary_spec(tmp_path / "cases", token_budget=spent)
        restarted = Metrics("clinic")
        backend = ScriptedBackend(schema_answer)
        again = Canaries(
            exactly_spent, store, backend, restarted, load_cases(exactly_spent, restarted)
        )
        await again.restore()
        assert await again.run_next() is None
        assert backend.calls == []
        assert sample(restarted, "poirot_canary_skipped_total", reason="token_budget") == 1

        roomier = canary_spec(tmp_path / "cases", token_budget=spent + 1)
        cases = load_cases(roomier, restarted)
        third = Canaries(roomier, store, ScriptedBackend(schema_answer), restarted, cases)
        await third.restore()
        resumed = await third.run_next()
        assert resumed is not None, "one token left is a budget"
        assert resumed.case.case_id == "b", "the plan goes on after the last stored canary"
    finally:
        await store.close()


async def _queue_one_trigger(store: Store) -> None:
    await queue(store, investigation("queued"))


async def test_a_running_canary_takes_no_place_of_the_queue(
    store_db: StoreDb, tmp_path: Path
) -> None:
    """While a canary is in flight, Trigger calls still get all their places and a hazard is
    still queued, not deferred: the canary is not in the queue at all."""
    write_case(tmp_path / "cases", labelled())
    spec = canary_spec(tmp_path / "cases")
    metrics = Metrics("clinic")
    gate = asyncio.Event()

    async def held(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        await gate.wait()
        return schema_answer(messages, schema)

    store = await store_db.open()
    try:
        canaries = Canaries(spec, store, ScriptedBackend(held), metrics, load_cases(spec, metrics))
        running = asyncio.create_task(canaries.run_next())
        await asyncio.sleep(0.2)
        assert not running.done(), "the canary holds the model"
        shares = QueueShares(capacity=3, reserved_for_rules=1, per_client=5)
        for i in range(shares.for_triggers):
            candidate = investigation(f"t{i}", sid=f"s{i}")
            admitted = await store.admit_investigation(candidate, shares.admit(candidate))
            assert admitted.admission is Admission.QUEUED
        hazard = triggered("h", sid="s3")
        admitted = await store.admit_investigation(hazard, shares.admit(hazard))
        assert admitted.admission is Admission.QUEUED, "the place kept for hazards is free"
        gate.set()
        result = await running
        assert result is not None and result.investigation.canary
        assert await store.count_investigations(InvestigationState.QUEUED) == 3
    finally:
        gate.set()
        await store.close()


def test_refused_case_files_are_counted_and_the_rest_replayed(tmp_path: Path) -> None:
    folder = tmp_path / "cases"
    write_case(folder, labelled("good"))
    write_case(
        folder,
        labelled("elsewhere").model_copy(
            update={"spec": clinic(system={"name": "other", "description": "another system"})}
        ),
    )
    write_case(folder, labelled("unlabelled", ("nobody",)))
    (folder / "broken.json").write_text("{not json")
    metrics = Metrics("clinic")
    cases = load_cases(canary_spec(folder), metrics)
    assert [c.case_id for c in cases] == ["good"]
    assert sample(metrics, "poirot_canary_case_errors_total") == 3
    assert sample(metrics, "poirot_canary_cases") == 1


@pytest.mark.parametrize(
    ("window", "at", "expected"),
    [
        ("01:00-05:00", "03:00", 0.0),
        ("01:00-05:00", "05:00", 20 * 3600),
        ("01:00-05:00", "00:30", 1800),
        ("22:00-02:00", "23:59", 0.0),
        ("22:00-02:00", "01:00", 0.0),
        ("22:00-02:00", "12:00", 10 * 3600),
    ],
)
def test_quiet_hours_open_and_wrap_midnight(window: str, at: str, expected: float) -> None:
    hours, minutes = map(int, at.split(":"))
    moment = T0.replace(hour=hours, minute=minutes)
    assert QuietHours.parse(window).seconds_until_open(moment) == pytest.approx(expected)


def test_a_canary_is_due_an_interval_after_the_last_and_within_quiet_hours() -> None:
    spec = CanarySpec(cases=Path("x"), interval_seconds=600, quiet_hours="13:00-14:00")
    noon = T0  # 12:00
    assert seconds_until_due(spec, noon, noon) == pytest.approx(3600)
    inside = noon.replace(hour=13, minute=5)
    assert seconds_until_due(spec, inside, inside) == pytest.approx(600)
    assert seconds_until_due(spec, inside - timedelta(hours=1), inside) == 0.0


async def test_the_budget_counts_only_the_canaries_of_this_utc_day(
    store_db: StoreDb, tmp_path: Path
) -> None:
    write_case(tmp_path / "cases", labelled())
    spec = canary_spec(tmp_path / "cases", token_budget=100_000)
    metrics = Metrics("clinic")
    yesterday = finished_canary("yesterday", now() - timedelta(days=1), tokens=100_000)
    store = await store_db.open()
    try:
        await store.save_investigation(yesterday)
        cases = load_cases(spec, metrics)
        canaries = Canaries(spec, store, ScriptedBackend(schema_answer), metrics, cases)
        assert await canaries.run_next() is not None, "yesterday's spending is not today's"
        today = yesterday.model_copy(update={"investigation_id": "today", "created_at": now()})
        await store.save_investigation(today)
        assert await canaries.run_next() is None
        assert sample(metrics, "poirot_canary_skipped_total", reason="token_budget") == 1
    finally:
        await store.close()
