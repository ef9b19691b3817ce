"""An investigation's LLM-token budget (POIROTD_LLM_TOKEN_BUDGET), through a daemon over real
loopback gRPC. The LLM is scripted: what is under test is which calls the protocol makes, not
what a model answers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.devtools.ingest_requests import message, start
from poirotd.llm.base import ChatMessage
from tests.support.daemon import client_of, in_process_daemon, limit_rejections
from tests.support.protocol import EXO, World, always_ask, make_spec, vote_json

SPEC = make_spec()  # its hazard space is pinned: Phase II's reports are the first LLM calls
SESSION = [
    start("s1", system="cortex"),
    *(message(i, sender, content=f"turn {i}") for i, sender in enumerate(SPEC.agent_ids * 2)),
]
BUDGET_SPENT = "the investigation's LLM-token budget is spent"


def decisive_doctor(agent: str, messages: Sequence[ChatMessage]) -> str:
    """The doctor votes in its first turn; the others keep asking their peers."""
    return vote_json(action=True) if agent == "doctor" else always_ask(agent, messages)


class Run(NamedTuple):
    record: pb.Investigation
    calls: int
    budget_rejections: float


async def investigate(tmp_path: Path, **settings: Any) -> Run:
    world = World(turn=decisive_doctor)
    async with (
        in_process_daemon(tmp_path, SPEC, world.backend, **settings) as daemon,
        client_of(daemon) as client,
    ):
        await client.send(SESSION)
        queued = await client.trigger("s1", "the knee angle is impossible")
        async for _ in client.watch(queued.investigation_id):
            pass
        record = await client.investigations.Get(
            pb.GetInvestigationRequest(
                investigation_id=queued.investigation_id, include_exchanges=True
            )
        )
        return Run(record, len(world.backend.calls), limit_rejections(daemon, "llm_token_budget"))


def tokens(exchanges: Sequence[pb.Exchange]) -> int:
    return sum(x.prompt_tokens + x.completion_tokens for x in exchanges)


async def test_a_spent_budget_ends_the_investigation_degraded_with_the_votes_cast(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    unbounded = await investigate(tmp_path_factory.mktemp("unbounded"))
    reports = tokens([x for x in unbounded.record.exchanges if x.purpose == "report"])
    first_turns = [x for x in unbounded.record.exchanges if x.purpose == "turn"][:3]
    assert min(tokens([turn]) for turn in first_turns) > 100
    assert unbounded.record.degraded_reason == "" and unbounded.budget_rejections == 0

    # Room for the three reports and for starting the three first turns, none for what follows:
    # the doctor's first turn is its vote; the others' questions are never answered.
    run = await investigate(tmp_path_factory.mktemp("budgeted"), llm_token_budget=reports + 100)

    record = run.record
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert run.calls == 3 + 3, "no LLM call started once the budget was spent"
    assert [x.purpose for x in record.exchanges].count("turn") == 3
    votes = {v.agent_id: v for v in record.votes}
    assert votes["doctor"].abstention_reason == "" and list(votes["doctor"].location)[EXO] == 1
    for agent in ("chief", "physio"):
        assert BUDGET_SPENT in votes[agent].abstention_reason
    assert list(record.attribution.top) == [EXO], "the vote cast is aggregated"
    assert record.degraded_reason.startswith("the LLM-token budget ran out (")
    assert "POIROTD_LLM_TOKEN_BUDGET" in record.degraded_reason
    assert "chief abstained" in record.degraded_reason
    assert record.prompt_tokens + record.completion_tokens == tokens(record.exchanges)
    assert run.budget_rejections == 1


async def test_a_budget_spent_before_any_vote_fails_the_investigation_naming_it(
    tmp_path: Path,
) -> None:
    run = await investigate(tmp_path, llm_token_budget=1)

    assert run.record.state == pb.INVESTIGATION_STATE_FAILED
    assert run.calls == 3, "the reports started within the budget; nothing after them"
    assert run.record.error.startswith("no agent cast a valid vote")
    assert BUDGET_SPENT in run.record.error
    assert run.budget_rejections == 1
    # A failed run still says what it spent.
    assert run.record.llm_calls == 3
    assert run.record.prompt_tokens + run.record.completion_tokens == tokens(run.record.exchanges)
    assert run.record.prompt_tokens > 0
