"""ErrorProbe as an attribution method.

1. Detection: MAST tags on the session (tags.py).
2. Tracing: the session pruned to the causal chain of its last message and the tagged steps
   (trace.py); memory is searched with the tags' signatures (memory.py).
3. Diagnosis: the Strategist proposes hypotheses (region, step, MAST mode, claim) from the chain,
   the tags and what memory recalled; an Investigator per hypothesis makes claims that the
   daemon checks against the stored session (tools.py); the Arbiter upholds one hypothesis
   among those with evidence that checked out (among all when none has: the verdict is then
   unverified) with a confidence and a guard for memory.
4. Aggregation: the verdict is the attribution (its region scores the Arbiter's confidence,
   the others 0; its step is the hypothesis's), cast as the vote of "errorprobe.arbiter". The
   memory gate (memory.py) commits the diagnosis when every check of its evidence passed at a
   confidence of at least `commit_confidence`; otherwise it waits in the findings for a
   ConfirmOutcome.
A Strategist without a valid answer, or an Arbiter without one, fails the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from poirotd.config.spec import ErrorProbeSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import AgentMessage, MemorySignature, MessageKind, Phase, Vote
from poirotd.protocol.errorprobe.mast import mode_named
from poirotd.protocol.errorprobe.memory import (
    Diagnosis,
    DiagnosisMemory,
    Recalled,
    committed,
    entry_id_of,
    recall,
    retrieved,
)
from poirotd.protocol.errorprobe.prompts import (
    arbiter_request,
    investigator_request,
    strategist_request,
)
from poirotd.protocol.errorprobe.schemas import (
    Evidence,
    Hypothesis,
    Tag,
    Verdict,
    evidence_format,
    hypotheses_format,
    verdict_format,
)
from poirotd.protocol.errorprobe.tags import detect
from poirotd.protocol.errorprobe.tools import CheckedClaim, check
from poirotd.protocol.errorprobe.trace import CausalChain, backward_trace
from poirotd.protocol.errors import AnswerFailedError, ProtocolError
from poirotd.protocol.events import VoteCast
from poirotd.protocol.method import Case, MethodResult, argmax_attribution, require_a_vote
from poirotd.protocol.run import CallSite, RunContext, concurrently

STRATEGIST = "errorprobe.strategist"
INVESTIGATOR = "errorprobe.investigator"
ARBITER = "errorprobe.arbiter"
RULE = "errorprobe"


@dataclass(frozen=True)
class _Investigated:
    """One hypothesis with its checked evidence (none when the Investigator gave no answer)."""

    hypothesis: Hypothesis
    evidence: Evidence | None
    checked: tuple[CheckedClaim, ...]
    error: str

    @property
    def supported(self) -> bool:
        return any(c.passed for c in self.checked)

    @property
    def verified(self) -> bool:
        return bool(self.checked) and all(c.passed for c in self.checked)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.hypothesis.model_dump(mode="json"),
            "claims": [c.model_dump(mode="json") for c in self.checked],
            "assessment": self.evidence.assessment if self.evidence else None,
            "error": self.error,
        }


async def attribute(case: Case, run: RunContext, *, memory: DiagnosisMemory | None) -> MethodResult:
    spec, settings = case.spec, case.spec.protocol.errorprobe
    if not case.messages:
        raise ProtocolError("errorprobe: the session has no message to diagnose")
    lacks: list[str] = []
    async with run.phase(Phase.DETECTION):
        tags, failed = await detect(spec, case.messages, case.incident, case.spotlight, run)
    if failed:
        lacks.append(failed)
    async with run.phase(Phase.TRACING):
        chain = backward_trace(case.messages, [t.step for t in tags], settings.max_chain_messages)
        kept = set(chain.kept)
        chain_messages = tuple(m for m in case.messages if m.index in kept)
        recalled = await _recall(memory, case, tags)
    async with run.phase(Phase.DIAGNOSIS):
        hypotheses, view = await _strategise(case, chain_messages, chain, tags, recalled, run)
        investigated = await concurrently(
            _investigate(case, view, chain, h, run) for h in hypotheses
        )
        choices = [n for n, x in enumerate(investigated, 1) if x.supported]
        if not choices:
            lacks.append("no hypothesis had evidence that checked out: the verdict is unverified")
            choices = list(range(1, len(investigated) + 1))
        verdict, vote = await _arbitrate(case, investigated, choices, run)
    require_a_vote([vote], "arbiter")
    assert verdict is not None, "an arbiter that did not abstain gave a verdict"
    async with run.phase(Phase.AGGREGATION):
        chosen = investigated[verdict.hypothesis - 1]
        diagnosis = _diagnosis(case, chosen, verdict)
        scores = [
            verdict.confidence if r.id == diagnosis.region else 0.0 for r in case.space.regions
        ]
        attribution = argmax_attribution(scores, RULE, diagnosis.step)
        gate = await _gate(memory, case, diagnosis, settings)
    return MethodResult(
        attribution=attribution,
        votes=(vote,),
        findings={
            "method": "errorprobe",
            "tags": [t.model_dump(mode="json") for t in tags],
            "chain": {
                "kept": list(chain.kept),
                "seeds": list(chain.seeds),
                "masked": chain.masked,
                "edges": [list(e) for e in chain.edges],
            },
            "hypotheses": [x.as_json() for x in investigated],
            "verdict": verdict.model_dump(mode="json"),
            "diagnosis": diagnosis.model_dump(mode="json"),
            "memory": {
                "recalled": [
                    {
                        "entry_id": r.entry.entry_id,
                        "similarity": r.similarity,
                        "score": r.score,
                        "recipe": r.entry.recipe,
                    }
                    for r in recalled
                ],
                **gate,
            },
        },
        lacks=tuple(lacks),
    )


async def _recall(
    memory: DiagnosisMemory | None, case: Case, tags: Sequence[Tag]
) -> list[Recalled]:
    """The memory entries similar to the tags' signatures, each counted as retrieved."""
    settings = case.spec.protocol.errorprobe.memory
    if memory is None or not settings.enabled or not tags:
        return []
    system = case.spec.system.name
    queries = [_signature(case, t.mode, t.step) for t in tags]
    found = recall(await memory.memory_entries(system), queries, settings, datetime.now(UTC))
    for r in found:
        await memory.update_memory_entry(system, r.entry.entry_id, retrieved)
    return found


async def _strategise(
    case: Case,
    chain_messages: Sequence[AgentMessage],
    chain: CausalChain,
    tags: Sequence[Tag],
    recalled: Sequence[Recalled],
    run: RunContext,
) -> tuple[tuple[Hypothesis, ...], tuple[AgentMessage, ...]]:
    """The Strategist's hypotheses, and the causal chain as it saw it (cut to fit)."""
    spec, settings = case.spec, case.spec.protocol.errorprobe
    recipes = [r.entry for r in recalled]

    def request(view: Sequence[AgentMessage]) -> list[ChatMessage]:
        return strategist_request(
            spec, case.space, view, chain.masked, case.incident, case.spotlight, tags, recipes
        )

    view = await run.fit(STRATEGIST, chain_messages, request, reserve=settings.role_max_tokens)
    try:
        answer = await run.until_valid(
            CallSite(Phase.DIAGNOSIS, STRATEGIST, "hypotheses"),
            request(view),
            hypotheses_format(case.space, {m.index for m in view}, settings.max_hypotheses),
            max_tokens=settings.role_max_tokens,
            retries=spec.protocol.invalid_json_retries,
        )
    except AnswerFailedError as exc:
        raise ProtocolError(f"errorprobe: the Strategist gave no valid hypotheses: {exc}") from exc
    return answer.hypotheses, view


async def _investigate(
    case: Case,
    strategist_view: Sequence[AgentMessage],
    chain: CausalChain,
    hypothesis: Hypothesis,
    run: RunContext,
) -> _Investigated:
    """The Investigator's claims for one hypothesis, each checked by the daemon. It reads the
    causal chain as the Strategist did (so their prompts share a prefix), cut further only if
    its own request would not fit."""
    spec, settings = case.spec, case.spec.protocol.errorprobe
    signals = sorted({(r.component, r.signal) for r in case.readings})
    calling_in_chain = any(m.tool_calls for m in strategist_view)
    tools = [
        "quote",
        *(["tool_result"] if calling_in_chain else []),
        *(["telemetry"] if signals else []),
    ]

    def request(view: Sequence[AgentMessage]) -> list[ChatMessage]:
        return investigator_request(
            spec, case.space, view, chain.masked, case.incident, hypothesis, tools, case.spotlight
        )

    view = await run.fit(INVESTIGATOR, strategist_view, request, reserve=settings.role_max_tokens)
    steps = [m.index for m in view]
    calling = [m.index for m in view if m.tool_calls]
    try:
        evidence = await run.until_valid(
            CallSite(Phase.DIAGNOSIS, INVESTIGATOR, "evidence"),
            request(view),
            evidence_format(steps, calling, signals, settings.max_evidence),
            max_tokens=settings.role_max_tokens,
            retries=spec.protocol.invalid_json_retries,
        )
    except AnswerFailedError as exc:
        return _Investigated(hypothesis, None, (), f"no valid evidence: {exc}")
    checked = tuple(check(c, case.messages, case.readings) for c in evidence.claims)
    return _Investigated(hypothesis, evidence, checked, "")


async def _arbitrate(
    case: Case, investigated: Sequence[_Investigated], choices: Sequence[int], run: RunContext
) -> tuple[Verdict | None, Vote]:
    """The Arbiter's verdict and its vote (an abstention, with no verdict, when it gave none)."""
    spec, settings = case.spec, case.spec.protocol.errorprobe
    request = arbiter_request(
        spec,
        case.space,
        [x.hypothesis for x in investigated],
        [x.checked for x in investigated],
        [x.evidence.assessment if x.evidence else "" for x in investigated],
        choices,
        case.spotlight,
    )
    try:
        verdict = await run.until_valid(
            CallSite(Phase.DIAGNOSIS, ARBITER, "verdict"),
            request,
            verdict_format(choices),
            max_tokens=settings.role_max_tokens,
            retries=spec.protocol.invalid_json_retries,
        )
    except AnswerFailedError as exc:
        vote = Vote(agent_id=ARBITER, abstention_reason=f"verdict: {exc}")
        await run.emit(VoteCast(vote=vote))
        return None, vote
    h = investigated[verdict.hypothesis - 1].hypothesis
    mode = mode_named(h.mode)
    vote = Vote(
        agent_id=ARBITER,
        location=tuple(int(r.id == h.region) for r in case.space.regions),
        hazard_vector=f"{mode.id} {mode.name}",
        justification=verdict.reasoning,
        weight=verdict.confidence,
        step=h.step,
    )
    await run.emit(VoteCast(vote=vote))
    return verdict, vote


def _diagnosis(case: Case, chosen: _Investigated, verdict: Verdict) -> Diagnosis:
    h = chosen.hypothesis
    return Diagnosis(
        signature=_signature(case, h.mode, h.step, region=h.region),
        region=h.region,
        step=h.step,
        claim=h.claim,
        recipe=verdict.guard,
        confidence=verdict.confidence,
        verified=chosen.verified,
    )


async def _gate(
    memory: DiagnosisMemory | None, case: Case, diagnosis: Diagnosis, settings: ErrorProbeSpec
) -> dict[str, Any]:
    """Commits a diagnosis whose evidence all checked out at the commit confidence; says what
    became of it (the findings' memory report)."""
    if memory is None or not settings.memory.enabled:
        return {"committed": None, "gate": "memory is off"}
    if not diagnosis.verified:
        return {"committed": None, "gate": "pending confirmation: not every check passed"}
    if diagnosis.confidence < settings.memory.commit_confidence:
        return {
            "committed": None,
            "gate": f"pending confirmation: confidence {diagnosis.confidence:g} is below "
            f"{settings.memory.commit_confidence:g}",
        }
    system, now = case.spec.system.name, datetime.now(UTC)
    entry_id = entry_id_of(system, diagnosis.signature)
    await memory.update_memory_entry(
        system,
        entry_id,
        lambda e: committed(e, system, diagnosis, case.investigation_id, "evidence", now),
    )
    return {"committed": entry_id, "gate": "committed: every evidence check passed"}


def _signature(case: Case, mode: str, step: int, *, region: str | None = None) -> MemorySignature:
    """A signature for a MAST mode at `step`: the region blamed (by default who sent the
    message there) and the tool it called or answered for."""
    message = next((m for m in case.messages if m.index == step), None)
    if message is None:
        return MemorySignature(mode=mode, agent=region or "", tool="")
    tool = (
        message.tool_name
        if message.kind is MessageKind.TOOL
        else next(iter(message.tool_calls), "")
    )
    return MemorySignature(mode=mode, agent=region or message.sender, tool=tool)
