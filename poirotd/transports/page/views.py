"""What the page shows of an investigation, as JSON for its script: pure functions from the
records the service and the session reads give, no I/O.

Every string in here may be agent-written (justifications, messages, findings, exchanges): the
script puts each into the page as text, never as markup. What a viewer may not see is left out
here, not hidden there: exchanges and the session's messages only for an auditor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from poirotd.hazards.spec import (
    RangeRule,
    RollingMeanRule,
    RuleSpec,
    ThresholdRule,
    WindowSpec,
)
from poirotd.model import (
    AgentMessage,
    HazardEvent,
    Investigation,
    InvestigationEvent,
    LLMExchange,
    Phase,
    Reading,
)
from poirotd.protocol.projection import anchors, project

# How much telemetry the chart shows around the moment a rule fired: the rule's own window when
# it has one in seconds, else this; and a quarter of it after the moment.
DEFAULT_WINDOW = timedelta(seconds=30)
# The longest text of one message, prompt or answer the page is sent (the record keeps it whole).
MAX_TEXT_CHARS = 20_000


@dataclass(frozen=True)
class Viewer:
    """Who looks at the page: their name and what their roles let the page show and do."""

    name: str
    exchanges: bool  # an auditor: the LLM exchanges and the session's messages
    confirm: bool  # an operator, on a page set to take confirmations
    signed_in: bool  # by the page's own cookie: they can sign out

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "exchanges": self.exchanges,
            "confirm": self.confirm,
            "signed_in": self.signed_in,
        }


def summary(inv: Investigation) -> dict[str, Any]:
    """One row of the list: what it is, where it stands, what it blamed."""
    top: list[str] = []
    if inv.attribution is not None and inv.hazard_space is not None:
        top = [inv.hazard_space.regions[i].id for i in inv.attribution.top]
    return {
        "investigation_id": inv.investigation_id,
        "session_id": inv.session_id,
        "system": inv.system,
        "state": inv.state.value,
        "method": inv.method,
        "reason": _cut(inv.reason),
        "rule": inv.trigger.rule if inv.trigger else "",
        "severity": inv.trigger.severity if inv.trigger else "",
        "created_at": inv.created_at.isoformat(),
        "finished_at": inv.finished_at.isoformat() if inv.finished_at else None,
        "top": top,
        "tie": bool(inv.attribution and inv.attribution.tie),
        "confirmed": list(inv.confirmed.region_ids) if inv.confirmed else [],
        "degraded": bool(inv.degraded_reason),
    }


def blames(inv: Investigation, component: str) -> bool:
    """Whether the investigation's top region(s) include `component` (the list's filter)."""
    return component in summary(inv)["top"]


def detail(
    inv: Investigation,
    events: Sequence[InvestigationEvent],
    *,
    rule: RuleSpec | None,
    readings: Sequence[Reading],
    messages: Sequence[AgentMessage] | None,
    exchanges: Sequence[LLMExchange] | None,
) -> dict[str, Any]:
    """Everything the investigation's page draws. `messages` and `exchanges` are None for a
    viewer who may not see them."""
    space = inv.hazard_space
    regions = [r.model_dump(mode="json") for r in space.regions] if space else []
    return {
        "investigation": {
            **summary(inv),
            "incident": _cut(inv.incident),
            "error": _cut(inv.error),
            "degraded_reason": _cut(inv.degraded_reason),
            "requested_by": inv.requested_by,
            "usage": inv.usage.model_dump(mode="json"),
            "phases": [p.model_dump(mode="json") for p in inv.phases],
            "betas": inv.betas,
            "injection_findings": list(inv.injection_findings),
            "waiting_for_model_since": (
                inv.waiting_for_model_since.isoformat() if inv.waiting_for_model_since else None
            ),
        },
        "regions": regions,
        "attribution": inv.attribution.model_dump(mode="json") if inv.attribution else None,
        "votes": [_vote(v.model_dump(mode="json")) for v in inv.votes],
        "projection": projection(inv) if space else None,
        "confirmed": inv.confirmed.model_dump(mode="json") if inv.confirmed else None,
        "superseded": [o.model_dump(mode="json") for o in inv.superseded],
        "trigger": _trigger(inv.trigger) if inv.trigger else None,
        "telemetry": telemetry(inv.trigger, rule, readings) if inv.trigger else None,
        "timeline": timeline(inv, events, messages),
        "threads": threads(exchanges) if exchanges is not None else None,
        "findings": inv.findings,
        "reports": inv.reports,
        "last_event_id": events[-1].event_id if events else 0,
    }


def projection(inv: Investigation) -> dict[str, Any]:
    """The paper's radial projection (Fig. 5): each region's anchor on the circle, each vote's
    point, the consensus (the decision vector) and the confirmed outcome, when there is one."""
    assert inv.hazard_space is not None
    n = inv.hazard_space.size
    votes = [v for v in inv.votes if not v.abstained and len(v.location) == n]
    points = project([v.location for v in votes]) if votes else np.zeros((0, 2))

    def point(vector: Sequence[int]) -> list[float]:
        x, y = project([list(vector)])[0]
        return [round(float(x), 6), round(float(y), 6)]

    return {
        "anchors": [[round(float(x), 6), round(float(y), 6)] for x, y in anchors(n)],
        "votes": [
            {"agent_id": v.agent_id, "x": round(float(p[0]), 6), "y": round(float(p[1]), 6)}
            for v, p in zip(votes, points, strict=True)
        ],
        "consensus": (
            point(inv.attribution.decision)
            if inv.attribution and len(inv.attribution.decision) == n
            else None
        ),
        "confirmed": (
            point(inv.confirmed.decision)
            if inv.confirmed and len(inv.confirmed.decision) == n
            else None
        ),
    }


def window_of(trigger: HazardEvent, rule: RuleSpec | None) -> tuple[datetime, datetime]:
    """The span the chart covers: the rule's window (or DEFAULT_WINDOW) up to the moment it
    fired, and a quarter of it after."""
    span = DEFAULT_WINDOW
    if isinstance(rule, WindowSpec) and rule.window_seconds is not None:
        span = timedelta(seconds=rule.window_seconds)
    return trigger.at - span, trigger.at + span / 4


def signal_of(trigger: HazardEvent, rule: RuleSpec | None) -> tuple[str, str] | None:
    """The (component, signal) a hazard's chart shows: its rule's, else its evidence's."""
    component, signal = getattr(rule, "component", None), getattr(rule, "signal", None)
    if isinstance(component, str) and isinstance(signal, str):
        return component, signal
    if trigger.evidence:
        return trigger.evidence[0].component, trigger.evidence[0].signal
    return None


def telemetry(
    trigger: HazardEvent, rule: RuleSpec | None, readings: Sequence[Reading]
) -> dict[str, Any] | None:
    """The hazard window's series with the rule's levels and the moment it fired; None for a
    rule on messages (no signal to draw)."""
    signal = signal_of(trigger, rule)
    if signal is None:
        return None
    since, until = window_of(trigger, rule)
    series = list(readings) or [
        Reading(s.component, s.signal, s.value, s.measured_at) for s in trigger.evidence
    ]
    return {
        "component": signal[0],
        "signal": signal[1],
        "rule": trigger.rule,
        "kind": rule.kind if rule is not None else "",
        "since": since.isoformat(),
        "until": until.isoformat(),
        "fired_at": trigger.at.isoformat(),
        "samples": [[r.measured_at.isoformat(), r.value] for r in series],
        "evidence": [[s.measured_at.isoformat(), s.value] for s in trigger.evidence],
        "levels": levels(rule),
    }


def levels(rule: RuleSpec | None) -> list[dict[str, Any]]:
    """The rule's fixed levels, as lines on the chart (a z-score or rate rule has none: its
    limit is on a derived quantity, named in the caption)."""
    if isinstance(rule, RangeRule):
        return [{"label": "min", "value": rule.min}, {"label": "max", "value": rule.max}]
    if isinstance(rule, ThresholdRule | RollingMeanRule):
        what = "mean " if isinstance(rule, RollingMeanRule) else ""
        found = [(f"{what}above", rule.above), (f"{what}below", rule.below)]
        return [{"label": label, "value": value} for label, value in found if value is not None]
    return []


def timeline(
    inv: Investigation,
    events: Sequence[InvestigationEvent],
    messages: Sequence[AgentMessage] | None,
) -> list[dict[str, Any]]:
    """The session and the investigation as one sequence in time: the session's messages and
    tool calls (for an auditor), the hazard that opened it, then each progress event."""
    items: list[tuple[datetime, int, dict[str, Any]]] = []
    for m in messages or ():
        kind = "tool" if m.kind.value == "tool" or m.tool_calls else "message"
        items.append(
            (
                m.sent_at,
                0,
                {
                    "kind": kind,
                    "at": m.sent_at.isoformat(),
                    "index": m.index,
                    "sender": m.sender,
                    "recipient": m.recipient,
                    "message_kind": m.kind.value,
                    "text": _cut(m.content),
                    "tool_calls": [_cut(c) for c in m.tool_calls],
                    "tool_name": m.tool_name,
                },
            )
        )
    if inv.trigger is not None:
        t = inv.trigger
        items.append((t.at, 1, {"kind": "hazard", "at": t.at.isoformat(), **_trigger(t)}))
    for e in events:
        items.append((e.at, 2, {"kind": "event", **_event(e)}))
    items.sort(key=lambda item: (item[0], item[1]))
    return [item for _, _, item in items]


def event_json(e: InvestigationEvent) -> dict[str, Any]:
    """An event as the server-sent stream carries it."""
    return _event(e)


def threads(exchanges: Sequence[LLMExchange]) -> list[dict[str, Any]]:
    """Phase III as one thread per agent: each call it made (its turns and its vote) and each
    answer it gave a peer, in order, with the last prompt message and the answer."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for x in exchanges:
        if x.phase not in (Phase.INTERROGATION, Phase.VOTING):
            continue
        question = x.messages[-1] if x.messages else {}
        by_agent.setdefault(x.agent_id, []).append(
            {
                "at": x.at.isoformat(),
                "phase": x.phase.value,
                "purpose": x.purpose,
                "asked_role": question.get("role", ""),
                "asked": _cut(question.get("content", "")),
                "answer": _cut(x.response),
                "error": _cut(x.error),
                "prompt_messages": len(x.messages),
                "seconds": round(x.seconds, 3),
            }
        )
    return [{"agent_id": agent, "turns": turns} for agent, turns in sorted(by_agent.items())]


def _vote(vote: dict[str, Any]) -> dict[str, Any]:
    return {**vote, "justification": _cut(vote.get("justification", ""))}


def _trigger(t: HazardEvent) -> dict[str, Any]:
    return {
        "rule": t.rule,
        "severity": t.severity,
        "at": t.at.isoformat(),
        "summary": _cut(t.summary),
    }


def _event(e: InvestigationEvent) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "investigation_id": e.investigation_id,
        "at": e.at.isoformat(),
        "event": e.kind.value,
        "phase": e.phase.value if e.phase else None,
        "seconds": e.seconds,
        "vote": _vote(e.vote.model_dump(mode="json")) if e.vote else None,
        "attribution": e.attribution.model_dump(mode="json") if e.attribution else None,
        "region_ids": list(e.region_ids),
        "reason": _cut(e.reason),
    }


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + " [...]"
