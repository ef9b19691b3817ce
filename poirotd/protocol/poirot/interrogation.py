"""Phases III and IV: every agent consults its peers, then votes privately; all agents at once.

Each agent's Phase III transcript is its prefix, the opening turn, then its own actions
(assistant turns) and the answers it got; it only grows, so each request extends the previous
one and the server's prefix cache covers all but the newest turn. A turn asks a peer
(`talk_to_<id>`) or votes, either as one JSON action object (answered by a user turn) or, with
`llm.peer_questions: tool_calls`, as a native tool call (answered by a tool turn carrying the
call's id); both decode to the same AskAction / VoteAction. A peer answers on its own prefix
plus the question and never votes there; answers do not count toward the asker's
M = `max_invocations` turns, and repairs of an invalid turn do not either. After M turns
without a vote comes the forced vote; it comes sooner, and says why, when the transcript has no
room left for another question, its answer and the vote (the context budget: a growing
consultation is never truncated, it ends). An agent with no valid answer abstains with the
reason: never an all-zero vote.

Phases III and IV overlap because agents leave consultation at different moments: voting
begins when the first agent leaves, interrogation ends when the last one does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

import structlog

from poirotd.config.spec import ProtocolSpec, SystemSpec
from poirotd.llm.base import ChatMessage, replies_to
from poirotd.model import ForcedBy, HazardSpace, Phase, Vote
from poirotd.protocol.aggregation import weigh
from poirotd.protocol.errors import AnswerFailedError
from poirotd.protocol.events import VoteCast
from poirotd.protocol.poirot import prompts
from poirotd.protocol.poirot.peer_tools import tools_text, turn_tools, uses_tools
from poirotd.protocol.poirot.schemas import (
    FREE_TEXT,
    AskAction,
    SelfReport,
    VoteAction,
    turn_format,
    vote_format,
)
from poirotd.protocol.run import CallSite, RunContext, concurrently
from poirotd.protocol.spotlight import Spotlight

log = structlog.get_logger(__name__)

# Room kept for the words around a peer's answer in the asker's transcript (the peer's name and
# id, or why it gave no answer, and the quote's bounds), on top of the answer's own quoted size.
ANSWER_FRAME_TOKENS = 64


async def interrogate(
    spec: SystemSpec,
    space: HazardSpace,
    prefixes: Mapping[str, Sequence[ChatMessage]],
    reports: Mapping[str, SelfReport | None],
    run: RunContext,
    betas: Mapping[str, float],
    seen: Mapping[str, Collection[int]],
    spotlight: Spotlight,
) -> list[Vote]:
    """Every agent's vote or abstention, weighted with its β, in spec order; each is emitted
    as it lands. `seen` holds the session indices in each agent's view (what its step may name);
    the reports, questions and answers agents pass each other are quoted under `spotlight`.
    """
    interrogation = _Interrogation(spec, space, prefixes, reports, run, betas, seen, spotlight)
    await run.begin(Phase.INTERROGATION)
    votes = await concurrently(interrogation.vote_of(a) for a in spec.agent_ids)
    await run.end(Phase.VOTING)
    return votes


class _Pending(NamedTuple):
    """A transcript that ends with a vote request."""

    transcript: list[ChatMessage]
    forced_by: ForcedBy


class _Interrogation:
    def __init__(
        self,
        spec: SystemSpec,
        space: HazardSpace,
        prefixes: Mapping[str, Sequence[ChatMessage]],
        reports: Mapping[str, SelfReport | None],
        run: RunContext,
        betas: Mapping[str, float],
        seen: Mapping[str, Collection[int]],
        spotlight: Spotlight,
    ) -> None:
        self._spec, self._space, self._prefixes, self._run = spec, space, prefixes, run
        self._reports = reports
        self._betas = betas
        self._seen = seen
        self._spotlight = spotlight
        self._limits = spec.protocol
        self._left = 0
        self._handover = asyncio.Lock()

    async def vote_of(self, agent_id: str) -> Vote:
        outcome = await self._consult(agent_id)
        await self._leave_consultation()
        if isinstance(outcome, _Pending):
            outcome = await self._vote(agent_id, outcome)
        vote = weigh(self._space, outcome, self._betas[agent_id])
        await self._run.emit(VoteCast(vote=vote))
        return vote

    async def _consult(self, agent_id: str) -> Vote | _Pending:
        """Up to M turns; returns the vote cast in a turn, an abstention, or a vote request."""
        opening = prompts.interrogation_opening(
            self._spec, self._space, self._reports, agent_id, self._spotlight
        )
        transcript = [*self._prefixes[agent_id], _user(opening)]
        peers = [a for a in self._spec.agent_ids if a != agent_id]
        if not peers:  # the opening already ends with the final-vote request
            return _Pending(transcript, forced_by="")
        offered = tools_text(self._spec, agent_id, self._space.size, self._seen[agent_id])
        for n in range(1, self._limits.max_invocations + 1):
            if not self._room_for_another_question(transcript, offered):
                log.warning(
                    "consultation ended early: the context window has no room for another turn",
                    agent_id=agent_id,
                    turns=n - 1,
                    context_tokens=self._run.context_tokens,
                )
                return _Pending(closing_request(self._space, transcript), "context_full")
            try:
                action, asked = await self._turn(agent_id, peers, transcript)
            except AnswerFailedError as exc:
                return Vote(agent_id=agent_id, abstention_reason=f"turn {n}: {exc}")
            if isinstance(action, VoteAction):
                return action.as_vote(agent_id)
            answer = await self._answer(action.peer_id, agent_id, action.question)
            transcript += [asked, *replies_to(asked, answer)]
        vote_now = prompts.forced_vote(self._space, self._limits.max_invocations)
        return _Pending([*transcript, _user(vote_now)], forced_by="invocation_limit")

    def _room_for_another_question(self, transcript: Sequence[ChatMessage], offered: str) -> bool:
        """`offered`: the tool definitions the agent's turns send (see `tools_text`)."""
        ending = closing_request(self._space, transcript, offered)
        needed = self._run.count_tokens(ending) + one_more_round(self._limits, self._spotlight)
        return needed <= self._run.context_tokens

    async def _turn(
        self, agent_id: str, peers: Sequence[str], transcript: Sequence[ChatMessage]
    ) -> tuple[AskAction | VoteAction, ChatMessage]:
        """One valid turn and the assistant turn that stands for it in the transcript."""
        site = CallSite(Phase.INTERROGATION, agent_id, "turn")
        size, steps = self._space.size, self._seen[agent_id]
        limits = self._limits
        if uses_tools(self._spec):
            called = await self._run.until_valid(
                site,
                transcript,
                turn_tools(peers, size, steps),
                max_tokens=limits.turn_max_tokens,
                retries=limits.invalid_json_retries,
                repair=prompts.invalid_tool_call,
            )
            return called.action, self._run.replayed(
                ChatMessage(role="assistant", content="", tool_calls=(called.call,))
            )
        action = await self._run.until_valid(
            site,
            transcript,
            turn_format(peers, size, steps),
            max_tokens=limits.turn_max_tokens,
            retries=limits.invalid_json_retries,
        )
        return action, self._run.replayed(
            ChatMessage(role="assistant", content=action.model_dump_json())
        )

    async def _answer(self, peer_id: str, asker_id: str, question: str) -> str:
        """The peer's answer on its own prefix, retried while empty; what the asker is shown."""
        peer = self._spec.agent(peer_id)
        ask = prompts.peer_question(self._spec.agent(asker_id), question, self._spotlight)
        try:
            answer = await self._run.until_valid(
                CallSite(Phase.INTERROGATION, peer_id, "answer"),
                [*self._prefixes[peer_id], _user(ask)],
                FREE_TEXT,
                max_tokens=self._limits.answer_max_tokens,
                retries=self._limits.empty_answer_retries,
                repair=lambda _reason: prompts.EMPTY_ANSWER_RETRY,
            )
        except AnswerFailedError as exc:
            return prompts.no_answer(peer, str(exc))
        return prompts.peer_answer(peer, answer, self._spotlight)

    async def _vote(self, agent_id: str, pending: _Pending) -> Vote:
        try:
            answer = await self._run.until_valid(
                CallSite(Phase.VOTING, agent_id, "vote"),
                pending.transcript,
                vote_format(self._space.size, self._seen[agent_id]),
                max_tokens=self._limits.turn_max_tokens,
                retries=self._limits.invalid_json_retries,
            )
        except AnswerFailedError as exc:
            return Vote(
                agent_id=agent_id, abstention_reason=f"vote: {exc}", forced_by=pending.forced_by
            )
        return answer.as_vote(agent_id, forced_by=pending.forced_by)

    async def _leave_consultation(self) -> None:
        """Serialised so phase events keep their order even when the event sink awaits."""
        async with self._handover:
            self._left += 1
            if self._left == 1:
                await self._run.begin(Phase.VOTING)
            if self._left == len(self._spec.agents):
                await self._run.end(Phase.INTERROGATION)


def closing_request(
    space: HazardSpace, transcript: Sequence[ChatMessage], offered: str = ""
) -> list[ChatMessage]:
    """The transcript as it would end if the agent were made to vote now, to count its tokens;
    with the tool definitions its turns offer (`offered`, see `tools_text`) counted beside it,
    which overestimates the vote request by them and errs high, as budgets should."""
    ending = [*transcript, _user(prompts.forced_vote(space, None))]
    return [*ending, ChatMessage(role="system", content=offered)] if offered else ending


def one_more_round(limits: ProtocolSpec, spotlight: Spotlight) -> int:
    """Tokens one more consultation round adds to a transcript, each part at its limit: the
    question, the peer's answer quoted in its frame, and then the vote."""
    answer = spotlight.quoted_tokens(limits.answer_max_tokens)
    return 2 * limits.turn_max_tokens + answer + ANSWER_FRAME_TOKENS


def _user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)
