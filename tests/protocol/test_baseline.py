"""The all-at-once baseline and the context budget in the engine, against a scripted backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from poirotd.llm.base import ChatMessage, Completion, LLMError, Tool
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, MessageKind, Phase
from poirotd.protocol.baseline import baseline_request
from poirotd.protocol.context_budget import shorten
from poirotd.protocol.engine import InvestigationEngine, ProtocolOutcome
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import ContextCutsMade, ExchangeDone, VoteCast
from poirotd.protocol.prompts import Incident
from tests.support.protocol import (
    EXO,
    SESSION,
    MemoryCache,
    World,
    agent_message,
    make_spec,
    spotlight_of,
    stepped_vote,
)


async def baseline(
    world: World, session: Sequence[AgentMessage] = SESSION, **protocol: Any
) -> ProtocolOutcome:
    engine = InvestigationEngine(make_spec(**protocol), world.backend, MemoryCache())
    return await engine.run(session, world.sink, incident=Incident("fall alarm"), method="baseline")


class WindowedBackend(ScriptedBackend):
    """Refuses a prompt over its window, as the embedded and HTTP backends do."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion:
        if self.count_tokens(messages) + max_tokens > self.context_tokens:
            raise LLMError("prompt over the window", reason="context_exceeded")
        return await super().complete(
            messages, schema=schema, tools=tools, max_tokens=max_tokens, temperature=temperature
        )


# ------------------------------------------------------------------ baseline


async def test_baseline_is_one_call_over_the_full_session() -> None:
    world = World(vote=lambda who, messages: stepped_vote(6))
    outcome = await baseline(world)

    (call,) = world.backend.calls
    request = "\n".join(m.content for m in call.messages)
    assert "Plan 2, please confirm." in request  # chief → physio: no agent's filtered view
    assert "You are the diagnosis doctor." in request and "fall alarm" in request
    assert [m.role for m in call.messages] == ["system", "user"]
    spotlight = spotlight_of(world)
    assert call.messages == tuple(
        baseline_request(
            make_spec(), outcome.hazard_space, SESSION, Incident("fall alarm"), spotlight
        )
    )

    (vote,) = outcome.votes
    assert (vote.agent_id, vote.weight, vote.step, vote.location) == ("", 1.0, 6, (0, 0, 0, 1))
    assert [e.vote for e in world.of(VoteCast)] == [vote]
    a = outcome.attribution
    assert (a.scores, a.top, a.tie, a.decision) == (
        (0.0, 0.0, 0.0, 1.0),
        (EXO,),
        False,
        (0, 0, 0, 1),
    )
    assert (a.rule, a.beta, a.step) == ("baseline", 0.0, 6)
    assert outcome.reports == {}
    assert [t.phase for t in outcome.phases] == [
        Phase.HAZARD_SPACE,
        Phase.VOTING,
        Phase.AGGREGATION,
    ]
    assert outcome.usage.calls == 1


async def test_baseline_invalid_answer_is_repaired() -> None:
    answers = iter(["I think it is the exoskeleton.", stepped_vote(None, (1, 0, 0, 1))])
    world = World(vote=lambda who, messages: next(answers))
    outcome = await baseline(world)

    first, second = world.backend.calls
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[-2] == ChatMessage(
        role="assistant", content="I think it is the exoskeleton."
    )
    assert second.messages[-1].content.startswith("Your previous reply was rejected")
    assert [x.exchange.purpose for x in world.of(ExchangeDone)] == ["vote", "repair"]
    assert outcome.attribution.top == (0, EXO) and outcome.attribution.tie
    assert outcome.attribution.step is None


async def test_baseline_without_a_valid_answer_abstains_and_the_run_fails() -> None:
    world = World(vote=lambda who, messages: stepped_vote(1, (1, 1)))
    with pytest.raises(ProtocolError, match="baseline: vote: no valid answer in 3 attempt"):
        await baseline(world, invalid_json_retries=2)
    assert len(world.backend.calls) == 3
    (cast,) = world.of(VoteCast)
    assert cast.vote.abstained and "exactly 4 entries" in cast.vote.abstention_reason


async def test_a_step_outside_the_view_is_dropped_not_the_vote() -> None:
    world = World(vote=lambda who, messages: stepped_vote(99))
    outcome = await baseline(world)
    assert outcome.votes[0].location == (0, 0, 0, 1) and outcome.votes[0].step is None


# ------------------------------------------------------------------ context budget in the engine

HUGE = "reading " * 4000  # 32,000 chars: about 8,000 scripted tokens


async def test_the_baseline_prompt_is_cut_to_fit_and_the_cuts_are_recorded() -> None:
    session = (*SESSION[:2], SESSION[2].model_copy(update={"content": HUGE}), *SESSION[3:])
    world = World(vote=lambda who, messages: stepped_vote(None))
    world.backend.context_tokens = 4096
    await baseline(world, session)

    ((cut,),) = [e.cuts for e in world.of(ContextCutsMade)]
    assert (cut.agent_id, cut.index, cut.action) == ("", 2, "shortened")
    assert (cut.chars_before, cut.chars_after) == (len(HUGE), len(shorten(HUGE)))
    assert "chars cut by poirotd" in world.backend.calls[0].messages[-1].content


async def test_each_agent_view_is_cut_for_its_longest_request() -> None:
    session = (*SESSION[:2], SESSION[2].model_copy(update={"content": HUGE}), *SESSION[3:])
    world = World()
    world.backend.context_tokens = 6144
    engine = InvestigationEngine(make_spec(), world.backend, MemoryCache())
    await engine.run(session, world.sink)

    # Only the doctor saw its own tool output (#2); nobody else's view needed a cut.
    ((cut,),) = [e.cuts for e in world.of(ContextCutsMade)]
    assert (cut.agent_id, cut.index, cut.action) == ("doctor", 2, "shortened")
    for request in world.calls("report", "doctor") + world.calls("turn", "doctor"):
        assert "chars cut by poirotd" in "".join(m.content for m in request)
        assert world.backend.count_tokens(request) < world.backend.context_tokens


async def test_a_prompt_that_cannot_fit_fails_with_context_exceeded() -> None:
    world = World()
    world.backend = WindowedBackend(world, context_tokens=600)
    session = [
        agent_message(i, MessageKind.AGENT, "doctor", "", content=HUGE[:2000]) for i in range(2)
    ]
    with pytest.raises(ProtocolError, match="context_exceeded"):
        await baseline(world, session)
    assert world.of(ContextCutsMade) == []  # left whole: nothing was cut in vain
