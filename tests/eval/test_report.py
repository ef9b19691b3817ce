"""The report: tables that agree with the scorer, valid figures, and the paper's projection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from poirot_eval import blame
from poirot_eval.report import percent, render_report
from poirot_eval.results import CaseResult, TokenUsage
from poirot_eval.scoring import STEP_TOLERANCES, groups, summarise
from poirotd.model import Vote
from poirotd.protocol.projection import anchors, project
from tests.eval.helpers import one_hot, result
from tests.support.data import DATA

CORTEX = blame.region_ids(DATA, "blame-cortex")
EXPERTS = ("excel_expert", "verification_expert", "computer_terminal")
PNG = b"\x89PNG\r\n\x1a\n"


def _votes(ids: tuple[str, ...], voters: dict[str, tuple[str, ...]]) -> list[Vote]:
    return [Vote(agent_id=a, location=one_hot(ids, *loc), weight=0.6) for a, loc in voters.items()]


def _fixture() -> list[CaseResult]:
    cortex = [
        ("doctor",),
        ("doctor",),
        ("parent", "d2w_exoskeleton"),
        ("chief",),
    ]
    results = []
    for i, truth in enumerate(cortex):
        predicted = truth if i % 2 == 0 else ("patient",)
        votes = _votes(
            CORTEX, {"doctor": truth, "chief": ("patient",), "physio_general": predicted}
        )
        results.append(
            result(
                CORTEX,
                truth,
                predicted,
                dataset="blame-cortex",
                case_id=f"cortex_{i}",
                votes=votes,
                tokens=TokenUsage(prompt=1000 * (i + 1), completion=100),
                seconds=10.0 + i,
            )
        )
    results.append(result(CORTEX, ("doctor",), dataset="blame-cortex", status="context_exceeded"))
    for i, (mistaken, step) in enumerate([("excel_expert", 2), ("verification_expert", 4)]):
        results.append(
            result(
                EXPERTS,
                (mistaken,),
                ("excel_expert",),
                case_id=str(i),
                step=3,
                truth_step=step,
                votes=_votes(EXPERTS, {"excel_expert": ("excel_expert",)}),
            )
        )
        results.append(
            result(EXPERTS, (mistaken,), (mistaken,), method="baseline", case_id=str(i), step=step)
        )
    return results


def _table(markdown: str) -> dict[tuple[str, str], dict[str, str]]:
    """Every row of the report's tables (accuracy, then cost), merged by dataset and method."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    header: list[str] = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| dataset"):
            header = cells
        elif header and len(cells) == len(header) and cells[0] in ("blame-cortex", "whowhen"):
            rows.setdefault((cells[0], cells[1]), {}).update(zip(header, cells, strict=True))
    return rows


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render_report(_fixture(), tmp_path_factory.mktemp("report"))


def test_report_numbers_match_the_scorer(rendered: Path) -> None:
    results = _fixture()
    table = _table(rendered.read_text())
    assert len(table) == 3
    for (dataset, method, _), rows in groups(results).items():
        s = summarise(rows)
        row = table[(dataset, method)]
        assert (row["n"], row["ok"], row["context_exceeded"]) == (
            str(s.n),
            str(s.ok),
            str(s.context_exceeded),
        )
        assert row["agent acc"] == percent(s.attribution)
        assert row["exact k=1"] == percent(s.exact_single)
        assert row["exact k>1"] == percent(s.exact_multi)
        assert row["step exact"] == percent(s.step[0])
        assert [row[f"step ±{k}"] for k in STEP_TOLERANCES[1:]] == [
            percent(s.step[k]) for k in STEP_TOLERANCES[1:]
        ]
        assert row["mean prompt tokens"] == f"{s.mean_prompt_tokens:.0f}"
        assert row["region precision"] == percent(s.region_precision)
        assert row["votes"] == str(s.votes)
    cortex = table[("blame-cortex", "poirot")]
    assert cortex["agent acc"] == "40.0% (2/5)"
    assert cortex["chance 1/2^N"] == "0.781%"
    assert cortex["majority"] == "60.0% (3/5)", "doctor is the truth of 3 of the 5"
    assert table[("whowhen", "poirot")]["step ±1"] == "100.0% (2/2)"
    # CORTEX decisions: 2 exact hits (3 faulty regions decided), 2 one-region misses, a run
    # without decision; faulty regions: 1 + 1 + 2 + 1 + 1.
    assert (cortex["region precision"], cortex["region recall"]) == (
        "60.0% (3/5)",
        "50.0% (3/6)",
    )
    assert (cortex["cases cut to fit"], cortex["votes"], cortex["abstained"]) == ("0", "12", "0")
    assert table[("whowhen", "baseline")]["cached share"] == "—"


def test_report_figures_are_valid_images(rendered: Path) -> None:
    markdown = rendered.read_text()
    figures = sorted(rendered.parent.glob("*.png"))
    # Radar for both voting groups; the projection only where one space is shared (both here).
    assert {f.name.split("-")[0] for f in figures} == {"radar", "radial"}
    assert len(figures) == 4
    for figure in figures:
        assert figure.name in markdown
        assert figure.read_bytes()[:8] == PNG
        assert figure.stat().st_size > 10_000
        height, width = imread(figure).shape[:2]
        assert height > 300 and width > 300
    assert "| doctor | 100.0% (4/4) |" in markdown
    assert "| **aggregate** | 50.0% (2/4) |" in markdown


def test_cases_with_their_own_spaces_get_one_projection_panel_each(tmp_path: Path) -> None:
    """Who&When: every case has its own agents, so one shared plane would mean nothing."""
    spaces = [("planner", "coder", "terminal"), ("searcher", "verifier")]
    rows = [
        result(ids, (ids[0],), (ids[1],), case_id=str(i), votes=_votes(ids, {ids[0]: (ids[1],)}))
        for i, ids in enumerate(spaces)
    ]
    markdown = render_report(rows, tmp_path).read_text()
    (radial,) = tmp_path.glob("radial-*.png")
    assert radial.name in markdown
    height, width = imread(radial).shape[:2]
    assert width > 1.5 * height  # two panels side by side


# ----------------------------------------------------------------- eqs. 11-12


def test_one_hot_vectors_land_on_the_circle_from_the_bottom() -> None:
    points = project(np.eye(4, dtype=int))
    np.testing.assert_allclose(points, [[0, -0.5], [0.5, 0], [0, 0.5], [-0.5, 0]], atol=1e-12)
    np.testing.assert_allclose(np.hypot(*anchors(15).T), 0.5)


def test_zero_vector_is_the_origin_and_several_faults_the_mean() -> None:
    points = project([[0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_allclose(points[0], [0, 0])
    np.testing.assert_allclose(points[1], anchors(5)[:2].mean(axis=0))
    np.testing.assert_allclose(points[2], [0, 0], atol=1e-12)
    assert np.hypot(*points[1]) < 0.5


@pytest.mark.parametrize("n", [7, 15])
def test_anchors_are_evenly_spaced_counter_clockwise_from_the_bottom(n: int) -> None:
    """Eq. 11 by its properties: a point per dimension on the circle, the first at the bottom,
    each next one the same chord (2R sin(pi/N)) further on, turning counter-clockwise."""
    points = anchors(n)
    following = np.roll(points, -1, axis=0)
    assert points.shape == (n, 2)
    np.testing.assert_allclose(points[0], [0, -0.5], atol=1e-12)
    np.testing.assert_allclose(np.hypot(*points.T), 0.5)
    np.testing.assert_allclose(np.hypot(*(following - points).T), np.sin(np.pi / n))
    turn = points[:, 0] * following[:, 1] - points[:, 1] * following[:, 0]
    assert (turn > 0).all(), "counter-clockwise"
    np.testing.assert_allclose(points.sum(axis=0), [0, 0], atol=1e-12)


def test_anchors_of_a_hexagon_scale_with_the_radius() -> None:
    h = np.sqrt(3) / 2
    hexagon = [[0, -1], [h, -0.5], [h, 0.5], [0, 1], [-h, 0.5], [-h, -0.5]]
    np.testing.assert_allclose(anchors(6, radius=2.0), 2 * np.array(hexagon), atol=1e-12)


def test_the_report_compares_methods_run_on_the_same_cases(rendered: Path) -> None:
    text = rendered.read_text()
    assert "## Agreement between methods" in text
    # Case 0: both decide excel_expert; case 1: excel_expert against verification_expert.
    assert "| baseline / poirot | whowhen |  | 50.0% (1/2) |" in text
    assert "blame-cortex |" not in text.split("## Agreement between methods")[1].split("##")[0]
