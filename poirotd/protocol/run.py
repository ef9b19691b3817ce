"""Per-investigation plumbing every phase shares.

Every LLM call goes through `RunContext.complete` (audited, counted, held to the investigation's
token budget) and every answer with a format through `RunContext.until_valid`, the one "call,
validate, repair, retry" loop. One instance per investigation; nothing lives at module level.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog

from poirotd.llm.base import (
    MODEL_UNAVAILABLE,
    ChatMessage,
    Completion,
    LLMBackend,
    LLMError,
    Tool,
    ToolCall,
    replies_to,
)
from poirotd.llm.control_tokens import BUILT_IN, ControlTokens
from poirotd.model import AgentMessage, LLMExchange, LLMUsage, ModelTime, Phase, PhaseTiming
from poirotd.protocol import prompts
from poirotd.protocol.context_budget import fit_view
from poirotd.protocol.errors import AnswerFailedError, ModelUnavailableError
from poirotd.protocol.events import (
    ContextCutsMade,
    ExchangeDone,
    PhaseBegun,
    PhaseEnded,
    ProtocolEvent,
    TokenBudgetSpent,
)
from poirotd.protocol.model_time import CallTiming, model_time
from poirotd.protocol.poirot.peer_tools import ToolFormat
from poirotd.protocol.schemas import AnswerFormat, InvalidAnswerError

log = structlog.get_logger(__name__)

T = TypeVar("T")

EventSink = Callable[[ProtocolEvent], Awaitable[None]]
# The LLMError reason of a call not made because the investigation's token budget is spent.
BUDGET_SPENT = "token_budget"
# Failures the same request would meet again: retrying only spends time.
_NOT_RETRIED = frozenset({"context_exceeded", "bad_request", BUDGET_SPENT})
# The calls the code path running now last made (their RunContext seq): what its next call waits
# for. asyncio gives each task a copy, so concurrent branches extend their own; `concurrently`
# joins them. It is how the record learns which calls depend on which (model_time.py).
_last_calls: ContextVar[tuple[int, ...]] = ContextVar("poirotd_last_calls", default=())


@dataclass(frozen=True)
class CallSite:
    """Who makes a call, in which phase, for what (hazard_space | report | turn | answer | vote)."""

    phase: Phase
    agent_id: str
    purpose: str


class RunContext:
    def __init__(
        self,
        backend: LLMBackend,
        emit: EventSink,
        *,
        token_budget: int = 0,
        controls: ControlTokens = BUILT_IN,
    ) -> None:
        """`token_budget`: prompt + completion tokens the run may spend (0: no budget);
        `controls`: the backend's control spellings, broken in the model's own turns when a
        later request replays them (`replayed`)."""
        self._backend = backend
        self._controls = controls
        self.emit = emit
        self._usage = LLMUsage()
        self._token_budget = token_budget
        self.budget_spent = False
        self._started: dict[Phase, float] = {}
        self._seconds: dict[Phase, float] = {}
        self._begun = time.monotonic()
        self._calls: list[CallTiming] = []
        _last_calls.set(())

    # -------------------------------------------------------------- phases

    async def begin(self, phase: Phase) -> None:
        self._started[phase] = time.monotonic()
        await self.emit(PhaseBegun(phase=phase))

    async def end(self, phase: Phase) -> None:
        seconds = time.monotonic() - self._started[phase]
        # A phase run more than once (by several members of an ensemble) adds up.
        self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds
        await self.emit(PhaseEnded(phase=phase, seconds=seconds))

    @asynccontextmanager
    async def phase(self, phase: Phase) -> AsyncIterator[None]:
        """Time a phase; a phase that raises is not reported as ended."""
        await self.begin(phase)
        yield
        await self.end(phase)

    def timings(self) -> tuple[PhaseTiming, ...]:
        """Each phase's time, in the order the phases ended first."""
        return tuple(PhaseTiming(phase=p, seconds=s) for p, s in self._seconds.items())

    @property
    def usage(self) -> LLMUsage:
        return self._usage

    def model_time(self) -> ModelTime:
        """The model's busy time and critical path so far, against the run's wall time."""
        return model_time(self._calls, time.monotonic() - self._begun, self._backend.serves_at_once)

    # -------------------------------------------------------------- context budget

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return self._backend.count_tokens(messages)

    @property
    def context_tokens(self) -> int:
        """The model's context window: every request plus its answer must fit in it."""
        return self._backend.context_tokens

    async def fit(
        self,
        viewer: str,
        view: Sequence[AgentMessage],
        render: Callable[[Sequence[AgentMessage]], Sequence[ChatMessage]],
        *,
        reserve: int,
    ) -> tuple[AgentMessage, ...]:
        """`view` cut by the context-budget policy so that `render(view)` plus `reserve` tokens
        (what the viewer's longest request adds to it, and its answer) fit the backend's window.
        Cuts are logged and emitted; a view that cannot be made to fit comes back whole (its
        requests then fail with context_exceeded, which the protocol handles as it always has).
        """
        limit = self._backend.context_tokens
        fitted = fit_view(
            viewer, view, lambda v: self._backend.count_tokens(render(v)) + reserve, limit
        )
        if not fitted.fits:
            log.warning(
                "context budget: prompt does not fit even with every cut; left whole",
                viewer=viewer,
                tokens=fitted.tokens,
                limit=limit,
            )
        elif fitted.cuts:
            log.warning(
                "context budget: session view cut to fit the context window",
                viewer=viewer,
                shortened=sum(c.action == "shortened" for c in fitted.cuts),
                dropped=sum(c.action == "dropped" for c in fitted.cuts),
                tokens=fitted.tokens,
                limit=limit,
            )
            await self.emit(ContextCutsMade(cuts=fitted.cuts))
        return fitted.messages

    # -------------------------------------------------------------- calls

    async def complete(
        self,
        site: CallSite,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion:
        """One LLM call, recorded (ExchangeDone) and counted whether it succeeds or not; raises
        LLMError (reason BUDGET_SPENT) without calling once the token budget is spent, and
        ModelUnavailableError, which ends the run, when no server could serve it within the
        backend's outage budget (the call itself waits the outage out).
        `temperature`: this call's, instead of the backend's configured one."""
        await self._check_budget()
        at, start = datetime.now(UTC), time.monotonic()
        try:
            completion = await self._backend.complete(
                messages, schema=schema, tools=tools, max_tokens=max_tokens, temperature=temperature
            )
        except LLMError as exc:
            await self._record(site, messages, at, start, error=exc)
            if exc.reason == MODEL_UNAVAILABLE:
                raise ModelUnavailableError(str(exc)) from exc
            raise
        await self._record(site, messages, at, start, completion=completion)
        return completion

    def replayed(self, turn: ChatMessage) -> ChatMessage:
        """A turn the model wrote, as a later request replays it: with the control spellings it
        may have copied from its evidence broken, as in quoted text (spotlight.py), so that its
        own words cannot close its turn either. Its tool calls' JSON stays valid (the break is
        a plain character inside a string)."""
        defuse = self._controls.defuse
        return turn.model_copy(
            update={
                "content": defuse(turn.content),
                "tool_calls": tuple(
                    ToolCall(id=c.id, name=defuse(c.name), arguments=defuse(c.arguments))
                    for c in turn.tool_calls
                ),
            }
        )

    async def until_valid(
        self,
        site: CallSite,
        messages: Sequence[ChatMessage],
        answer: AnswerFormat[T] | ToolFormat[T],
        *,
        max_tokens: int,
        retries: int,
        repair: Callable[[str], str] = prompts.invalid_answer,
        temperature: float | None = None,
    ) -> T:
        """Call until the answer parses: at most 1 + `retries` attempts.

        After a rejected answer the next attempt sees it as an assistant turn followed by
        `repair(error)` (as the result of each tool call it made, else as a user turn); the
        repair turns replace the previous ones, so prompts stay bounded and keep `messages` as
        their prefix. An LLMError is a failed attempt too (same request again), except one the
        same request would meet again (context exceeded, bad request), which ends the attempts
        at once. Raises AnswerFailedError with the last reason.
        """
        request, attempt, reason = list(messages), site, ""
        schema, tools = (
            (None, answer.tools) if isinstance(answer, ToolFormat) else (answer.schema, ())
        )
        for _ in range(retries + 1):
            try:
                completion = await self.complete(
                    attempt,
                    request,
                    schema=schema,
                    tools=tools,
                    max_tokens=max_tokens,
                    temperature=temperature,
                )
            except LLMError as exc:
                reason = f"LLM call failed ({exc.reason}): {exc}"
                if exc.reason in _NOT_RETRIED:
                    break
                continue
            try:
                return answer.read(completion)
            except InvalidAnswerError as exc:
                reason = str(exc)
                attempt = CallSite(site.phase, site.agent_id, "repair")
                rejected = self.replayed(completion.turn())
                # The reason may cite the answer (an unknown tool's name, a peer id).
                repaired = repair(self._controls.defuse(reason))
                request = [*messages, rejected, *replies_to(rejected, repaired)]
        raise AnswerFailedError(f"no valid answer in {retries + 1} attempt(s); last: {reason}")

    async def _check_budget(self) -> None:
        """No call starts once the run's finished calls have used the budget. Calls already
        running then still finish: the spend passes the budget by at most what they use (one
        call per agent at a time, each within its max_tokens and the context window)."""
        used = self._usage.prompt_tokens + self._usage.completion_tokens
        if not self._token_budget or used < self._token_budget:
            return
        if not self.budget_spent:
            self.budget_spent = True
            await self.emit(TokenBudgetSpent(budget=self._token_budget, used=used))
        raise LLMError(
            f"the investigation's LLM-token budget is spent ({used:,} of {self._token_budget:,} "
            "tokens used); no further call is made",
            reason=BUDGET_SPENT,
        )

    async def _record(
        self,
        site: CallSite,
        messages: Sequence[ChatMessage],
        at: datetime,
        start: float,
        *,
        completion: Completion | None = None,
        error: LLMError | None = None,
    ) -> None:
        prompt = completion.prompt_tokens if completion else 0
        generated = completion.completion_tokens if completion else 0
        cached = completion.cached_tokens if completion else None
        seq = len(self._calls)
        self._calls.append(
            CallTiming(
                seq=seq,
                after=_last_calls.get(),
                uncached_prompt_tokens=max(0, prompt - (cached or 0)),
                completion_tokens=generated,
                start=start,
                end=time.monotonic(),
            )
        )
        _last_calls.set((seq,))
        self._usage = LLMUsage(
            calls=self._usage.calls + 1,
            prompt_tokens=self._usage.prompt_tokens + prompt,
            completion_tokens=self._usage.completion_tokens + generated,
        )
        exchange = LLMExchange(
            phase=site.phase,
            agent_id=site.agent_id,
            purpose=site.purpose,
            messages=tuple(_audited(m) for m in messages),
            response=_audited(completion.turn())["content"] if completion else "",
            error=f"{error.reason}: {error}" if error else "",
            error_reason=error.reason if error else "",
            prompt_tokens=prompt,
            completion_tokens=generated,
            cached_tokens=cached,
            seconds=time.monotonic() - start,
            at=at,
        )
        await self.emit(ExchangeDone(exchange=exchange))


def _audited(message: ChatMessage) -> dict[str, str]:
    """A turn as the audit keeps it (flat strings): tool calls are appended to the content as
    JSON, so a reader of role and content alone still sees them."""
    record = {"role": message.role, "content": message.content}
    if message.tool_calls:
        calls = json.dumps([c.model_dump() for c in message.tool_calls], ensure_ascii=False)
        record["content"] = "\n".join(part for part in (message.content, calls) if part)
    if message.tool_call_id:
        record["tool_call_id"] = message.tool_call_id
    return record


async def concurrently(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run coroutines at once, results in order. The first failure cancels the others (no LLM
    calls left running) and is re-raised as itself rather than as an ExceptionGroup. The calls
    made after it wait for the last calls of every branch (`_last_calls`)."""

    async def branch(coro: Coroutine[Any, Any, T]) -> tuple[T, tuple[int, ...]]:
        return await coro, _last_calls.get()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(branch(c)) for c in coros]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from failed
    ended = [t.result() for t in tasks]
    if ended:
        _last_calls.set(tuple(sorted({seq for _, last in ended for seq in last})))
    return [result for result, _ in ended]
