"""The reputation variant of β: which β_i each vote is weighed with, and how a confirmed outcome
moves them. Pure functions; the rule itself is documented on `ReputationSpec`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from poirotd.config.spec import ReputationSpec, SystemSpec
from poirotd.model import AgentReputation, Vote


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


def betas_in_use(spec: SystemSpec, stored: Mapping[str, AgentReputation]) -> dict[str, float]:
    """The β each agent is weighed with now: the spec's β for all when reputation is off, else
    each agent's stored β_i (`initial` for an agent with no confirmed outcome yet)."""
    reputation = spec.protocol.reputation
    if not reputation.enabled:
        return {agent: spec.protocol.beta for agent in spec.agent_ids}
    return {
        agent: clamp(stored[agent].beta, reputation) if agent in stored else reputation.initial
        for agent in spec.agent_ids
    }


def reassess(
    spec: SystemSpec,
    votes: Sequence[Vote],
    truth: Sequence[int],
    stored: Mapping[str, AgentReputation],
    *,
    investigation_id: str,
    at: datetime,
) -> list[AgentReputation]:
    """The new reputation of every agent of the spec that cast a valid vote; nothing when
    reputation is off. Abstainers and agents no longer in the spec keep what they had."""
    reputation = spec.protocol.reputation
    if not reputation.enabled:
        return []
    current = betas_in_use(spec, stored)
    return [
        AgentReputation(
            system=spec.system.name,
            agent_id=vote.agent_id,
            beta=updated_beta(current[vote.agent_id], accuracy(vote.location, truth), reputation),
            confirmations=(stored[vote.agent_id].confirmations if vote.agent_id in stored else 0)
            + 1,
            investigation_id=investigation_id,
            updated_at=at,
        )
        for vote in votes
        if not vote.abstained and vote.agent_id in current
    ]
