"""The reputation variant of β: which β_i each vote is weighed with, and how they derive from the
confirmed outcomes. Pure functions; the rule itself is documented on `ReputationSpec`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from poirotd.config.spec import ReputationSpec, SystemSpec
from poirotd.model import AgentReputation, CampaignSeed, CampaignValue, Investigation


def accuracy(location: Sequence[int], truth: Sequence[int]) -> float:
    """Jaccard similarity of a vote and the confirmed decision vector: |v AND t| / |v OR t|.

    1 for an exact match, 0 when they share no region (an all-zero vote included: the truth
    always names at least one region), a fraction for a partly right multi-region vote.
    """
    if len(location) != len(truth):
        raise ValueError(f"a vote over {len(location)} regions cannot match {len(truth)}")
    both = sum(1 for v, t in zip(location, truth, strict=True) if v and t)
    either = sum(1 for v, t in zip(location, truth, strict=True) if v or t)
    return both / either if either else 1.0


def updated_beta(beta: float, accuracy: float, spec: ReputationSpec) -> float:
    """β_i moved a `learning_rate` step toward the accuracy mapped onto [min, max]."""
    target = spec.min + (spec.max - spec.min) * accuracy
    return clamp(beta + spec.learning_rate * (target - beta), spec)


def clamp(beta: float, spec: ReputationSpec) -> float:
    """β within the spec's bounds (a stored β may predate a change of them)."""
    return min(spec.max, max(spec.min, beta))


def betas_in_use(
    spec: SystemSpec, stored: Mapping[str, AgentReputation], seed: CampaignSeed | None = None
) -> dict[str, float]:
    """The β each agent is weighed with now: the spec's β for all when reputation is off, else
    each agent's stored β_i (`initial` for an agent with no confirmed outcome yet) weighed in
    with a fault campaign's `seed` as the spec's campaign_weight says (`weighed_in`)."""
    reputation = spec.protocol.reputation
    if not reputation.enabled:
        return {agent: spec.protocol.beta for agent in spec.agent_ids}
    campaign = seed.agents if seed is not None else {}
    betas = {}
    for agent in spec.agent_ids:
        confirmed, confirmations = confirmed_beta(spec, stored.get(agent))
        weighed = weighed_in(confirmed, confirmations, campaign.get(agent), reputation)
        betas[agent] = clamp(weighed, reputation)
    return betas


def confirmed_beta(spec: SystemSpec, stored: AgentReputation | None) -> tuple[float, int]:
    """An agent's β from confirmed outcomes alone, and how many moved it."""
    reputation = spec.protocol.reputation
    if stored is None:
        return reputation.initial, 0
    return clamp(stored.beta, reputation), stored.confirmations


def weighed_in(
    confirmed: float, confirmations: int, campaign: CampaignValue | None, rule: ReputationSpec
) -> float:
    """A confirmed value and a campaign's, each weighed by its evidence: n_c confirmed
    outcomes against n_s campaign cases counted at `rule.campaign_weight` each (ReputationSpec).
    The confirmed value alone without a campaign value or with a weight of 0."""
    if campaign is None or rule.campaign_weight == 0:
        return confirmed
    evidence = rule.campaign_weight * campaign.cases
    return (confirmations * confirmed + evidence * campaign.value) / (confirmations + evidence)


def derived_betas(
    spec: SystemSpec, history: Iterable[Investigation]
) -> dict[str, tuple[float, int]]:
    """Every agent's β_i and how many confirmed outcomes moved it, derived from the whole
    confirmed history: from `initial`, one `updated_beta` step per valid vote of an agent of the
    spec, investigations taken in the order they were first confirmed, each with its latest
    outcome. A correction thus takes the place of the outcome it replaced, as if that had never
    been confirmed; with no correction this is the step-by-step update each confirmation made."""
    reputation = spec.protocol.reputation
    agents = set(spec.agent_ids)
    derived: dict[str, tuple[float, int]] = {}
    for inv in sorted(history, key=_place_in_history):
        assert inv.confirmed is not None, "the confirmed history holds confirmed investigations"
        for vote in inv.votes:
            if vote.abstained or vote.agent_id not in agents:
                continue
            beta, confirmations = derived.get(vote.agent_id, (reputation.initial, 0))
            step = accuracy(vote.location, inv.confirmed.decision)
            derived[vote.agent_id] = (updated_beta(beta, step, reputation), confirmations + 1)
    return derived


def _place_in_history(inv: Investigation) -> tuple[datetime, str]:
    """When the investigation was first confirmed (a correction keeps that place)."""
    first = inv.superseded[0] if inv.superseded else inv.confirmed
    assert first is not None
    return first.at, inv.investigation_id


def reassess(
    spec: SystemSpec,
    history: Iterable[Investigation],
    stored: Mapping[str, AgentReputation],
    *,
    investigation_id: str,
    at: datetime,
) -> list[AgentReputation]:
    """The reputations to store after the confirmation of `investigation_id` changed the confirmed
    `history`: each agent's derived β_i that differs from its `stored` one, nothing when
    reputation is off. Agents whose β this left as it was, and agents no longer in the spec,
    keep what they had."""
    if not spec.protocol.reputation.enabled:
        return []
    changed = []
    for agent, (beta, confirmations) in derived_betas(spec, history).items():
        before = stored.get(agent)
        if before is not None and (before.beta, before.confirmations) == (beta, confirmations):
            continue
        changed.append(
            AgentReputation(
                system=spec.system.name,
                agent_id=agent,
                beta=beta,
                confirmations=confirmations,
                investigation_id=investigation_id,
                updated_at=at,
            )
        )
    return changed
