"""An ensemble's result line combined from the member lines a run directory already holds.

`method=ensemble` runs its members one after the other on the case and combines their results
(`poirotd.protocol.ensemble.combined`). When the run directory already holds every member's
line for the case, from the same model (a directory holds one LLM setup), running the members
again would only draw new samples of the same computations at the full cost of all of them. So
the eval combines the recorded lines with the daemon's own `combined`, and marks the line
(`CaseResult.ensemble_of`).

Why that is what the ensemble computes on an eval case: the hazard space is pinned (no Phase I
call, the same regions for every method); the eval's daemon has no token budget, so a member
alone spends what it would inside the ensemble; each case gets a fresh store, so no method has
a learnt reliability (all rho_m = `initial`) and ErrorProbe's memory starts empty either way.
What differs: inside one ensemble run the members share one random spotlight token; run alone,
each had its own, so their prompts (and answers) are other draws of the same distribution. The
line's tokens and seconds are the sums of its members', which is what one ensemble run spends
apart from its single ingest of the session.

`combined` reads a member's scores, decision and step (and keeps its votes); the rest of the
member's Attribution is rebuilt from those. A member line that failed is left out with its
error, as the ensemble leaves out a member that raised ProtocolError; a member that timed out,
crashed ("internal error"), or is missing means the ensemble must run for real.
"""

from __future__ import annotations

from collections.abc import Mapping

from poirot_eval.cases import EvalCase
from poirot_eval.results import CaseResult, TokenUsage
from poirotd.protocol.ensemble import MemberRun, combined
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.method import Case, MethodResult, argmax_attribution
from poirotd.protocol.poirot.hazard_space import pinned_hazard_space
from poirotd.protocol.spotlight import Spotlight

# A failed member line whose error says the daemon itself broke, not the method.
_CRASH = "internal error"


def ensemble_line(case: EvalCase, lines: Mapping[str, CaseResult], model: str) -> CaseResult | None:
    """The ensemble's line for `case` from its members' `lines` (by method), or None when they
    cannot stand in for a run (see the module docstring)."""
    spec = case.spec
    space = pinned_hazard_space(spec)
    members = spec.protocol.ensemble.members
    picked = {name: lines.get(name) for name in members}
    if space is None:
        return None
    region_ids = tuple(r.id for r in space.regions)
    recorded = {
        name: line
        for name, line in picked.items()
        if line is not None and _usable(line, model) and line.region_ids == region_ids
    }
    if len(recorded) < len(members):
        return None
    member_lines = list(recorded.values())
    ran: list[MemberRun] = [
        (name, _method_result(line), _error(line)) for name, line in recorded.items()
    ]
    daemon_case = Case(
        spec=spec,
        space=space,
        messages=case.messages,
        incident=None,
        spotlight=Spotlight.fresh(spec.protocol.spotlighting),
        betas={},
    )
    fields = {
        "case_id": case.case_id,
        "dataset": case.dataset,
        "method": "ensemble",
        "model": model,
        "region_ids": region_ids,
        "truth": case.truth,
        "tokens": TokenUsage(
            prompt=sum(x.tokens.prompt for x in member_lines),
            completion=sum(x.tokens.completion for x in member_lines),
            cached=sum(x.tokens.cached for x in member_lines),
        ),
        "seconds": sum(x.seconds for x in member_lines),
        "context_cuts": sum(x.context_cuts for x in member_lines),
        "ensemble_of": tuple(members),
    }
    try:
        result = combined(daemon_case, ran)
    except ProtocolError as exc:
        return CaseResult(status="failed", error=str(exc), **fields)
    a = result.attribution
    return CaseResult(
        status="ok", decision=a.decision, scores=a.scores, step=a.step, votes=result.votes, **fields
    )


def _usable(line: CaseResult, model: str) -> bool:
    if line.model != model:
        return False
    if line.status == "ok":
        return bool(line.scores) and bool(line.decision)
    return line.status in ("failed", "context_exceeded") and not line.error.startswith(_CRASH)


def _error(line: CaseResult) -> str:
    return "" if line.status == "ok" else line.error


def _method_result(line: CaseResult) -> MethodResult | None:
    if line.status != "ok":
        return None
    # Its top regions as the daemon finds them; its decision as recorded (a member may decide
    # by a threshold rule).
    attribution = argmax_attribution(line.scores, f"recorded {line.method} line", line.step)
    recorded = attribution.model_copy(update={"decision": line.decision})
    return MethodResult(attribution=recorded, votes=line.votes)
