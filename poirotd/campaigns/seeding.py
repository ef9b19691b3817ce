"""A fault campaign's outcomes made into a seed of the agents' β and the methods' reliabilities
(SeedReputation). The rule is the confirmed outcomes' own (ReputationSpec: an EMA of the
Jaccard accuracy, from `initial`), applied to the campaign's labelled cases in their order; the
result is kept apart from the confirmed reputations and weighed in by the spec's
campaign_weight (`poirotd.protocol.reputation.weighed_in`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from poirotd.config.spec import ReputationSpec, SystemSpec
from poirotd.model import CampaignOutcome, CampaignSeed, CampaignValue
from poirotd.protocol.reputation import accuracy, updated_beta

# The most outcomes one seed may carry (the request's byte bound, SEED_REQUEST_BYTES, usually
# comes first: some 20,000 outcomes of a small system).
MAX_OUTCOMES = 100_000


def seed_from(
    spec: SystemSpec, outcomes: Sequence[CampaignOutcome], *, source: str, at: datetime
) -> CampaignSeed:
    """The seed `outcomes` give under `spec`. Votes of agents the spec does not declare, and
    abstentions, move nothing. ValueError when there is no outcome, too many, or one whose
    vectors do not fit its regions."""
    if not outcomes:
        raise ValueError("no campaign outcome to seed from")
    if len(outcomes) > MAX_OUTCOMES:
        raise ValueError(f"{len(outcomes)} campaign outcomes; at most {MAX_OUTCOMES} per seed")
    agents: dict[str, CampaignValue] = {}
    methods: dict[str, CampaignValue] = {}
    declared = set(spec.agent_ids)
    for outcome in outcomes:
        truth = _truth_vector(outcome)
        if outcome.decision:
            _check_fits(outcome, "decision", outcome.decision)
            _step(methods, outcome.method, accuracy(outcome.decision, truth), _reliability(spec))
        for vote in outcome.votes:
            if vote.abstained or vote.agent_id not in declared:
                continue
            _check_fits(outcome, f"the vote of {vote.agent_id}", vote.location)
            _step(agents, vote.agent_id, accuracy(vote.location, truth), spec.protocol.reputation)
    return CampaignSeed(
        system=spec.system.name,
        source=source,
        seeded_at=at,
        cases=len(outcomes),
        agents=agents,
        methods=methods,
    )


def _reliability(spec: SystemSpec) -> ReputationSpec:
    return spec.protocol.ensemble.reliability


def _step(learnt: dict[str, CampaignValue], key: str, step: float, rule: ReputationSpec) -> None:
    before = learnt.get(key)
    value = updated_beta(rule.initial if before is None else before.value, step, rule)
    learnt[key] = CampaignValue(value=value, cases=1 if before is None else before.cases + 1)


def _truth_vector(outcome: CampaignOutcome) -> tuple[int, ...]:
    unknown = sorted(set(outcome.truth_region_ids) - set(outcome.region_ids))
    if unknown:
        raise ValueError(f"case {outcome.case_id}: truth {unknown} is not among its regions")
    return tuple(int(region in outcome.truth_region_ids) for region in outcome.region_ids)


def _check_fits(outcome: CampaignOutcome, what: str, vector: Sequence[int]) -> None:
    if len(vector) != len(outcome.region_ids):
        raise ValueError(
            f"case {outcome.case_id} ({outcome.method}): {what} has {len(vector)} entries for "
            f"{len(outcome.region_ids)} regions"
        )
