"""Protobuf <-> domain conversions; the only place that knows both shapes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.errors import InvalidArgument
from poirotd.model import (
    AgentMessage,
    AgentReputation,
    Attribution,
    CampaignOutcome,
    CampaignValue,
    CoalescedTrigger,
    ConfirmedOutcome,
    ContextCut,
    EventKind,
    HazardEvent,
    HazardSpace,
    IngestItem,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    LLMExchange,
    MessageKind,
    Session,
    SessionEnd,
    TelemetrySample,
    Vote,
    validate_agent_message,
)

if TYPE_CHECKING:  # the read side's results; clients of the wire API need neither module
    from poirotd.ingest.session_reads import SignalSummary
    from poirotd.store import SessionSummary

_KINDS = {
    pb.MESSAGE_KIND_AGENT: MessageKind.AGENT,
    pb.MESSAGE_KIND_HUMAN: MessageKind.HUMAN,
    pb.MESSAGE_KIND_TOOL: MessageKind.TOOL,
    pb.MESSAGE_KIND_SYSTEM: MessageKind.SYSTEM,
}
_KINDS_TO_PB = {v: k for k, v in _KINDS.items()}
_STATES = {
    InvestigationState.DEFERRED: pb.INVESTIGATION_STATE_DEFERRED,
    InvestigationState.QUEUED: pb.INVESTIGATION_STATE_QUEUED,
    InvestigationState.RUNNING: pb.INVESTIGATION_STATE_RUNNING,
    InvestigationState.SUCCEEDED: pb.INVESTIGATION_STATE_SUCCEEDED,
    InvestigationState.FAILED: pb.INVESTIGATION_STATE_FAILED,
    InvestigationState.INTERRUPTED: pb.INVESTIGATION_STATE_INTERRUPTED,
}
_STATES_FROM_PB: dict[int, InvestigationState] = {v: k for k, v in _STATES.items()}


def _time(ts: Timestamp, *, default: datetime, seq: int, name: str) -> datetime:
    """An unset timestamp means "now, as received". One a datetime cannot hold (before year 1,
    after 9999, nanos out of range) is refused, naming the item's seq and the field."""
    if ts.seconds == 0 and ts.nanos == 0:
        return default
    try:
        return ts.ToDatetime(tzinfo=UTC)
    except ValueError as exc:  # protobuf checks the range; its message says which part is off
        raise InvalidArgument(f"seq {seq}: {name}: {exc}", reason="invalid") from exc


def timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _ts(value: datetime | None) -> Timestamp | None:
    return None if value is None else timestamp(value)


@dataclass(frozen=True)
class UnnumberedMessage:
    """A message sent with assign_index: its index (0 here) is the daemon's to give."""

    message: AgentMessage


def ingest_item(
    request: pb.IngestRequest | pb.IngestItem, seq: int, received_at: datetime
) -> IngestItem | UnnumberedMessage:
    """The item of a single-item request or of one batched item, which has the seq given.
    Raises InvalidArgument (naming the seq) for one without an item or a kind, or with a time
    out of range."""
    which = request.WhichOneof("item")
    if which == "session_start":
        s = request.session_start
        return Session(
            session_id=s.session_id,
            system=s.system,
            started_at=_time(s.started_at, default=received_at, seq=seq, name="started_at"),
            labels=dict(s.labels),
        )
    if which == "session_end":
        e = request.session_end
        ended_at = _time(e.ended_at, default=received_at, seq=seq, name="ended_at")
        return SessionEnd(session_id=e.session_id, ended_at=ended_at)
    if which == "agent_message":
        m = request.agent_message
        if m.kind not in _KINDS:
            raise InvalidArgument(f"seq {seq}: message kind is unspecified", reason="invalid")
        message = validate_agent_message(
            {
                "session_id": m.session_id,
                "index": 0 if m.assign_index else m.index,
                "kind": _KINDS[m.kind],
                "sender": m.sender,
                "recipient": m.recipient,
                "content": m.content,
                "tool_calls": tuple(m.tool_calls) if m.tool_calls else (),  # usually none
                "tool_name": m.tool_name,
                "sent_at": _time(m.sent_at, default=received_at, seq=seq, name="sent_at"),
                "trace_id": m.trace_id,
                "span_id": m.span_id,
            }
        )
        return UnnumberedMessage(message) if m.assign_index else message
    if which == "telemetry":
        t = request.telemetry
        return TelemetrySample(
            session_id=t.session_id,
            component=t.component,
            signal=t.signal,
            value=t.value,
            measured_at=_time(t.measured_at, default=received_at, seq=seq, name="measured_at"),
        )
    raise InvalidArgument(f"seq {seq}: request carries no item", reason="invalid")


def ingest_request(item: IngestItem) -> pb.IngestRequest:
    """The single-item request that carries `item`: the inverse of `ingest_item`."""
    if isinstance(item, Session):
        return pb.IngestRequest(
            session_start=pb.SessionStart(
                session_id=item.session_id,
                system=item.system,
                started_at=timestamp(item.started_at),
                labels=item.labels,
            )
        )
    if isinstance(item, SessionEnd):
        return pb.IngestRequest(
            session_end=pb.SessionEnd(session_id=item.session_id, ended_at=timestamp(item.ended_at))
        )
    if isinstance(item, AgentMessage):
        return pb.IngestRequest(agent_message=agent_message(item))
    return pb.IngestRequest(telemetry=telemetry(item))


def agent_message(m: AgentMessage) -> pb.AgentMessage:
    return pb.AgentMessage(
        session_id=m.session_id,
        index=m.index,
        kind=_KINDS_TO_PB[m.kind],
        sender=m.sender,
        recipient=m.recipient,
        content=m.content,
        tool_calls=m.tool_calls,
        tool_name=m.tool_name,
        sent_at=timestamp(m.sent_at),
        trace_id=m.trace_id,
        span_id=m.span_id,
    )


def session_summary(summary: SessionSummary) -> pb.SessionSummary:
    s = summary.session
    return pb.SessionSummary(
        session_id=s.session_id,
        system=s.system,
        started_at=timestamp(s.started_at),
        ended_at=_ts(s.ended_at),
        labels=s.labels,
        messages=summary.messages,
        investigations=summary.investigations,
    )


def signal_summary(signal: SignalSummary) -> pb.SignalSummary:
    return pb.SignalSummary(
        component=signal.component,
        signal=signal.signal,
        samples=signal.samples,
        min=signal.min,
        max=signal.max,
        last=signal.last,
        first_at=timestamp(signal.first_at),
        last_at=timestamp(signal.last_at),
    )


def state_from_pb(state: int) -> InvestigationState | None:
    return _STATES_FROM_PB.get(state)


def hazard_space(space: HazardSpace) -> pb.HazardSpace:
    return pb.HazardSpace(
        system=space.system,
        version=space.version,
        source=space.source,
        regions=[
            pb.HazardRegion(id=r.id, name=r.name, type=r.type, description=r.description)
            for r in space.regions
        ],
    )


def vote(v: Vote) -> pb.Vote:
    return pb.Vote(
        agent_id=v.agent_id,
        location=list(v.location),
        hazard_vector=v.hazard_vector,
        justification=v.justification,
        weight=v.weight,
        abstention_reason=v.abstention_reason,
        forced=v.forced,
        forced_by=v.forced_by,
        step=v.step,
    )


def attribution(a: Attribution) -> pb.Attribution:
    return pb.Attribution(
        scores=list(a.scores),
        top=list(a.top),
        tie=a.tie,
        decision=list(a.decision),
        rule=a.rule,
        beta=a.beta,
        step=a.step,
    )


def context_cut(c: ContextCut) -> pb.ContextCut:
    return pb.ContextCut(
        agent_id=c.agent_id,
        index=c.index,
        action=c.action,
        chars_before=c.chars_before,
        chars_after=c.chars_after,
    )


def telemetry(sample: TelemetrySample) -> pb.TelemetrySample:
    return pb.TelemetrySample(
        session_id=sample.session_id,
        component=sample.component,
        signal=sample.signal,
        value=sample.value,
        measured_at=_ts(sample.measured_at),
    )


def hazard_event(event: HazardEvent) -> pb.HazardEvent:
    return pb.HazardEvent(
        rule=event.rule,
        severity=event.severity,
        at=_ts(event.at),
        summary=event.summary,
        evidence=[telemetry(s) for s in event.evidence],
    )


def exchange(x: LLMExchange) -> pb.Exchange:
    return pb.Exchange(
        phase=x.phase.value,
        agent_id=x.agent_id,
        purpose=x.purpose,
        messages=[pb.ChatTurn(role=m["role"], content=m["content"]) for m in x.messages],
        response=x.response,
        error=x.error,
        prompt_tokens=x.prompt_tokens,
        completion_tokens=x.completion_tokens,
        cached_tokens=x.cached_tokens or 0,
        seconds=x.seconds,
        at=_ts(x.at),
    )


def investigation(inv: Investigation, exchanges: Sequence[LLMExchange] = ()) -> pb.Investigation:
    """The full record; `exchanges` (every prompt and answer) only when asked for."""
    message = pb.Investigation(
        investigation_id=inv.investigation_id,
        system=inv.system,
        session_id=inv.session_id,
        state=_STATES[inv.state],
        reason=inv.reason,
        method=inv.method,
        created_at=_ts(inv.created_at),
        finished_at=_ts(inv.finished_at),
        votes=[vote(v) for v in inv.votes],
        phases=[pb.PhaseTiming(phase=p.phase.value, seconds=p.seconds) for p in inv.phases],
        error=inv.error,
        llm_calls=inv.usage.calls,
        prompt_tokens=inv.usage.prompt_tokens,
        completion_tokens=inv.usage.completion_tokens,
        incident=inv.incident,
        reports=[
            pb.AgentReport(
                agent_id=agent, report_json=json.dumps(report) if report is not None else ""
            )
            for agent, report in inv.reports.items()
        ],
        exchanges=[exchange(x) for x in exchanges],
        context_cuts=[context_cut(c) for c in inv.context_cuts],
        betas=inv.betas,
        degraded_reason=inv.degraded_reason,
        injection_findings=inv.injection_findings,
        findings_json=json.dumps(inv.findings) if inv.findings else "",
        coalesced=[coalesced_trigger(c) for c in inv.coalesced],
        coalesced_omitted=inv.coalesced_omitted,
        requested_by=inv.requested_by,
        canary=inv.canary is not None,
    )
    if inv.canary is not None:
        message.canary_label.CopyFrom(
            pb.CanaryLabel(
                case_id=inv.canary.case_id,
                dataset=inv.canary.dataset,
                truth_region_ids=inv.canary.truth,
                correct=inv.canary.correct,
            )
        )
    if inv.confirmed is not None:
        message.confirmed.CopyFrom(confirmed_outcome(inv.confirmed))
    message.superseded.extend(confirmed_outcome(outcome) for outcome in inv.superseded)
    if inv.trigger is not None:
        message.trigger.CopyFrom(hazard_event(inv.trigger))
    if inv.hazard_space is not None:
        message.hazard_space.CopyFrom(hazard_space(inv.hazard_space))
    if inv.attribution is not None:
        message.attribution.CopyFrom(attribution(inv.attribution))
    if inv.waiting_for_model_since is not None:
        message.waiting_for_model_since.CopyFrom(timestamp(inv.waiting_for_model_since))
    if inv.model_time is not None:
        message.model_time.CopyFrom(pb.ModelTime(**inv.model_time.model_dump()))
    return message


def coalesced_trigger(trigger: CoalescedTrigger) -> pb.CoalescedTrigger:
    return pb.CoalescedTrigger(
        reason=trigger.reason,
        rule=trigger.rule,
        at=_ts(trigger.at),
        state=_STATES[trigger.state],
        requested_by=trigger.requested_by,
    )


def confirmed_outcome(outcome: ConfirmedOutcome) -> pb.ConfirmedOutcome:
    return pb.ConfirmedOutcome(
        region_ids=list(outcome.region_ids),
        decision=list(outcome.decision),
        note=outcome.note,
        at=_ts(outcome.at),
    )


def agent_betas(
    betas: Mapping[str, float],
    reputations: Mapping[str, AgentReputation],
    confirmed: Mapping[str, float],
    campaign: Mapping[str, CampaignValue],
) -> list[pb.AgentBeta]:
    """Each agent's β in use, with the history of its reputation where it has one, its β from
    confirmed outcomes alone and a campaign's where one seeded it."""
    message = []
    for agent, beta in betas.items():
        entry = pb.AgentBeta(agent_id=agent, beta=beta, confirmed_beta=confirmed[agent])
        if (reputation := reputations.get(agent)) is not None:
            entry.confirmations = reputation.confirmations
            entry.investigation_id = reputation.investigation_id
            entry.updated_at.CopyFrom(timestamp(reputation.updated_at))
        if (seeded := campaign.get(agent)) is not None:
            entry.campaign.CopyFrom(campaign_value(seeded))
        message.append(entry)
    return message


def campaign_value(value: CampaignValue) -> pb.CampaignValue:
    return pb.CampaignValue(value=value.value, cases=value.cases)


def campaign_outcomes(request: pb.SeedReputationRequest) -> list[CampaignOutcome]:
    """The request's outcomes; InvalidArgument naming the first that does not validate."""
    outcomes = []
    for i, o in enumerate(request.outcomes):
        try:
            outcomes.append(
                CampaignOutcome(
                    case_id=o.case_id,
                    method=o.method,  # validated here
                    region_ids=tuple(o.region_ids),
                    decision=tuple(o.decision),
                    truth_region_ids=tuple(o.truth_region_ids),
                    votes=tuple(
                        Vote(
                            agent_id=v.agent_id,
                            location=tuple(v.location),
                            abstention_reason=v.abstention_reason,
                        )
                        for v in o.votes
                    ),
                )
            )
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidArgument(
                f"outcomes[{i}] (case {o.case_id!r}): {where}: {first['msg']}", reason="invalid"
            ) from exc
    return outcomes


def event(e: InvestigationEvent) -> pb.InvestigationEvent:
    message = pb.InvestigationEvent(
        event_id=e.event_id, investigation_id=e.investigation_id, at=_ts(e.at)
    )
    E = pb.InvestigationEvent
    if e.kind is EventKind.STARTED:
        message.started.CopyFrom(E.Started(session_id=e.session_id, reason=e.reason))
    elif e.kind is EventKind.PHASE_BEGUN and e.phase is not None:
        message.phase_begun.CopyFrom(E.PhaseBegun(phase=e.phase.value))
    elif e.kind is EventKind.PHASE_ENDED and e.phase is not None:
        message.phase_ended.CopyFrom(E.PhaseEnded(phase=e.phase.value, seconds=e.seconds or 0.0))
    elif e.kind is EventKind.VOTE_CAST and e.vote is not None:
        message.vote_cast.CopyFrom(E.VoteCast(vote=vote(e.vote)))
    elif e.kind is EventKind.ATTRIBUTION_READY and e.attribution is not None:
        message.attribution_ready.CopyFrom(
            E.AttributionReady(
                attribution=attribution(e.attribution),
                region_names=list(e.region_names),
                region_ids=list(e.region_ids),
            )
        )
    elif e.kind is EventKind.FAILED:
        message.failed.CopyFrom(E.Failed(reason=e.reason))
    elif e.kind is EventKind.INTERRUPTED:
        message.interrupted.CopyFrom(E.Interrupted(reason=e.reason))
    elif e.kind is EventKind.WAITING_FOR_MODEL:
        message.waiting_for_model.CopyFrom(E.WaitingForModel(reason=e.reason))
    elif e.kind is EventKind.MODEL_RETURNED:
        message.model_returned.CopyFrom(E.ModelReturned(waited_seconds=e.seconds or 0.0))
    elif e.kind is EventKind.DEFERRED:
        message.deferred.CopyFrom(E.Deferred(reason=e.reason))
    return message
