"""The five phases end to end on a 3-agent spec, against a scripted backend (orchestration only)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from poirotd.llm.base import ChatMessage, LLMError
from poirotd.model import Phase, Vote
from poirotd.protocol import prompts
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import (
    AttributionReady,
    ExchangeDone,
    PhaseBegun,
    PhaseEnded,
    ReportFiled,
    VoteCast,
)
from poirotd.protocol.poirot.interrogation import closing_request, one_more_round
from poirotd.protocol.poirot.prompts import EMPTY_ANSWER_RETRY
from poirotd.protocol.poirot.schemas import (
    hazard_space_format,
    report_format,
    turn_format,
    vote_format,
)
from poirotd.protocol.prompts import Incident
from poirotd.protocol.spotlight import MARK
from tests.support.protocol import (
    AGENTS,
    EXO,
    SESSION,
    MemoryCache,
    World,
    always_ask,
    ask_once_then_vote,
    default_report,
    investigate,
    kind_of,
    make_spec,
    spotlight_of,
    vote_json,
    who,
)

# ------------------------------------------------------------------ the full run

POIROT_PHASES = (
    Phase.HAZARD_SPACE,
    Phase.SELF_ASSESSMENT,
    Phase.INTERROGATION,
    Phase.VOTING,
    Phase.AGGREGATION,
)


async def test_full_five_phase_run() -> None:
    world = World()
    outcome = await investigate(world)

    assert outcome.hazard_space.source == "pinned"
    assert outcome.attribution.top == (EXO,)
    assert outcome.attribution.decision == (0, 0, 0, 1)
    # Every agent votes the exoskeleton: d_H = 2 of N = 4, so w = 0.25 + 0.5 * (1 - 2/4) = 0.5.
    assert [v.weight for v in outcome.votes] == pytest.approx([0.5, 0.5, 0.5])
    assert outcome.attribution.scores == pytest.approx((0.0, 0.0, 0.0, 1.5))
    assert outcome.reports["doctor"] is not None
    assert outcome.reports["doctor"]["suspected_agents"] == ["physio"]
    assert [t.phase for t in outcome.phases] == list(POIROT_PHASES)

    # 3 reports + per agent: one ask turn, the peer's answer, one vote turn.
    assert len(world.backend.calls) == 3 + 3 * 3
    assert outcome.usage.calls == len(world.backend.calls) == len(world.of(ExchangeDone))
    assert outcome.usage.prompt_tokens == sum(
        e.exchange.prompt_tokens for e in world.of(ExchangeDone)
    )
    assert len(world.of(ReportFiled)) == 3
    assert len(world.of(VoteCast)) == 3
    assert len(world.of(AttributionReady)) == 1

    kinds = [type(e).__name__ for e in world.events]
    assert kinds.index("VoteCast") > world.events.index(PhaseBegun(phase=Phase.VOTING))
    ended = [e.phase for e in world.of(PhaseEnded)]
    assert sorted(ended) == sorted(POIROT_PHASES) and ended.count(Phase.INTERROGATION) == 1
    assert world.events[0] == PhaseBegun(phase=Phase.HAZARD_SPACE)
    last_phase = world.events[-2]
    assert isinstance(last_phase, PhaseEnded) and last_phase.phase is Phase.AGGREGATION
    assert isinstance(world.events[-1], AttributionReady), "announced once the method is done"


async def test_phase_three_transcript_carries_question_and_answer() -> None:
    world = World()
    await investigate(world)
    second_turn = world.calls("turn", "doctor")[-1]
    assert second_turn[-2] == ChatMessage(
        role="assistant",
        content='{"action":"ask","peer":"talk_to_chief","question":"What did you see?"}',
    )
    assert second_turn[-1].content.startswith("Answer from Chief of Rehabilitation (id: chief)")
    opening = second_turn[-3].content
    assert "physio: flagged by 2 agent(s): doctor, chief" in opening
    assert "location[3] = 1 -> Exoskeleton (id: exo)" in opening
    answer_request = world.calls("answer", "chief")[0]
    assert "Diagnosis Doctor (id: doctor) asks you" in answer_request[-1].content


# ------------------------------------------------------------------ limits, retries, repairs


async def test_forced_vote_after_m_turns() -> None:
    world = World(turn=always_ask)
    outcome = await investigate(world, make_spec(max_invocations=2))

    for agent in ("doctor", "chief", "physio"):
        assert len(world.calls("turn", agent)) == 2
        votes = world.calls("vote", agent)
        assert len(votes) == 1
        assert "used all 2 replies" in votes[0][-1].content
    assert len(world.calls("answer")) == 3 * 2  # answers do not count toward the asker's M
    assert all(v.forced and not v.abstained for v in outcome.votes)
    assert {v.forced_by for v in outcome.votes} == {"invocation_limit"}


async def test_a_consultation_that_fills_the_context_ends_early_in_a_forced_vote() -> None:
    spec = make_spec(max_invocations=8)
    roomy = World(turn=always_ask)
    space = (await investigate(roomy, spec)).hazard_space
    first_turns = [roomy.calls("turn", a)[0] for a in ("doctor", "chief", "physio")]
    # Room for the first turn's request, the vote request and one full round, and about two
    # rounds more (one asked question and its answer add ~45 tokens in this world).
    start = max(roomy.backend.count_tokens(closing_request(space, t)) for t in first_turns)
    world = World(turn=always_ask)
    world.backend.context_tokens = start + one_more_round(spec.protocol, spotlight_of(roomy)) + 100

    outcome = await investigate(world, spec)

    for agent in ("doctor", "chief", "physio"):
        assert 1 <= len(world.calls("turn", agent)) < 8
        (vote,) = world.calls("vote", agent)
        assert "filled the room this step has for it" in vote[-1].content
    assert {v.forced_by for v in outcome.votes} == {"context_full"}
    assert all(v.forced and not v.abstained for v in outcome.votes)
    for call in world.backend.calls:
        tokens = world.backend.count_tokens(call.messages) + call.max_tokens
        assert tokens <= world.backend.context_tokens


def test_a_stored_forced_vote_from_before_forced_by_was_forced_by_the_limit() -> None:
    old = Vote.model_validate_json('{"agent_id": "doctor", "location": [1, 0], "forced": true}')
    assert old.forced_by == "invocation_limit"
    assert Vote(agent_id="doctor", forced_by="context_full").forced
    assert not Vote(agent_id="doctor").forced


async def test_empty_answers_are_retried_three_times() -> None:
    world = World(answer=lambda agent, messages: "")
    await investigate(world, make_spec(max_invocations=1))

    answers = world.calls("answer", "chief")  # doctor asks chief once
    assert len(answers) == 1 + 3
    assert all(a[-1].content == EMPTY_ANSWER_RETRY for a in answers[1:])
    assert answers[1][-2] == ChatMessage(role="assistant", content="")
    forced = world.calls("vote", "doctor")[0]
    assert "Chief of Rehabilitation (id: chief) gave no answer" in forced[-2].content


async def test_an_answer_on_the_last_retry_is_delivered() -> None:
    tries: Counter[str] = Counter()

    def answer(agent: str, messages: Sequence[ChatMessage]) -> str:
        tries[agent] += 1
        return "seen it" if tries[agent] % 4 == 0 else "  "

    world = World(answer=answer)
    await investigate(world, make_spec(max_invocations=1))
    forced = world.calls("vote", "doctor")[0]
    quoted = spotlight_of(world).quote("seen it")
    assert forced[-2].content == f"Answer from Chief of Rehabilitation (id: chief):\n{quoted}"


async def test_invalid_vote_is_repaired_then_abstains_never_zeros() -> None:
    def vote(agent: str, messages: Sequence[ChatMessage]) -> str:
        return vote_json((0, 1)) if agent == "chief" else vote_json()

    world = World(turn=always_ask, vote=vote)
    outcome = await investigate(world, make_spec(max_invocations=1, invalid_json_retries=2))

    attempts = world.calls("vote", "chief")
    assert len(attempts) == 1 + 2
    repair = attempts[1][-1].content
    assert "rejected" in repair and "exactly 4 entries" in repair
    assert attempts[1][-2] == ChatMessage(role="assistant", content=vote_json((0, 1)))
    assert attempts[2][:-2] == attempts[1][:-2] == attempts[0]  # repairs do not pile up
    chief = next(v for v in outcome.votes if v.agent_id == "chief")
    assert chief.abstained and "exactly 4 entries" in chief.abstention_reason
    assert chief.location == () and chief.weight == 0.0
    assert outcome.attribution.scores == pytest.approx((0.0, 0.0, 0.0, 1.0))


async def test_a_repaired_vote_counts() -> None:
    tries: Counter[str] = Counter()

    def vote(agent: str, messages: Sequence[ChatMessage]) -> str:
        tries[agent] += 1
        return "I think the exoskeleton" if tries[agent] == 1 else vote_json()

    world = World(turn=always_ask, vote=vote)
    outcome = await investigate(world, make_spec(max_invocations=1))
    assert all(not v.abstained for v in outcome.votes)
    assert len(world.calls("vote")) == 3 * 2
    purposes = Counter(e.exchange.purpose for e in world.of(ExchangeDone))
    assert purposes["repair"] == 3


async def test_all_zero_vote_is_a_valid_no_anomaly_vote() -> None:
    world = World(turn=lambda agent, messages: vote_json((0, 0, 0, 0), action=True))
    outcome = await investigate(world)
    assert not any(v.abstained for v in outcome.votes)
    assert outcome.attribution.top == () and outcome.attribution.decision == (0, 0, 0, 0)


async def test_llm_errors_count_as_failed_attempts() -> None:
    def report(agent: str, messages: Sequence[ChatMessage]) -> str:
        if agent == "doctor":
            raise LLMError("server down", reason="unavailable")
        return default_report(agent, messages)

    world = World(report=report)
    outcome = await investigate(world, make_spec(invalid_json_retries=2))

    assert len(world.calls("report", "doctor")) == 3
    assert outcome.reports["doctor"] is None
    filed = next(e for e in world.of(ReportFiled) if e.agent_id == "doctor")
    assert "unavailable" in filed.error
    failed = [e.exchange for e in world.of(ExchangeDone) if e.exchange.error]
    assert len(failed) == 3 and all(x.purpose == "report" for x in failed)
    opening = world.calls("turn", "chief")[0][-1].content
    assert "-- doctor (Diagnosis Doctor) --\n(no valid report)" in opening


async def test_context_exceeded_is_not_retried() -> None:
    def report(agent: str, messages: Sequence[ChatMessage]) -> str:
        if agent == "doctor":
            raise LLMError("prompt 9000 + 320 > 8192", reason="context_exceeded")
        return default_report(agent, messages)

    world = World(report=report)
    outcome = await investigate(world, make_spec(invalid_json_retries=2))

    assert len(world.calls("report", "doctor")) == 1
    filed = next(e for e in world.of(ReportFiled) if e.agent_id == "doctor")
    assert "context_exceeded" in filed.error
    assert outcome.reports["doctor"] is None


async def test_every_agent_abstaining_is_a_protocol_error() -> None:
    world = World(turn=lambda agent, messages: "no idea")
    with pytest.raises(ProtocolError, match="no agent cast a valid vote: doctor: turn 1"):
        await investigate(world, make_spec(invalid_json_retries=0))
    assert not world.of(AttributionReady)


# ------------------------------------------------------------------ Phase I


async def test_pinned_hazard_space_makes_no_call() -> None:
    world = World()
    await investigate(world)
    assert world.calls("hazard_space") == []


async def test_cache_hit_makes_no_second_call() -> None:
    world, cache, spec = World(), MemoryCache(), make_spec(pinned=False)
    first = await investigate(world, spec, cache)
    second = await investigate(world, spec, cache)

    assert len(world.calls("hazard_space")) == 1
    assert first.hazard_space == second.hazard_space
    assert first.hazard_space.source == "llm"
    assert first.hazard_space.version == spec.description_version()
    request = world.calls("hazard_space")[0]
    assert 'in this order, with these ids and type "agent"' in request[1].content


async def test_failed_hazard_space_falls_back_to_the_declared_regions_cached() -> None:
    world = World(hazard_space=lambda agent, messages: '{"system_name": "x"}')
    spec, cache = make_spec(pinned=False, invalid_json_retries=1), MemoryCache()
    outcome = await investigate(world, spec, cache)
    assert len(world.calls("hazard_space")) == 2
    assert outcome.hazard_space.source == "spec"
    assert [r.id for r in outcome.hazard_space.regions] == [*spec.region_ids]
    again = await investigate(world, spec, cache)
    assert len(world.calls("hazard_space")) == 2, "the fallback is cached like any other space"
    assert again.hazard_space == outcome.hazard_space


async def test_failed_hazard_space_without_components_falls_back_to_the_agents() -> None:
    world = World(
        hazard_space=lambda agent, messages: '{"system_name": "x"}',
        vote=lambda agent, messages: vote_json((1, 0, 0)),
        turn=lambda agent, messages: vote_json((1, 0, 0), action=True),
    )
    spec = make_spec(pinned=False, invalid_json_retries=0)
    spec = spec.model_copy(update={"components": ()})
    outcome = await investigate(world, spec)
    assert [r.id for r in outcome.hazard_space.regions] == ["doctor", "chief", "physio"]


def test_hazard_space_schema_fixes_every_declared_id() -> None:
    schema = hazard_space_format(make_spec(pinned=False)).schema
    assert schema is not None
    props = schema["properties"]
    assert [i["properties"]["id"] for i in props["agent_regions"]["prefixItems"]] == [
        {"const": "doctor"},
        {"const": "chief"},
        {"const": "physio"},
    ]
    assert props["component_regions"]["prefixItems"][0]["properties"]["id"] == {"const": "exo"}
    sub = props["sub_regions"]
    assert sub["items"]["properties"]["parent"] == {"enum": ["exo"]}
    assert sub["maxItems"] == 16


ALLOWED_KEYS = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "minLength", "maxLength", "pattern",
}  # fmt: skip


def _walk(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [n for s in schema for n in _walk(s)]
    if not isinstance(schema, dict):
        return []
    nodes = [schema]
    for key in ("items", "anyOf", "prefixItems"):
        nodes += _walk(schema.get(key))
    for sub in schema.get("properties", {}).values():
        nodes += _walk(sub)
    return nodes


@pytest.mark.parametrize(
    "schema",
    [
        hazard_space_format(make_spec(pinned=False)).schema,
        report_format(["a", "b"]).schema,
        turn_format(["b"], 4, {0}).schema,
        vote_format(4, {0}).schema,
    ],
)
def test_schemas_stay_in_the_grammar_subset(schema: dict[str, Any]) -> None:
    for node in _walk(schema):
        assert set(node) <= ALLOWED_KEYS, node
        if node.get("type") == "string":
            assert "maxLength" in node or "pattern" in node, node
        if node.get("type") == "object":
            assert node["additionalProperties"] is False


# ------------------------------------------------------------------ layout and concurrency


async def test_every_request_of_an_agent_starts_with_its_prefix() -> None:
    world = World()
    await investigate(world)

    spotlight = spotlight_of(world)
    for agent in AGENTS:
        prefix = prompts.agent_prefix(agent, SESSION, spotlight=spotlight)
        turns = prompts.session_turns(agent.id, SESSION, spotlight)
        assert len(prefix) == 1 + len(turns)
        requests = [c.messages for c in world.backend.calls if who(c.messages) == agent.id]
        assert {kind_of(c.schema) for c in world.backend.calls if who(c.messages) == agent.id} == {
            "report", "turn", "answer",
        }  # fmt: skip
        for request in requests:
            assert list(request[: len(prefix)]) == prefix
            assert len(request) > len(prefix)


async def test_the_incident_closes_every_agent_prefix() -> None:
    world = World()
    incident = Incident("fall alarm", telemetry="exo:\n knee_angle_deg n=3 max=270")
    await investigate(world, incident=incident)

    spotlight = spotlight_of(world)
    quoted = prompts.incident_section(incident, spotlight)
    o, c = spotlight.opening, spotlight.closing
    assert quoted == (
        f"Reported:\n{o}\n{MARK} fall alarm\n{c}\nHardware telemetry (latest samples):\n"
        f"{o}\n{MARK} exo:\n{MARK}  knee_angle_deg n=3 max=270\n{c}"
    )
    for agent in AGENTS:
        prefix = prompts.agent_prefix(agent, SESSION, incident, spotlight)
        assert prefix[-1].role == "user"
        assert prefix[-1].content.endswith(f"# The incident under review\n{quoted}")
        requests = [c.messages for c in world.backend.calls if who(c.messages) == agent.id]
        assert requests and all(list(r[: len(prefix)]) == prefix for r in requests)


def test_session_log_is_filtered_and_typed_from_the_agent_view() -> None:
    doctor = prompts.session_turns("doctor", SESSION)
    assert [t.role for t in doctor] == ["user", "assistant", "user", "assistant", "user"]
    assert doctor[0].content == "[#0 human:operator → doctor]\nAssess the patient."
    assert doctor[1].content == "[#1 doctor → all]\n(called tools: patient_retriever_tool)"
    assert doctor[2].content.startswith("[#2 tool:patient_retriever_tool → doctor]")
    assert "Plan 2" not in "".join(t.content for t in doctor)  # chief → physio is private
    # Broadcasts (#6 from the exoskeleton, #7 from physio) merge into one user turn.
    assert doctor[4].content == (
        "[#6 system:exo → all]\nknee angle 270 deg\n\n"
        "[#7 physio → all]\nThe knee angle is impossible."
    )
    physio = prompts.session_turns("physio", SESSION)
    assert [t.role for t in physio] == ["user", "assistant", "user", "assistant"]
    assert physio[-1] == ChatMessage(
        role="assistant", content="[#7 physio → all]\nThe knee angle is impossible."
    )


async def test_agents_run_concurrently() -> None:
    in_flight, peak = 0, 0
    all_reporting = asyncio.Event()
    reporting = 0

    async def track(reply: str) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.005)
        in_flight -= 1
        return reply

    async def report(agent: str, messages: Sequence[ChatMessage]) -> str:
        nonlocal reporting
        reporting += 1
        if reporting == len(AGENTS):
            all_reporting.set()
        await asyncio.wait_for(all_reporting.wait(), timeout=2)  # sequential agents would hang
        return default_report(agent, messages)

    world = World(
        report=report,
        turn=lambda agent, messages: track(ask_once_then_vote(agent, messages)),
    )
    await investigate(world)
    assert peak > 1


async def test_cancellation_propagates_promptly() -> None:
    started, cancelled = 0, 0
    all_started, never = asyncio.Event(), asyncio.Event()

    async def hang(agent: str, messages: Sequence[ChatMessage]) -> str:
        nonlocal started, cancelled
        started += 1
        if started == len(AGENTS):
            all_started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise
        return ""

    world = World(report=hang)
    task = asyncio.create_task(investigate(world))
    await asyncio.wait_for(all_started.wait(), timeout=2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1)
    assert cancelled == len(AGENTS)


# ------------------------------------------------------------------ "when"


async def test_votes_say_when_and_the_attribution_weighs_it() -> None:
    steps = {"doctor": 6, "chief": 2, "physio": 7}  # #2 is the doctor's private tool output

    def turn(agent: str, messages: Sequence[ChatMessage]) -> str:
        vote = json.loads(vote_json(action=True))
        return json.dumps(vote | {"step": steps[agent]})

    world = World(turn=turn)
    outcome = await investigate(world)

    assert {v.agent_id: v.step for v in outcome.votes} == {"doctor": 6, "chief": None, "physio": 7}
    assert all(not v.abstained for v in outcome.votes)  # a bad step costs the vote nothing
    assert outcome.attribution.step == 6  # equal weights: the earliest of the tied steps
