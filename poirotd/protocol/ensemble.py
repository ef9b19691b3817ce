"""The ensemble: several attribution methods over one session, their region scores combined.

The members (spec: protocol.ensemble.members) run one after the other on the same case and the
same RunContext (one token budget, every exchange and vote recorded); a member that fails is
recorded with its reason and left out. Each member's scores are scaled to a maximum of 1 and
weighed by w_m = rho_m + ½(1 - |D_m|/N) (see EnsembleSpec): its reliability rho_m, learnt from
confirmed outcomes like an agent's β (`reliabilities`), and how sharply it blamed (|D_m| of the N
regions). The combined scores S_j = Σ_m w_m ŝ_mj are decided by the spec's decision rule; the
step is the one with the most member weight. Every member's result stays in the findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from poirotd.config.spec import ReputationSpec
from poirotd.model import Attribution, CampaignSeed, EnsembleMember, Investigation, Phase
from poirotd.protocol.aggregation import decide, heaviest_step, rule_name
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.method import Case, Method, MethodResult
from poirotd.protocol.reputation import accuracy, updated_beta, weighed_in
from poirotd.protocol.run import RunContext

# One member's run: its name, its result (None when it failed) and why it failed ("" if not).
MemberRun = tuple[EnsembleMember, MethodResult | None, str]


async def attribute(case: Case, run: RunContext, *, members: Mapping[str, Method]) -> MethodResult:
    ran: list[MemberRun] = []
    for name in case.spec.protocol.ensemble.members:
        try:
            ran.append((name, await members[name](case, run), ""))
        except ProtocolError as exc:
            ran.append((name, None, str(exc)))
    _require_a_member(ran)
    async with run.phase(Phase.AGGREGATION):
        return combined(case, ran)


def combined(case: Case, ran: Sequence[MemberRun]) -> MethodResult:
    """The ensemble's result from its members' runs, in the spec's member order: what
    `attribute` returns once they have run. `poirotd eval` calls it too, on member results it
    has already recorded for the same case (poirot_eval/ensemble_lines.py)."""
    _require_a_member(ran)
    reliability = _reliability_of(case, case.spec.protocol.ensemble.reliability)
    done = [(name, result) for name, result, _ in ran if result is not None]
    weights = {
        name: member_weight(reliability[name], result.attribution, case.space.size)
        for name, result in done
    }
    attribution = combine(case, [(weights[name], result.attribution) for name, result in done])
    members_json: list[dict[str, Any]] = [
        {
            "method": name,
            "error": error,
            "reliability": reliability[name],
            "weight": weights.get(name),
            "attribution": result.attribution.model_dump(mode="json") if result else None,
            "findings": result.findings if result else {},
        }
        for name, result, error in ran
    ]
    lacks = [f"ensemble member {name} failed: {error}" for name, _, error in ran if error]
    lacks += [f"{name}: {lack}" for name, result in done for lack in result.lacks]
    reports = next((r.reports for name, r in done if name == "poirot"), {})
    return MethodResult(
        attribution=attribution,
        votes=tuple(v for _, result in done for v in result.votes),
        reports=reports,
        findings={"method": "ensemble", "members": members_json},
        lacks=tuple(lacks),
    )


def _require_a_member(ran: Sequence[MemberRun]) -> None:
    if all(result is None for _, result, _ in ran):
        reasons = "; ".join(f"{name}: {error}" for name, _, error in ran)
        raise ProtocolError(f"ensemble: every member failed: {reasons}")


def member_weight(reliability: float, attribution: Attribution, regions: int) -> float:
    """w_m = rho_m + ½(1 - |D_m|/N)."""
    return reliability + 0.5 * (1 - sum(attribution.decision) / regions)


def combine(case: Case, weighted: Sequence[tuple[float, Attribution]]) -> Attribution:
    """S_j = Σ_m w_m ŝ_mj, decided by the spec's decision rule (see the module docstring)."""
    rule = case.spec.protocol.decision
    total = np.zeros(case.space.size)
    steps: dict[int, float] = {}
    for weight, attribution in weighted:
        scores = np.asarray(attribution.scores, dtype=np.float64)
        peak = scores.max(initial=0.0)
        if peak > 0:
            total += weight * scores / peak
        if attribution.step is not None:
            steps[attribution.step] = steps.get(attribution.step, 0.0) + weight
    top, decision = decide(total, rule)
    return Attribution(
        scores=tuple(float(s) for s in total),
        top=top,
        tie=len(top) > 1,
        decision=decision,
        rule=f"ensemble({rule_name(rule)})",
        beta=float(np.mean([w for w, _ in weighted])),
        step=heaviest_step(steps),
    )


def method_reliabilities(
    settings: ReputationSpec,
    confirmed: Sequence[Investigation],
    seed: CampaignSeed | None = None,
) -> dict[str, float]:
    """Each method's rho in use: learnt from the confirmed investigations
    (`confirmed_reliabilities`), weighed in with a fault campaign's `seed` as
    `settings.campaign_weight` says. Methods with neither are absent (`initial` applies); with
    `settings.enabled` off nothing is learnt."""
    if not settings.enabled:
        return {}
    learnt = confirmed_reliabilities(settings, confirmed)
    campaign = seed.methods if seed is not None else {}
    return {
        method: weighed_in(
            *learnt.get(method, (settings.initial, 0)), campaign.get(method), settings
        )
        for method in learnt.keys() | campaign.keys()
    }


def confirmed_reliabilities(
    settings: ReputationSpec, confirmed: Sequence[Investigation]
) -> dict[str, tuple[float, int]]:
    """Each method's rho from the confirmed investigations (oldest first), and how many moved
    it: an EMA of the Jaccard accuracy of its decision, like an agent's β (ReputationSpec). An
    ensemble's members each count for their method."""
    rho: dict[str, tuple[float, int]] = {}
    for investigation in confirmed:
        if investigation.confirmed is None:
            continue
        truth = investigation.confirmed.decision
        for method, decision in _decisions(investigation):
            if len(decision) == len(truth):
                current, count = rho.get(method, (settings.initial, 0))
                step = updated_beta(current, accuracy(decision, truth), settings)
                rho[method] = (step, count + 1)
    return rho


def _decisions(investigation: Investigation) -> list[tuple[str, tuple[int, ...]]]:
    """(method, decision) of every method the investigation ran."""
    if investigation.method != "ensemble":
        a = investigation.attribution
        return [(investigation.method, a.decision)] if a is not None else []
    return [
        (m["method"], tuple(m["attribution"]["decision"]))
        for m in investigation.findings.get("members", ())
        if m.get("attribution")
    ]


def _reliability_of(case: Case, settings: ReputationSpec) -> dict[str, float]:
    """rho_m of each member: learnt, else `initial`."""
    learnt = case.reliabilities if settings.enabled else {}
    return {m: learnt.get(m, settings.initial) for m in case.spec.protocol.ensemble.members}
