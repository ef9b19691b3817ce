"""The reputation variant of β: the update rule, its persistence, and ConfirmOutcome over gRPC."""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.config.spec import ReputationSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import fill
from poirotd.devtools.clinic import CLINIC, CLINIC_AGENTS, CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import session
from poirotd.investigations.service import MAX_CORRECTIONS
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
from poirotd.protocol.reputation import (
    accuracy,
    betas_in_use,
    derived_betas,
    reassess,
    updated_beta,
)
from poirotd.store import AlreadyConfirmedError, SqliteStore, UnknownInvestigationError
from poirotd.store.audit import export_investigation, verify
from poirotd.store.chain import encode_record
from poirotd.store.schema import SCHEMA_VERSION
from tests.support.cli import poirotd
from tests.support.daemon import rejected

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


def _confirmed(
    investigation_id: str,
    votes: Sequence[Vote],
    *outcomes: tuple[str, datetime],
) -> Investigation:
    """A succeeded investigation whose outcomes (region, when) were confirmed in turn, each
    correcting the one before."""
    confirmed = [_outcome(region).model_copy(update={"at": at}) for region, at in outcomes]
    return _succeeded(investigation_id).model_copy(
        update={
            "votes": tuple(votes),
            "confirmed": confirmed[-1],
            "superseded": tuple(confirmed[:-1]),
        }
    )


def _step_by_step(
    spec: SystemSpec, confirmations: Sequence[tuple[Sequence[Vote], Sequence[int]]]
) -> dict[str, tuple[float, int]]:
    """The arithmetic each confirmation made before corrections existed: every valid voter's
    stored β (or `initial`) moved one step, in the order the outcomes were confirmed."""
    stored: dict[str, AgentReputation] = {}
    for votes, truth in confirmations:
        current = betas_in_use(spec, stored)
        for vote in votes:
            if vote.abstained or vote.agent_id not in current:
                continue
            before = stored.get(vote.agent_id)
            stored[vote.agent_id] = _reputation(
                vote.agent_id,
                updated_beta(current[vote.agent_id], accuracy(vote.location, truth), RATE),
                confirmations=(before.confirmations if before else 0) + 1,
            )
    return {agent: (r.beta, r.confirmations) for agent, r in stored.items()}


def _random_votes(rng: random.Random) -> tuple[Vote, ...]:
    votes = []
    for agent in (*CLINIC_AGENTS, "retired_agent"):
        if rng.random() < 0.2:
            votes.append(Vote(agent_id=agent, abstention_reason="vote: no valid answer"))
        else:
            votes.append(
                Vote(agent_id=agent, location=tuple(rng.randint(0, 1) for _ in CLINIC_REGIONS))
            )
    return tuple(votes)


def test_derived_betas_are_the_step_by_step_update_for_a_history_without_corrections() -> None:
    rng = random.Random(20)
    regions = [r.id for r in CLINIC_REGIONS]
    history = [
        _confirmed(f"i{n}", _random_votes(rng), (rng.choice(regions), AT + timedelta(minutes=n)))
        for n in range(60)
    ]
    expected = _step_by_step(
        REPUTED, [(inv.votes, inv.confirmed.decision) for inv in history if inv.confirmed]
    )
    rng.shuffle(history)  # the store reads them in no particular order
    assert derived_betas(REPUTED, history) == expected  # exactly: the same float operations


def test_a_correction_takes_the_place_of_the_outcome_it_replaced() -> None:
    later = AT + timedelta(days=1)
    corrected = [
        _confirmed("i1", VOTES, ("exo", AT), ("chief", later), ("doctor", later)),
        _confirmed("i2", VOTES[1:], ("chief", AT + timedelta(hours=1))),
    ]
    only_the_right_ones = [
        _confirmed("i1", VOTES, ("doctor", AT)),
        _confirmed("i2", VOTES[1:], ("chief", AT + timedelta(hours=1))),
    ]
    derived = derived_betas(REPUTED, corrected)
    assert derived == derived_betas(REPUTED, only_the_right_ones)
    # i1 moved doctor up and chief down first, then i2 moved chief up.
    assert derived == {
        "doctor": (updated_beta(0.25, 1.0, RATE), 1),
        "chief": (updated_beta(updated_beta(0.25, 0.0, RATE), 1.0, RATE), 2),
    }


def test_reassess_stores_the_derived_betas_that_changed() -> None:
    history = [_confirmed("i2", VOTES, ("doctor", AT))]
    stored = {"chief": _reputation("chief", 0.2), "retired_agent": _reputation("retired", 0.4)}
    updated = reassess(REPUTED, history, stored, investigation_id="i2", at=AT)
    # chief's β and count are already what the history gives; physio abstained.
    assert [(r.agent_id, r.beta, r.confirmations) for r in updated] == [("doctor", 0.3, 1)]
    assert all(r.investigation_id == "i2" and r.updated_at == AT for r in updated)
    assert reassess(CLINIC, history, stored, investigation_id="i2", at=AT) == []


def test_records_stored_before_corrections_keep_their_audited_form() -> None:
    plain = _confirmed("i1", VOTES, ("doctor", AT))
    assert "superseded" not in json.loads(encode_record(plain))
    corrected = _confirmed("i1", VOTES, ("exo", AT), ("doctor", AT))
    assert Investigation.model_validate_json(encode_record(corrected)) == corrected


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
        self, history: Sequence[Investigation], stored: dict[str, AgentReputation]
    ) -> list[AgentReputation]:
        self.calls += 1
        return reassess(
            REPUTED, history, stored, investigation_id=history[-1].investigation_id, at=AT
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
        # A second investigation's confirmation derives β from both: one more step each.
        await store.save_investigation(_succeeded("i2"))
        await store.confirm_outcome("i2", _outcome("doctor"), reassessor)
        reputations = await store.reputations("clinic")
        assert reputations["doctor"].beta == pytest.approx(0.3 + 0.2 * (0.5 - 0.3))
        assert reputations["doctor"].confirmations == 2
    finally:
        await store.close()


async def test_a_superseded_outcome_is_kept_and_beta_is_derived_from_its_correction(
    tmp_path: Path,
) -> None:
    db = tmp_path / "poirotd.db"
    store = await SqliteStore.open(db)
    try:
        await store.save_investigation(_succeeded())
        await store.confirm_outcome("i1", _outcome("chief"), Reassessor())
        record, changed = await store.confirm_outcome(
            "i1", _outcome("doctor"), Reassessor(), supersede=True
        )
        assert changed and record.confirmed == _outcome("doctor")
        assert record.superseded == (_outcome("chief"),)
        corrected = await store.reputations("clinic")
    finally:
        await store.close()

    only_right = await SqliteStore.open(tmp_path / "only_right.db")
    try:
        await only_right.save_investigation(_succeeded())
        await only_right.confirm_outcome("i1", _outcome("doctor"), Reassessor())
        expected = await only_right.reputations("clinic")
    finally:
        await only_right.close()
    assert {a: (r.beta, r.confirmations) for a, r in corrected.items()} == {
        a: (r.beta, r.confirmations) for a, r in expected.items()
    }
    assert verify(db).ok


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
    assert "supersede" in (refused.value.details() or "")
    assert rejected(daemon, rpc, "already_confirmed") == 1

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.confirm(done.investigation_id, ["doctor"], note="  ", supersede=True)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected(daemon, rpc, "missing_note") == 1

    for n in range(MAX_CORRECTIONS):
        await client.confirm(
            done.investigation_id, ["doctor" if n % 2 == 0 else "exo"], "flip", supersede=True
        )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.confirm(done.investigation_id, ["chief"], "once more", supersede=True)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rejected(daemon, rpc, "too_many_corrections") == 1
    assert len((await client.get(done.investigation_id)).superseded) == MAX_CORRECTIONS


async def test_an_operator_supersedes_a_wrong_outcome_and_beta_is_as_if_only_the_right_one(
    daemon: Daemon, client: PoirotClient
) -> None:
    """Issue 20: an anonymous caller confirmed a wrong cause, every β moved, and the operator's
    correction was refused. Now the correction supersedes it, both stay in the audit chain, and
    every β is what confirming only the right cause would have given."""
    await client.send(session(6))
    earlier, wrong = await investigate(client), await investigate(client)
    await client.confirm(earlier.investigation_id, ["doctor"], note="clinician")
    mistaken = await client.confirm(wrong.investigation_id, ["exo"], note="anonymous")
    assert betas_of(mistaken)["doctor"] < updated_beta(0.25, 1.0, RATE)  # moved down

    corrected = await client.confirm(
        wrong.investigation_id, ["doctor"], note="ward lead: the sensor was fine", supersede=True
    )
    assert corrected.newly_confirmed
    assert list(corrected.superseded.region_ids) == ["exo"]
    assert corrected.superseded.note == "anonymous"
    # Every agent but physio voted doctor both times; physio voted "no anomaly" (accuracy 0).
    right = updated_beta(updated_beta(0.25, 1.0, RATE), 1.0, RATE)
    wrong_twice = updated_beta(updated_beta(0.25, 0.0, RATE), 0.0, RATE)
    assert betas_of(corrected) == {"doctor": right, "chief": right, "physio": wrong_twice}
    assert {b.agent_id: b.confirmations for b in corrected.betas} == dict.fromkeys(CLINIC_AGENTS, 2)
    assert betas_of(await client.reputation()) == betas_of(corrected)

    record = await client.get(wrong.investigation_id)
    assert list(record.confirmed.region_ids) == ["doctor"]
    assert [list(o.region_ids) for o in record.superseded] == [["exo"]]
    assert record.superseded[0].note == "anonymous"

    # Both outcomes are in the chain, and the chain and every row still verify.
    report = verify(daemon.settings.db_path)
    assert report.ok, report.summary()
    exported = export_investigation(daemon.settings.db_path, wrong.investigation_id)
    outcomes = [
        v["record"]["confirmed"]["region_ids"]
        for v in (*exported["earlier_versions"], exported["investigation"])
        if v["record"].get("confirmed")
    ]
    assert outcomes == [["exo"], ["doctor"]]
    moved = [(u["record"]["agent_id"], u["record"]["beta"]) for u in exported["reputation_updates"]]
    # The wrong outcome moved doctor and chief down and physio (no anomaly) too; the correction
    # moved doctor and chief, and left physio where the wrong outcome had also put it.
    down = updated_beta(updated_beta(0.25, 1.0, RATE), 0.0, RATE)
    assert moved == [
        ("doctor", down),
        ("chief", down),
        ("physio", wrong_twice),
        ("doctor", right),
        ("chief", right),
    ]


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
    corrected = await asyncio.to_thread(
        poirotd,
        "confirm",
        done.investigation_id,
        "exo",
        "--supersede",
        "--note",
        "recalibrated",
        "--target",
        target,
    )
    assert corrected.returncode == 0, corrected.stderr
    assert f"{done.investigation_id}: exo (confirmed, superseding doctor)" in corrected.stdout
    undone = await asyncio.to_thread(
        poirotd,
        "confirm",
        done.investigation_id,
        "doctor",
        "--supersede",
        "--note",
        "ward",
        "--target",
        target,
    )
    assert undone.returncode == 0, undone.stderr

    shown = await asyncio.to_thread(poirotd, "reputation", "--target", target)
    assert shown.returncode == 0, shown.stderr
    assert "reputation is off" not in shown.stdout
    assert re.search(r"doctor\W+0\.300\W+1\W+" + done.investigation_id, shown.stdout)
    assert (await client.get(done.investigation_id)).confirmed.note == "ward"
