"""Scoring: the recorded POIROT runs score as recorded; hand-made cases pin every metric."""

from __future__ import annotations

from typing import Any

import pytest

from poirot_eval import blame
from poirot_eval.results import CaseResult, TokenUsage
from poirot_eval.scoring import (
    Ratio,
    agreement,
    attribution_hit,
    confusion,
    exact_match,
    per_agent,
    step_hit,
    summarise,
    truth_vector,
)
from poirotd.model import Vote
from tests.eval.helpers import one_hot, recorded, recorded_result, result
from tests.support.data import DATA

CORTEX = blame.region_ids(DATA, "blame-cortex")
EXPERTS = ("dataverification_expert", "verification_expert", "computer_terminal")

# ----------------------------------------------------------------- recorded POIROT-web runs


def test_cortex_182_scores_as_recorded() -> None:
    run = recorded("cortex_182.json")
    comparison = run["voting_data"]["ground_truth_comparison"]
    res = recorded_result("cortex_182.json", "blame-cortex")

    assert attribution_hit(res) is comparison["is_correct"] is True
    assert confusion(res.decision, truth_vector(res)) == (
        comparison["true_positives"],
        comparison["false_positives"],
        comparison["false_negatives"],
        comparison["true_negatives"],
    )
    # The doctor voted physiotherapist + exoskeleton; chief and physiotherapist the exoskeleton.
    stats = per_agent([res])
    assert {a: (r.hits, r.total) for a, r in stats.agents.items()} == {
        "doctor": (0, 1),
        "chief": (1, 1),
        "physio_general": (1, 1),
    }
    assert (stats.aggregate.hits, stats.aggregate.total) == (1, 1)


def test_cortex_182_truth_is_blame_case_30_not_100() -> None:
    # The run's metadata says cortex_session "100", a POIROT-web session number: its recorded
    # truth (Sensor-Broken alone) is BLAME's cortex_session_30, while BLAME's case 100 has five
    # faults. Scoring must use the run's own truth.
    run = recorded("cortex_182.json")
    res = recorded_result("cortex_182.json", "blame-cortex")
    index = blame.truth_index(DATA, "blame-cortex")
    assert run["metadata"]["injected_hazards"] == "Sensor-Broken"
    assert res.truth == index["cortex_session_30"] != index["cortex_session_100"]


def test_trading_10_scores_as_recorded() -> None:
    # Every agent voted all zeros, the consensus is the zero vector, and the run logged no
    # injected fault (truth all zeros): POIROT-web records it as incorrect.
    run = recorded("trading_10.json")
    res = recorded_result("trading_10.json", "blame-trading")
    assert len(res.region_ids) == 15
    assert attribution_hit(res) is run["metadata"]["is_correct"] is False
    stats = per_agent([res])
    assert len(stats.agents) == 12
    assert all(r.hits == 0 and r.total == 1 for r in stats.agents.values())


# ----------------------------------------------------------------- exact vectors (BLAME)


def test_exact_match_needs_every_bit_and_a_fault() -> None:
    assert exact_match([1, 0, 1], [1, 0, 1])
    assert not exact_match([1, 0, 0], [1, 0, 1])
    assert not exact_match([1, 1, 1], [1, 0, 1])
    assert not exact_match([0, 0, 0], [0, 0, 0])
    assert not exact_match([], [1, 0, 0])


def test_blame_summary_splits_single_and_multi_fault() -> None:
    kw: dict[str, Any] = {"dataset": "blame-cortex"}
    results = [
        result(CORTEX, ["doctor"], ["doctor"], **kw),  # k=1 hit
        result(CORTEX, ["chief"], ["doctor"], **kw),  # k=1 miss
        result(CORTEX, ["doctor", "parent"], ["doctor", "parent"], **kw),  # k=2 hit
        result(CORTEX, ["doctor", "parent"], ["doctor"], **kw),  # k=2 miss (a subset)
        result(CORTEX, ["patient"], status="context_exceeded", **kw),  # k=1, counts as a miss
    ]
    s = summarise(results)
    assert (s.n, s.ok, s.context_exceeded, s.failed) == (5, 4, 1, 0)
    assert (s.attribution.hits, s.attribution.total) == (2, 5)
    assert (s.exact_single.hits, s.exact_single.total) == (1, 3)
    assert (s.exact_multi.hits, s.exact_multi.total) == (1, 2)
    assert all(r.total == 0 and r.value is None for r in s.step.values())
    assert s.chance_region == pytest.approx(1 / 7)
    assert s.chance_vector == pytest.approx(1 / 128)


def test_majority_is_the_most_frequent_truth_of_each_system() -> None:
    """Always naming one answer per system, the best one in hindsight: 3 of the CORTEX cases
    share a truth, and each of the other system's two truths counts once."""
    results = [
        result(CORTEX, ["d2w_exoskeleton"], ["doctor"]),
        result(CORTEX, ["d2w_exoskeleton"], ["doctor"]),
        result(CORTEX, ["d2w_exoskeleton"], status="failed"),
        result(CORTEX, ["chief"], ["chief"]),
        result(EXPERTS, ["computer_terminal"]),
        result(EXPERTS, ["verification_expert"]),
    ]
    majority = summarise(results).majority
    assert (majority.hits, majority.total) == (4, 6)
    assert summarise([]).majority.value is None


# ----------------------------------------------------------------- agent and step (Who&When)


def original_agent_hit(actual: str, predicted: str) -> bool:
    """Automated_FA/evaluate.py's test, kept here only to show where it goes wrong."""
    return actual in predicted


def test_agent_match_is_by_id_not_substring() -> None:
    res = result(EXPERTS, ["verification_expert"], ["dataverification_expert"])
    assert original_agent_hit("Verification_Expert", "DataVerification_Expert")
    assert not attribution_hit(res)
    assert attribution_hit(result(EXPERTS, ["verification_expert"], ["verification_expert"]))


def test_step_match_is_by_number_not_substring() -> None:
    res = result(EXPERTS, ["verification_expert"], step=12, truth_step=1)
    assert original_agent_hit("1", "12")  # the original's step test is the same substring test
    assert not step_hit(res, 0)
    assert not step_hit(res, 3)


def test_a_tie_naming_two_agents_is_not_a_hit() -> None:
    res = result(EXPERTS, ["verification_expert"], ["verification_expert", "computer_terminal"])
    assert not attribution_hit(res)


def test_step_accuracy_exact_and_within_k() -> None:
    truth = ["verification_expert"]
    results = [
        result(EXPERTS, truth, truth, step=5, truth_step=5),
        result(EXPERTS, truth, truth, step=6, truth_step=5),
        result(EXPERTS, truth, step=2, truth_step=5),
        result(EXPERTS, truth, truth, step=None, truth_step=5),
        result(EXPERTS, truth, truth, step=9, truth_step=5),
        result(EXPERTS, truth, status="failed", truth_step=5),
    ]
    s = summarise(results)
    assert {k: (r.hits, r.total) for k, r in s.step.items()} == {0: (1, 6), 1: (2, 6), 3: (3, 6)}
    assert (s.attribution.hits, s.failed) == (4, 1)
    assert s.chance_region == pytest.approx(1 / 3)


def test_per_agent_votes_are_judged_alone() -> None:
    truth = ["verification_expert"]
    good = Vote(agent_id="verification_expert", location=one_hot(EXPERTS, *truth))
    wrong = Vote(agent_id="dataverification_expert", location=one_hot(EXPERTS, "computer_terminal"))
    abstained = Vote(agent_id="dataverification_expert", abstention_reason="no answer")
    results = [
        result(EXPERTS, truth, truth, votes=[good, wrong]),
        result(EXPERTS, truth, ["computer_terminal"], votes=[good, abstained]),
        result(EXPERTS, truth, status="failed", votes=[good]),  # unfinished: not counted
    ]
    stats = per_agent(results)
    assert {a: (r.hits, r.total) for a, r in stats.agents.items()} == {
        "dataverification_expert": (0, 2),
        "verification_expert": (2, 2),
    }
    assert (stats.aggregate.hits, stats.aggregate.total) == (1, 2)


def test_result_is_one_jsonl_line_and_checks_its_sizes() -> None:
    vote = Vote(agent_id="verification_expert", location=(0, 1, 0), step=2, weight=0.7)
    res = result(EXPERTS, ["verification_expert"], ["verification_expert"], votes=[vote])
    line = res.model_dump_json()
    assert "\n" not in line
    assert CaseResult.model_validate_json(line) == res
    assert res.predicted_regions == ("verification_expert",)
    with pytest.raises(ValueError, match="decision"):
        CaseResult.model_validate({**res.model_dump(), "decision": (1, 0)})
    with pytest.raises(ValueError, match="outside the space"):
        CaseResult.model_validate({**res.model_dump(), "truth": {"regions": ["excel_expert"]}})


def test_summary_counts_votes_by_how_they_ended_and_the_cached_share() -> None:
    ids = ("a", "b")
    votes = [
        Vote(agent_id="a", location=(1, 0)),
        Vote(agent_id="b", abstention_reason="vote: invalid JSON"),
        Vote(agent_id="a", location=(0, 1), forced_by="invocation_limit"),
        Vote(agent_id="b", location=(0, 1), forced_by="context_full"),
    ]
    results = [
        result(ids, ["a"], ["a"], votes=votes[:2], tokens=TokenUsage(prompt=100, cached=60)),
        result(ids, ["a"], ["b"], votes=votes[2:], tokens=TokenUsage(prompt=300, cached=40)),
    ]
    s = summarise([r.model_copy(update={"context_cuts": i * 2}) for i, r in enumerate(results)])
    assert (s.votes, s.abstained, s.forced_at_limit, s.forced_by_context) == (4, 1, 1, 1)
    assert s.cached_share == pytest.approx(0.25)
    assert s.cut_cases == 1
    assert (s.region_precision, s.region_recall) == (Ratio(1, 2), Ratio(1, 2))


def test_agreement_counts_the_cases_both_methods_finished() -> None:
    ids = ("a", "b", "c")
    results = [
        result(ids, ("a",), ("a",), method="echo", case_id="1"),
        result(ids, ("a",), ("a",), method="errorprobe", case_id="1"),
        result(ids, ("a",), ("b",), method="ensemble", case_id="1"),
        result(ids, ("b",), ("b",), method="echo", case_id="2"),
        result(ids, ("b",), ("b",), method="errorprobe", case_id="2", status="failed"),
        result(ids, ("b",), ("b",), method="ensemble", case_id="2"),
        result(ids, ("b",), ("b",), method="echo", case_id="3", dataset="tracertraj"),
    ]
    assert agreement(results) == {
        ("whowhen", ""): {
            ("echo", "ensemble"): Ratio(1, 2),
            ("echo", "errorprobe"): Ratio(1, 1),
            ("ensemble", "errorprobe"): Ratio(0, 1),
        }
    }
