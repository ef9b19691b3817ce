"""Validation as AEGIS does it: a variant is kept only if the hazard it aims at fires.

The spec's hazard rules (poirotd/hazards, the engine the daemon runs on arrival), plus the check
the campaign states for the fault, run over the variant's messages and telemetry in time order,
and over its source's. The variant is kept when a target rule fires on it at or after the fault
and never on the source: a hazard that fires without the fault says nothing about the fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from poirot_eval.campaigns.plan import Check, RuleCheck
from poirot_eval.cases import EvalCase
from poirot_eval.session import session_items
from poirotd.config.spec import SystemSpec
from poirotd.hazards import RuleEngine, RuleSpec
from poirotd.model import AgentMessage, HazardEvent, TelemetrySample

# Why a variant was dropped (the campaign's manifest counts each).
HAZARD_NOT_FIRED = "hazard_not_fired"
FIRES_WITHOUT_FAULT = "fires_without_fault"


class CheckError(ValueError):
    """A check the plan states cannot be run on this spec (an unknown rule, a name clash)."""


@dataclass(frozen=True)
class Verdict:
    kept: bool
    # "" when kept, else HAZARD_NOT_FIRED or FIRES_WITHOUT_FAULT.
    reason: str
    # The target rule that fired first on the variant, and when.
    rule: str = ""
    at: datetime | None = None


def targets(spec: SystemSpec, check: Check | None) -> tuple[tuple[RuleSpec, ...], set[str]]:
    """The rules to run (the spec's, plus the check's own) and the names that must fire."""
    rules = tuple(spec.rules)
    if check is None:
        names = {r.name for r in rules if r.emit}
        if not names:
            raise CheckError(
                f"system {spec.system.name!r} has no hazard rules: state a check for the fault"
            )
        return rules, names
    if isinstance(check, RuleCheck):
        if check.rule not in {r.name for r in rules}:
            known = ", ".join(r.name for r in rules) or "none"
            raise CheckError(f"check names rule {check.rule!r}, not in the spec (rules: {known})")
        return rules, {check.rule}
    try:
        engine_rules = RuleEngine([*rules, check]).rules
    except ValidationError as exc:
        raise CheckError(f"the check {check.name!r} does not fit the spec's rules: {exc}") from exc
    return engine_rules, {check.name}


def fired(case: EvalCase, rules: Sequence[RuleSpec]) -> list[HazardEvent]:
    """Every event the rules raise over the case, fed item by item in time order as the daemon
    would receive it, with stale rules checked at each item's time."""
    engine = RuleEngine(rules)
    events: list[HazardEvent] = []
    if not case.messages and not case.telemetry:
        return events
    for item in session_items(case, "campaign-check"):
        events += engine.observe([item])
        if isinstance(item, AgentMessage):
            events += engine.tick(item.sent_at)
        elif isinstance(item, TelemetrySample):
            events += engine.tick(item.measured_at)
    return events


def validate(
    variant: EvalCase, source: EvalCase, check: Check | None, *, since: datetime
) -> Verdict:
    """Kept when a target rule fires on `variant` at or after `since` (the fault's time) and no
    target rule fires on `source`."""
    rules, names = targets(variant.spec, check)
    if any(e.rule in names for e in fired(source, rules)):
        return Verdict(False, FIRES_WITHOUT_FAULT)
    hits = [e for e in fired(variant, rules) if e.rule in names and e.at >= since]
    if not hits:
        return Verdict(False, HAZARD_NOT_FIRED)
    first = min(hits, key=lambda e: e.at)
    return Verdict(True, "", first.rule, first.at)
