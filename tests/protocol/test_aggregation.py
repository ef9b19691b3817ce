"""Phase V against the paper's recorded runs, plus the decision rules' edge cases."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from poirotd.config.spec import DecisionRuleSpec
from poirotd.model import HazardRegion, HazardSpace, Vote
from poirotd.protocol.aggregation import aggregate, consensus_step, score, weigh, weights
from tests.support.data import RUNS

ARGMAX = DecisionRuleSpec()


def _recorded(name: str) -> dict[str, Any]:
    path = RUNS / name
    data: dict[str, Any] = json.loads(path.read_text())["voting_data"]
    return data


@pytest.mark.parametrize("run", ["cortex_182.json", "trading_10.json", "trading_103.json"])
def test_recorded_runs_are_reproduced(run: str) -> None:
    data = _recorded(run)
    votes = data["agent_votes"]
    positions = [v["agent_position"] for v in votes]
    locations = [v["voted_location"] for v in votes]
    beta = [0.25 if v["baseline"] is None else v["baseline"] for v in votes]

    w, attribution = score(positions, locations, beta, ARGMAX)

    np.testing.assert_allclose(w, [v["vote_weight"] for v in votes], atol=1e-4)
    np.testing.assert_allclose(attribution.scores, data["dimension_scores"], atol=1e-3)
    assert attribution.tie == data["voting_summary"]["is_tie"]


def test_cortex_run_picks_the_exoskeleton() -> None:
    data = _recorded("cortex_182.json")
    votes = data["agent_votes"]
    _, attribution = score(
        [v["agent_position"] for v in votes],
        [v["voted_location"] for v in votes],
        [v["baseline"] for v in votes],
        ARGMAX,
    )
    assert attribution.top == (data["winning_location"]["dimension_index"],)
    assert attribution.decision == tuple(data["winning_location"]["vector"])


def test_trading_run_all_zero_votes_mean_no_anomaly() -> None:
    # Every agent voted all zeros; the trader's recorded position is all zeros too (weight 0.75).
    votes = _recorded("trading_10.json")["agent_votes"]
    w, attribution = score(
        [v["agent_position"] for v in votes], [v["voted_location"] for v in votes], 0.25, ARGMAX
    )
    assert w[-1] == pytest.approx(0.75)
    assert attribution.top == ()
    assert attribution.tie is False
    assert attribution.decision == (0,) * 15


def _space(n_agents: int = 3, extra: int = 1) -> HazardSpace:
    regions = [
        HazardRegion(id=f"a{i}", name=f"A{i}", type="agent", description="-")
        for i in range(n_agents)
    ]
    regions += [
        HazardRegion(id=f"c{i}", name=f"C{i}", type="hardware", description="-")
        for i in range(extra)
    ]
    return HazardSpace(system="s", version="v", regions=tuple(regions), source="pinned")


def test_weight_formula() -> None:
    # N = 4; a0 at [1,0,0,0] votes for itself (d=0), a1 votes a0 and c0 (d=3).
    w = weights([[1, 0, 0, 0], [0, 1, 0, 0]], [[1, 0, 0, 0], [1, 0, 0, 1]], 0.25)
    np.testing.assert_allclose(w, [0.75, 0.25 + 0.5 * (1 - 3 / 4)])


def test_ties_are_reported_not_broken() -> None:
    space = _space()
    votes = [
        Vote(agent_id="a0", location=(0, 1, 0, 0)),
        Vote(agent_id="a1", location=(1, 0, 0, 0)),
    ]
    attribution = aggregate(space, votes, 0.25, ARGMAX)
    assert attribution.tie is True
    assert attribution.top == (0, 1)
    assert attribution.decision == (1, 1, 0, 0)
    assert attribution.rule == "argmax"


def test_threshold_rule_keeps_regions_near_the_top() -> None:
    space = _space()
    votes = [
        Vote(agent_id="a0", location=(0, 0, 0, 1)),  # d=2: w = 0.25 + 0.5*(1-2/4) = 0.5
        Vote(agent_id="a1", location=(0, 0, 0, 1)),  # 0.5
        Vote(agent_id="a2", location=(0, 0, 1, 0)),  # d=0: 0.75
    ]
    rule = DecisionRuleSpec(rule="threshold", tau=0.7)
    attribution = aggregate(space, votes, 0.25, rule)
    assert attribution.scores == pytest.approx((0.0, 0.0, 0.75, 1.0))
    assert attribution.top == (3,)
    assert attribution.decision == (0, 0, 1, 1)
    assert attribution.rule == "threshold(tau=0.7)"
    strict = aggregate(space, votes, 0.25, DecisionRuleSpec(rule="threshold", tau=0.8))
    assert strict.decision == (0, 0, 0, 1)


def test_abstentions_are_excluded() -> None:
    space = _space()
    votes = [
        Vote(agent_id="a0", location=(0, 0, 0, 1)),
        Vote(agent_id="a1", abstention_reason="turn 1: no valid answer"),
    ]
    attribution = aggregate(space, votes, 0.25, ARGMAX)
    assert attribution.scores == pytest.approx((0.0, 0.0, 0.0, 0.5))
    assert [weigh(space, v, 0.25).weight for v in votes] == pytest.approx([0.5, 0.0])


def test_no_anomaly_when_every_vote_is_all_zeros() -> None:
    space = _space()
    votes = [Vote(agent_id=f"a{i}", location=(0, 0, 0, 0)) for i in range(3)]
    attribution = aggregate(space, votes, 0.25, ARGMAX)
    assert attribution.top == ()
    assert attribution.tie is False
    assert attribution.decision == (0, 0, 0, 0)
    assert all(weigh(space, v, 0.25).weight == pytest.approx(0.25 + 0.5 * 3 / 4) for v in votes)


# ------------------------------------------------------------------ "when"


def _stepped(agent: str, step: int | None, weight: float) -> Vote:
    return Vote(agent_id=agent, location=(0, 0, 0, 1), weight=weight, step=step)


def test_consensus_step_is_the_heaviest_step() -> None:
    votes = [_stepped("a0", 5, 0.5), _stepped("a1", 3, 0.3), _stepped("a2", 3, 0.3)]
    assert consensus_step(votes) == 3  # 0.6 for #3 beats 0.5 for #5


def test_consensus_step_tie_goes_to_the_earliest() -> None:
    votes = [_stepped("a0", 7, 0.5), _stepped("a1", 2, 0.25), _stepped("a2", 2, 0.25)]
    assert consensus_step(votes) == 2


def test_consensus_step_ignores_abstentions_and_votes_without_a_step() -> None:
    votes = [
        _stepped("a0", None, 0.75),
        Vote(agent_id="a1", abstention_reason="vote: no valid answer", step=1),
        _stepped("a2", 4, 0.25),
    ]
    assert consensus_step(votes) == 4
    assert consensus_step(votes[:2]) is None
    assert consensus_step([]) is None


def test_aggregate_carries_the_consensus_step() -> None:
    space = _space()
    votes = [weigh(space, _stepped(f"a{i}", step, 0.0), 0.25) for i, step in enumerate((6, 6, 1))]
    assert aggregate(space, votes, 0.25, ARGMAX).step == 6
    assert (
        aggregate(space, [v.model_copy(update={"step": None}) for v in votes], 0.25, ARGMAX).step
        is None
    )
