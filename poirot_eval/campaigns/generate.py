"""A campaign run: every fault of a plan on every source session, validated, labelled.

For each (source, fault) pair the operator makes a variant (or says why it cannot), the follow-up
mode decides what comes after the fault, validation keeps the variant only if its hazard fires,
and the truth is written from the injection itself: the faulty region, the step, the fault's
kind, operator and MAST mode. Every pair ends as a kept variant or a counted drop with a reason.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from poirot_eval.campaigns import agent_faults, manipulator, signal_faults
from poirot_eval.campaigns.agent_faults import DEFAULT_MODES, Injection, NotApplicableError
from poirot_eval.campaigns.manipulator import ManipulatorError, Usage
from poirot_eval.campaigns.plan import AgentFault, CampaignPlan, Fault
from poirot_eval.campaigns.validation import CheckError, validate
from poirot_eval.cases import EvalCase, FaultKind, GroundTruth, InjectedFault
from poirot_eval.parts import pinned_space
from poirotd.config.spec import SystemSpec
from poirotd.llm.base import LLMBackend
from poirotd.model import AgentMessage, MessageKind

NOT_APPLICABLE = "not_applicable"
LLM_FAILED = "llm_failed"
BAD_CHECK = "bad_check"

_NOT_ID = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Dropped:
    source: str
    fault: int
    operator: str
    reason: str
    detail: str


@dataclass
class CampaignOutcome:
    kept: list[EvalCase] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0

    @property
    def reasons(self) -> dict[str, int]:
        return dict(sorted(Counter(d.reason for d in self.dropped).items()))


async def run_campaign(
    plan: CampaignPlan, sources: Sequence[EvalCase], backend: LLMBackend | None
) -> CampaignOutcome:
    """Every fault of `plan` on every source, in order. `backend` writes the LLM faults and
    the re-enacted turns; without one, those variants are dropped as llm_failed."""
    outcome = CampaignOutcome()
    started = time.monotonic()
    for source in sources:
        base = _pinned(source)
        for number, fault in enumerate(plan.faults):
            try:
                variant = await _variant(plan, base, number, fault, backend, outcome.usage)
            except NotApplicableError as exc:
                outcome.dropped.append(_drop(source, number, fault, NOT_APPLICABLE, str(exc)))
            except ManipulatorError as exc:
                outcome.dropped.append(_drop(source, number, fault, LLM_FAILED, str(exc)))
            except CheckError as exc:
                outcome.dropped.append(_drop(source, number, fault, BAD_CHECK, str(exc)))
            else:
                if isinstance(variant, str):
                    outcome.dropped.append(_drop(source, number, fault, variant, ""))
                else:
                    outcome.kept.append(variant)
    outcome.seconds = time.monotonic() - started
    return outcome


def source_ref(case: EvalCase) -> str:
    return f"{case.dataset}:{case.case_id}"


async def _variant(
    plan: CampaignPlan,
    source: EvalCase,
    number: int,
    fault: Fault,
    backend: LLMBackend | None,
    usage: Usage,
) -> EvalCase | str:
    """The kept variant, or the reason validation dropped it."""
    case_id = _NOT_ID.sub("_", f"{source.case_id}-f{number:02d}-{fault.operator}")
    if isinstance(fault, AgentFault):
        injection = await _agent_injection(source, fault, backend, usage)
        messages = injection.messages
        telemetry = source.telemetry
        since = messages[injection.step].sent_at
        label = InjectedFault(
            kind=_agent_kind(fault),
            operator=fault.operator,
            mode=fault.mode or DEFAULT_MODES.get(fault.operator),
            before=_short(injection.before),
            after=_short(injection.after),
            parameters=_parameters(fault),
        )
        truth = GroundTruth(regions=(injection.region,), step=injection.step)
        resumes = injection.step + 1
    else:
        hit = signal_faults.inject(fault, source.messages, source.telemetry)
        messages, telemetry, since = source.messages, hit.telemetry, hit.onset
        label = InjectedFault(
            kind=fault.kind,
            operator=fault.operator,
            component=fault.component,
            signals=hit.signals,
            onset=hit.onset,
            before=hit.before,
            after=hit.after,
            parameters=_parameters(fault),
        )
        truth = GroundTruth(regions=(fault.component,))
        resumes = next((m.index for m in messages if m.sent_at >= hit.onset), len(messages))
        injection = None
    follow_up = plan.follow_up
    if injection is not None and injection.ends_session:
        follow_up = "truncate"
    if follow_up == "reenact":
        if backend is None:
            raise ManipulatorError("reenact needs an LLM")
        messages = await _reenacted(source.spec, messages, resumes, backend, usage)
    variant = _relabelled(
        EvalCase(
            dataset="campaign",
            case_id=case_id,
            spec=source.spec,
            messages=messages,
            truth=truth,
            telemetry=telemetry,
        )
    )
    verdict = validate(variant, source, fault.check, since=since)
    if not verdict.kept:
        return verdict.reason
    if follow_up == "truncate":
        variant = _truncated(variant, truth.step, verdict.at or since)
    fault_label = label.model_copy(
        update={"follow_up": follow_up, "source": source_ref(source), "hazard": verdict.rule}
    )
    return variant.model_copy(update={"truth": truth.model_copy(update={"fault": fault_label})})


async def _agent_injection(
    source: EvalCase, fault: AgentFault, backend: LLMBackend | None, usage: Usage
) -> Injection:
    messages = source.messages
    t = fault.step if fault.step is not None else _nth(messages, fault)
    if fault.operator == "change_number":
        return agent_faults.change_number(
            messages, t, number=fault.number, factor=fault.factor, value=fault.value
        )
    if fault.operator in agent_faults.SIMPLE:
        return agent_faults.SIMPLE[fault.operator](messages, t)
    if backend is None:
        raise ManipulatorError(f"{fault.operator} needs an LLM")
    assert fault.mode is not None  # the plan checks it
    if t >= len(messages) or messages[t].kind is not MessageKind.AGENT:
        raise NotApplicableError(f"message {t} is not an agent's")
    target = messages[t]
    if fault.operator == "llm_response":
        text = await manipulator.corrupted_response(
            backend, source.spec, messages[:t], target, fault.mode, fault.instruction, usage
        )
        return agent_faults.replace_content(messages, t, text)
    orders = await manipulator.injected_instruction(
        backend, source.spec, target.sender, fault.mode, fault.instruction, usage
    )
    text = await manipulator.spoken(
        backend, source.spec, target.sender, messages[:t], usage, extra_orders=orders
    )
    injection = agent_faults.replace_content(messages, t, text)
    return Injection(
        injection.messages,
        injection.step,
        injection.region,
        before=f"[injected orders] {orders}\n[original] {target.content}",
        after=text,
    )


def _nth(messages: Sequence[AgentMessage], fault: AgentFault) -> int:
    """The index of `fault.sender`'s `fault.nth` message that the operator can strike."""
    fits = [
        m.index
        for m in messages
        if m.sender == fault.sender
        and (
            (fault.is_llm and m.kind is MessageKind.AGENT)
            or agent_faults.can_strike(fault.operator, m)
        )
    ]
    if fault.operator == "drop_tool_result":
        fits = [
            m.index
            for m in messages
            if m.recipient == fault.sender and agent_faults.can_strike(fault.operator, m)
        ]
    if len(fits) <= fault.nth:
        raise NotApplicableError(
            f"{fault.sender} has {len(fits)} messages {fault.operator} can strike, "
            f"not a message {fault.nth}"
        )
    return fits[fault.nth]


async def _reenacted(
    spec: SystemSpec,
    messages: Sequence[AgentMessage],
    start: int,
    backend: LLMBackend,
    usage: Usage,
) -> tuple[AgentMessage, ...]:
    """Every agent message from `start` on written again by its agent from the altered history;
    tool results and people's messages stay as they were."""
    out = list(messages)
    agents = set(spec.agent_ids)
    for i in range(start, len(out)):
        m = out[i]
        if m.kind is MessageKind.AGENT and m.sender in agents and m.content.strip():
            text = await manipulator.spoken(backend, spec, m.sender, out[:i], usage)
            out[i] = m.model_copy(update={"content": text})
    return tuple(out)


def _truncated(variant: EvalCase, step: int | None, hazard_at: datetime) -> EvalCase:
    """The variant up to its fault and its hazard: messages up to the faulty step (or, for a
    signal fault, those sent by the time the hazard fired) and samples up to the hazard."""
    last = step if step is not None else -1
    messages = (
        tuple(m for m in variant.messages if m.index <= last or m.sent_at <= hazard_at)
        or variant.messages[:1]
    )
    until = max(hazard_at, messages[-1].sent_at)
    telemetry = tuple(s for s in variant.telemetry if s.measured_at <= until)
    return variant.model_copy(update={"messages": messages, "telemetry": telemetry})


def _relabelled(case: EvalCase) -> EvalCase:
    """The variant's own session id (its case id) on every message and sample, so variants
    replayed into one daemon are separate sessions."""
    sid = case.case_id
    return case.model_copy(
        update={
            "messages": tuple(m.model_copy(update={"session_id": sid}) for m in case.messages),
            "telemetry": tuple(s.model_copy(update={"session_id": sid}) for s in case.telemetry),
        }
    )


def _pinned(case: EvalCase) -> EvalCase:
    """The case with its hazard space pinned (agents, then components, when the spec does not
    pin one), so a variant's truth and every method's answer index the same regions."""
    if case.spec.hazard_space is not None:
        return case
    spec = case.spec
    space = pinned_space(
        spec.agents, [f"{a.name}: {a.system_prompt[:400]}" for a in spec.agents], spec.components
    )
    return case.model_copy(update={"spec": spec.model_copy(update={"hazard_space": space})})


def _agent_kind(fault: AgentFault) -> FaultKind:
    return "agent_prompt" if fault.operator == "llm_prompt" else "agent_response"


def _parameters(fault: Fault) -> dict[str, str | float | int | bool]:
    skip = {"operator", "check", "instruction"}
    raw = fault.model_dump(exclude_none=True, exclude_defaults=False)
    return {
        k: v for k, v in raw.items() if k not in skip and isinstance(v, str | float | int | bool)
    }


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + " (...)"


def _drop(source: EvalCase, number: int, fault: Fault, reason: str, detail: str) -> Dropped:
    return Dropped(source_ref(source), number, fault.operator, reason, detail)
