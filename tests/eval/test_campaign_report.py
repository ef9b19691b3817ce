"""Campaign scores and figures on small hand-made results: by fault kind and region, the
confusion matrix, region precision/recall and the MAST-mode F1s."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread

from poirot_eval.cases import FaultKind, GroundTruth, InjectedFault
from poirot_eval.report import render_report
from poirot_eval.results import CaseResult
from poirot_eval.scoring import (
    NO_REGION,
    SEVERAL_REGIONS,
    Ratio,
    campaign_scores,
    predicted_mode,
)
from poirotd.model import InvestigationMethod, Vote
from tests.eval.helpers import one_hot

IDS = ("planner", "trader", "feed")


def _result(
    case_id: str,
    truth: str,
    kind: FaultKind,
    predicted: tuple[str, ...],
    *,
    mode: str | None = None,
    said: str | None = None,
    method: InvestigationMethod = "errorprobe",
    status: str = "ok",
) -> CaseResult:
    votes = (
        (
            Vote(
                agent_id="strategist",
                location=one_hot(IDS, *predicted),
                hazard_vector=f"{said} Some name",
                weight=1.0,
            ),
        )
        if said
        else ()
    )
    return CaseResult.model_validate(
        {
            "case_id": case_id,
            "dataset": "campaign",
            "method": method,
            "status": status,
            "region_ids": IDS,
            "decision": one_hot(IDS, *predicted) if status == "ok" else (),
            "truth": GroundTruth(
                regions=(truth,),
                step=1 if kind != "feed" else None,
                fault=InjectedFault(kind=kind, operator=f"op_{kind}", mode=mode),
            ),
            "votes": votes,
        }
    )


def _results() -> list[CaseResult]:
    return [
        _result("a", "trader", "agent_response", ("trader",), mode="MAST-3", said="MAST-3"),
        _result("b", "trader", "agent_response", ("planner",), mode="MAST-3", said="MAST-9"),
        _result("c", "planner", "agent_prompt", ("planner",), mode="MAST-9", said="MAST-9"),
        _result("d", "feed", "feed", ("feed", "trader"), said="MAST-1"),
        _result("e", "feed", "feed", (), status="failed"),
    ]


def test_scores_by_fault() -> None:
    scores = campaign_scores(_results())
    assert scores is not None
    assert scores.by_kind == {
        "agent_prompt": Ratio(1, 1),
        "agent_response": Ratio(1, 2),
        "feed": Ratio(0, 2),
    }
    assert scores.by_region == {"feed": Ratio(0, 2), "planner": Ratio(1, 1), "trader": Ratio(1, 2)}
    assert scores.confusion == {
        "feed": {NO_REGION: 1, SEVERAL_REGIONS: 1},
        "planner": {"planner": 1},
        "trader": {"planner": 1, "trader": 1},
    }
    # planner decided in b (wrong) and c (right); trader in a (right) and d (wrong); feed in d.
    assert scores.region_pr["planner"] == (Ratio(1, 2), Ratio(1, 1))
    assert scores.region_pr["trader"] == (Ratio(1, 2), Ratio(1, 2))
    assert scores.region_pr["feed"] == (Ratio(1, 1), Ratio(1, 2))


def test_mode_scores_as_aegis_reports_them() -> None:
    scores = campaign_scores(_results())
    assert scores is not None and scores.modes is not None
    # Truth modes: a MAST-3, b MAST-3, c MAST-9; predicted MAST-3, MAST-9, MAST-9.
    assert scores.modes.accuracy == Ratio(2, 3)
    # MAST-3: tp 1, fn 1 -> F1 2/3; MAST-9: tp 1, fp 1 -> F1 2/3.
    assert scores.modes.macro_f1 == pytest.approx(2 / 3)
    assert scores.modes.micro_f1 == pytest.approx(2 / 3)


def test_a_method_that_names_no_mode_has_no_mode_scores() -> None:
    plain = [
        _result("a", "trader", "agent_response", ("trader",), mode="MAST-3", method="baseline"),
        _result("b", "feed", "feed", ("feed",), method="baseline"),
    ]
    scores = campaign_scores(plain)
    assert scores is not None and scores.modes is None
    assert predicted_mode(plain[0]) is None
    assert campaign_scores([r.model_copy(update={"truth": GroundTruth(regions=("feed",))})
                            for r in plain]) is None  # fmt: skip


def test_abstaining_lowers_micro_precision_not_recall() -> None:
    results = [
        _result("a", "trader", "agent_response", ("trader",), mode="MAST-3", said="MAST-3"),
        _result("b", "trader", "agent_response", ("trader",), mode="MAST-3", status="failed"),
    ]
    scores = campaign_scores(results)
    assert scores is not None and scores.modes is not None
    # precision 1/1, recall 1/2 -> micro F1 2/3; MAST-3 alone: tp 1, fn 1 -> 2/3.
    assert scores.modes.micro_f1 == pytest.approx(2 / 3)
    assert scores.modes.accuracy == Ratio(1, 2)


def test_report_has_the_campaign_section_and_figures(tmp_path: Path) -> None:
    results = _results() + [
        r.model_copy(update={"method": "baseline", "votes": ()}) for r in _results()
    ]
    report = render_report(results, tmp_path).read_text()
    assert "## Campaign: accuracy by fault" in report
    assert "| errorprobe |  | 100.0% (1/1) | 50.0% (1/2) | 0.0% (0/2) |" in report
    assert "| errorprobe |  | 66.7% (2/3) | 0.667 | 0.667 |" in report
    assert "| baseline |  | 66.7%" not in report  # the baseline names no mode
    for name in ("campaign-by-kind.png", "confusion-errorprobe.png", "confusion-baseline.png"):
        assert f"]({name})" in report
        image = imread(tmp_path / name)
        assert image.shape[0] > 100 and image.shape[1] > 100
