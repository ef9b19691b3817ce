"""The reputation variant of β: the update rule, its persistence, and ConfirmOutcome over gRPC."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from poirotd.api.client import PoirotClient
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config import SystemSpec
from poirotd.config.spec import ReputationSpec
from poirotd.daemon import Daemon
from poirotd.llm import ChatMessage, LLMError
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import (
    AgentReputation,
    ConfirmedOutcome,
    HazardSpace,
    Investigation,
    InvestigationState,
    Vote,
)
from poirotd.protocol.aggregation import aggregate
from poirotd.protocol.reputation import accuracy, betas_in_use, reassess, updated_beta
from poirotd.store import AlreadyConfirmedError, SqliteStore, UnknownInvestigationError
from poirotd.store.audit import verify
from poirotd.store.schema import SCHEMA_VERSION
from tests.support.answers import fill
from tests.support.cli import poirotd
from tests.support.daemon import rejected
from tests.support.ingest import session
from tests.support.spec import CLINIC, CLINIC_AGENTS, CLINIC_REGIONS, clinic

AT = datetime(2025, 1, 1, tzinfo=UTC)
RATE = ReputationSpec(enabled=True, initial=0.25, min=0.0, max=0.5, learning_rate=0.2)
REPUTED = clinic(
    protocol={"max_invocations": 2, "reputation": RATE.model_dump()},
    hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]},
)

# ------------------------------------------------------------------ the update rule


@pytest.mark.parametrize(
    ("location", "truth", "expected"),
    [
        ((1, 0, 0, 0), (1, 0, 0, 0), 1.0),
        ((0, 1, 0, 0), (1, 0, 0, 0), 0.0),
        ((0, 0, 0, 0), (1, 0, 0, 0), 0.0),
        ((1, 1, 0, 0), (1, 0, 0, 0), 0.5),
        ((1, 1, 0, 0), (0, 1, 1, 0), 1 / 3),
    ],
)
def test_accuracy_is_the_jaccard_similarity_of_vote_and_truth(
    location: tuple[int, ...], truth: tuple[int, ...], expected: float
) -> None:
    assert accuracy(location, truth) == pytest.approx(expected)


def test_accuracy_refuses_vectors_of_different_spaces() -> None:
    with pytest.raises(ValueError, match="cannot match"):
        accuracy((1, 0), (1, 0, 0))


def test_a_right_vote_raises_beta_a_wrong_one_lowers_it_within_bounds() -> None:
    assert updated_beta(0.25, 1.0, RATE) == pytest.approx(0.25 + 0.2 * (0.5 - 0.25))
    assert updated_beta(0.25, 0.0, RATE) == pytest.approx(0.25 - 0.2 * 0.25)
    assert updated_beta(0.25, 0.5, RATE) == pytest.approx(0.25)  # at its target already
    jump = RATE.model_copy(update={"learning_rate": 1.0, "min": 0.1, "max": 0.4})
    assert updated_beta(0.25, 1.0, jump) == pytest.approx(0.4)
    assert updated_beta(0.25, 0.0, jump) == pytest.approx(0.1)
    # A β stored under wider bounds is brought back inside them.
    assert updated_beta(0.5, 1.0, jump) == pytest.approx(0.4)


def test_repeated_right_votes_converge_to_max_and_never_pass_it() -> None:
    beta = RATE.initial
    for _ in range(100):
        beta = updated_beta(beta, 1.0, RATE)
        assert beta <= RATE.max
    assert beta == pytest.approx(RATE.max)


@pytest.mark.parametrize(
    "reputation",
    [
        {"initial": 0.3, "min": 0.35},
        {"initial": 0.3, "max": 0.25},
        {"max": 0.6},
        {"learning_rate": 0.0},
    ],
)
def test_reputation_spec_refuses_bounds_outside_the_papers_range(
    reputation: dict[str, float],
) -> None:
    with pytest.raises(ValidationError):
        ReputationSpec.model_validate(reputation)


def _reputation(agent: str, beta: float, confirmations: int = 1) -> AgentReputation:
    return AgentReputation(
        system="clinic",
        agent_id=agent,
        beta=beta,
        confirmations=confirmations,
        investigation_id="earlier",
        updated_at=AT,
    )


def test_betas_in_use_are_the_specs_beta_unless_reputation_is_enabled() -> None:
    stored = {"doctor": _reputation("doctor", 0.4)}
    assert betas_in_use(CLINIC, stored) == dict.fromkeys(CLINIC_AGENTS, 0.25)
    assert betas_in_use(REPUTED, stored) == {"doctor": 0.4, "chief": 0.25, "physio": 0.25}


VOTES = (
    Vote(agent_id="doctor", location=(1, 0, 0, 0)),
    Vote(agent_id="chief", location=(0, 1, 0, 0)),
    Vote(agent_id="physio", abstention_reason="vote: no valid answer"),
)


def test_reassess_moves_voters_only_and_counts_their_confirmations() -> None:
    stored = {"chief": _reputation("chief", 0.4, confirmations=3)}
    updated = reassess(REPUTED, VOTES, (1, 0, 0, 0), stored, investigation_id="i2", at=AT)
    assert {r.agent_id: r.beta for r in updated} == pytest.approx(
        {"doctor": 0.3, "chief": 0.4 - 0.2 * 0.4}
    )
    assert {r.agent_id: r.confirmations for r in updated} == {"doctor": 1, "chief": 4}
    assert all(r.investigation_id == "i2" and r.updated_at == AT for r in updated)
    assert reassess(CLINIC, VOTES, (1, 0, 0, 0), stored, investigation_id="i2", at=AT) == []


def test_aggregation_weighs_each_vote_with_its_agents_beta() -> None:
    space = HazardSpace(system="clinic", version="v", source="pinned", regions=CLINIC_REGIONS)
    betas = {"doctor": 0.5, "chief": 0.1, "physio": 0.3}
    attribution = aggregate(space, VOTES, betas, REPUTED.protocol.decision)
    # doctor on itself: 0.5 + 0.5; chief on itself: 0.1 + 0.5; the abstainer is left out.
    assert attribution.scores == pytest.approx((1.0, 0.6, 0.0, 0.0))
    assert attribution.beta == pytest.approx(0.3)


# ------------------------------------------------------------------ the store


def _succeeded(investigation_id: str = "i1") -> Investigation:
    return Investigation(
        investigation_id=investigation_id,
        system="clinic",
        session_id="s1",
        state=InvestigationState.SUCCEEDED,
        reason="test",
        created_at=AT,
        votes=VOTES,
    )


def _outcome(*regions: str) -> ConfirmedOutcome:
    return ConfirmedOutcome(
        region_ids=regions,
        decision=tuple(int(r in regions) for r in (*CLINIC_AGENTS, "exo")),
        note="checked by the clinician",
        at=AT,
    )


class Reassessor:
    """Counts its calls: a repeated confirmation must not reach it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, inv: Investigation, stored: dict[str, AgentReputation]
    ) -> list[AgentReputation]:
        self.calls += 1
        return reassess(
            REPUTED,
            inv.votes,
            _outcome("doctor").decision,
            stored,
            investigation_id=inv.investigation_id,
            at=AT,
        )


async def test_a_confirmation_persists_with_the_reputations_and_is_audited(
    tmp_path: Path,
) -> None:
    db = tmp_path / "poirotd.db"
    store = await SqliteStore.open(db)
    reassessor = Reassessor()
    try:
        await store.save_investigation(_succeeded())
        record, newly = await store.confirm_outcome("i1", _outcome("doctor"), reassessor)
        assert newly and record.confirmed == _outcome("doctor")
    finally:
        await store.close()

    store = await SqliteStore.open(db)
    try:
        reloaded = await store.get_investigation("i1")
        assert reloaded is not None and reloaded.confirmed == _outcome("doctor")
        reputations = await store.reputations("clinic")
        assert {a: r.beta for a, r in reputations.items()} == pytest.approx(
            {"doctor": 0.3, "chief": 0.2}
        )
        assert await store.reputations("another_system") == {}
    finally:
        await store.close()
    report = verify(db)
    assert report.ok, report.summary()


async def test_confirming_twice_updates_once_and_other_regions_are_refused(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(tmp_path / "poirotd.db")
    reassessor = Reassessor()
    try:
        await store.save_investigation(_succeeded())
        await store.confirm_outcome("i1", _outcome("doctor"), reassessor)
        first = await store.reputations("clinic")

        again, newly = await store.confirm_outcome("i1", _outcome("doctor"), reassessor)
        assert not newly and again.confirmed == _outcome("doctor")
        with pytest.raises(AlreadyConfirmedError, match="already confirmed"):
            await store.confirm_outcome("i1", _outcome("chief"), reassessor)
        with pytest.raises(UnknownInvestigationError):
            await store.confirm_outcome("nope", _outcome("doctor"), reassessor)

        assert reassessor.calls == 1
        assert await store.reputations("clinic") == first
        # A second investigation's confirmation starts from the first one's reputations.
        await store.save_investigation(_succeeded("i2"))
        await store.confirm_outcome("i2", _outcome("doctor"), reassessor)
        reputations = await store.reputations("clinic")
        assert reputations["doctor"].beta == pytest.approx(0.3 + 0.2 * (0.5 - 0.3))
        assert reputations["doctor"].confirmations == 2
    finally:
        await store.close()


# ------------------------------------------------------------------ over gRPC


class Answers:
    """Every agent votes for region 0 (doctor) but physio, which votes "no anomaly"; with
    `failing` set every call fails, so investigations fail."""

    def __init__(self) -> None:
        self.failing = False

    def __call__(self, messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        if self.failing:
            raise LLMError("the model server is down", reason="unavailable")
        if schema is None:
            return "I saw nothing unusual."
        physio = messages[0].content.startswith(REPUTED.agent("physio").system_prompt)
        return json.dumps(fill(schema, bit=0 if physio else 1))


@pytest.fixture
def answers() -> Answers:
    return Answers()


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return REPUTED


@pytest.fixture
def daemon_backend(answers: Answers) -> ScriptedBackend:
    return ScriptedBackend(answers)


async def investigate(client: PoirotClient) -> pb.Investigation:
    queued = await client.trigger("s1", "operator saw a fall")
    async for _ in client.watch(queued.investigation_id):
        pass
    return await client.get(queued.investigation_id)


def betas_of(message: Any) -> dict[str, float]:
    return {b.agent_id: b.beta for b in message.betas}


async def test_confirm_outcome_moves_the_betas_the_next_investigation_uses(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send(session(6))
    first = await investigate(client)
    assert first.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert dict(first.betas) == dict.fromkeys(CLINIC_AGENTS, 0.25)

    confirmed = await client.confirm(first.investigation_id, ["doctor"], note="clinician")
    assert confirmed.newly_confirmed
    assert list(confirmed.confirmed.region_ids) == ["doctor"]
    assert list(confirmed.confirmed.decision) == [1, 0, 0, 0]
    moved = {"doctor": 0.3, "chief": 0.3, "physio": 0.2}
    assert betas_of(confirmed) == pytest.approx(moved)
    assert {b.agent_id: b.confirmations for b in confirmed.betas} == dict.fromkeys(CLINIC_AGENTS, 1)
    for agent, beta in moved.items():
        sample = daemon.metrics.registry.get_sample_value(
            "poirot_agent_beta", {"system": "clinic", "agent": agent}
        )
        assert sample == pytest.approx(beta)

    record = await client.get(first.investigation_id)
    assert list(record.confirmed.region_ids) == ["doctor"]
    assert record.confirmed.note == "clinician"

    # The same confirmation again (a retry) changes nothing.
    repeated = await client.confirm(first.investigation_id, ["doctor"], note="clinician")
    assert not repeated.newly_confirmed and betas_of(repeated) == betas_of(confirmed)

    second = await investigate(client)
    assert dict(second.betas) == pytest.approx(moved)
    weights = {v.agent_id: v.weight for v in second.votes}
    # doctor on itself (d_H 0), chief on doctor (d_H 2 of 4), physio "no anomaly" (d_H 1 of 4).
    assert weights == pytest.approx({"doctor": 0.8, "chief": 0.55, "physio": 0.575})
    assert second.attribution.beta == pytest.approx(sum(moved.values()) / 3)

    reputation = await client.reputation()
    assert reputation.reputation_enabled and betas_of(reputation) == pytest.approx(moved)
    assert verify(daemon.settings.db_path).ok


async def test_confirm_outcome_refusals_are_counted(
    daemon: Daemon, client: PoirotClient, answers: Answers
) -> None:
    rpc = "Investigations.ConfirmOutcome"
    await client.send(session(6))
    done = await investigate(client)
    answers.failing = True
    failed = await investigate(client)
    assert failed.state == pb.INVESTIGATION_STATE_FAILED

    cases = [
        ((failed.investigation_id, "doctor"), grpc.StatusCode.FAILED_PRECONDITION, "not_succeeded"),
        (("no-such-id", "doctor"), grpc.StatusCode.NOT_FOUND, "not_found"),
        (
            (done.investigation_id, "doctor", "pump"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown_region",
        ),
        ((done.investigation_id,), grpc.StatusCode.INVALID_ARGUMENT, "invalid"),
    ]
    for (investigation_id, *regions), code, reason in cases:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.confirm(investigation_id, regions)
        assert refused.value.code() == code, reason
        assert rejected(daemon, rpc, reason) == 1

    await client.confirm(done.investigation_id, ["exo"])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.confirm(done.investigation_id, ["doctor"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already confirmed with ['exo']" in (refused.value.details() or "")
    assert rejected(daemon, rpc, "already_confirmed") == 1


async def test_a_schema_2_store_gains_the_reputations_table_when_opened(tmp_path: Path) -> None:
    db = tmp_path / "poirotd.db"
    await (await SqliteStore.open(db)).close()
    with closing(sqlite3.connect(db)) as schema_2:
        schema_2.executescript("DROP TABLE reputations; PRAGMA user_version = 2;")
    store = await SqliteStore.open(db)
    try:
        assert await store.reputations("clinic") == {}
    finally:
        await store.close()
    with closing(sqlite3.connect(db)) as reopened:
        assert reopened.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert verify(db).ok


async def test_operators_confirm_and_read_reputation_from_the_command_line(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send(session(6))
    done = await investigate(client)
    target = f"127.0.0.1:{daemon.grpc_port}"

    confirmed = await asyncio.to_thread(
        poirotd, "confirm", done.investigation_id, "doctor", "--note", "ward", "--target", target
    )
    assert confirmed.returncode == 0, confirmed.stderr
    assert f"{done.investigation_id}: doctor (confirmed)" in confirmed.stdout
    assert "0.300" in confirmed.stdout  # doctor's and chief's β, moved up from 0.25

    other = await asyncio.to_thread(
        poirotd, "confirm", done.investigation_id, "exo", "--target", target
    )
    assert other.returncode == 1
    assert "refused: FAILED_PRECONDITION" in other.stderr

    shown = await asyncio.to_thread(poirotd, "reputation", "--target", target)
    assert shown.returncode == 0, shown.stderr
    assert "reputation is off" not in shown.stdout
    assert re.search(r"doctor\W+0\.300\W+1\W+" + done.investigation_id, shown.stdout)
    assert (await client.get(done.investigation_id)).confirmed.note == "ward"
