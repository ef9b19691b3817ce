"""Runs recorded by the POIROT web tool: imported, re-aggregated by poirotd's Phase V within the
recorded rounding, and their session replayed through the daemon as a one-case file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from poirot_eval.case_files import CaseFileError
from poirot_eval.poirot_runs import (
    SCORE_TOLERANCE,
    WEIGHT_TOLERANCE,
    benchmark_spec,
    read_run,
    reaggregate,
    run_case,
    session_length,
)
from poirot_eval.selection import resolve_case
from poirotd.devtools.answers import schema_answer
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import MessageKind
from tests.eval.helpers import lines, run
from tests.support.cli import poirotd
from tests.support.data import DATA, RUNS


@pytest.mark.parametrize("name", ["cortex_182.json", "trading_10.json"])
def test_both_runs_re_aggregate_within_their_rounding(name: str) -> None:
    recorded = json.loads((RUNS / name).read_text())["voting_data"]
    run = read_run(RUNS / name)
    result = reaggregate(run, benchmark_spec(run, DATA))

    assert result.agrees
    for check, vote in zip(result.agents, recorded["agent_votes"], strict=True):
        assert check.weight == pytest.approx(vote["vote_weight"], abs=WEIGHT_TOLERANCE)
    assert result.scores == pytest.approx(recorded["dimension_scores"], abs=SCORE_TOLERANCE)
    assert result.recorded_top == result.top


def test_a_tie_the_tool_broke_by_taking_the_first_region_is_reproduced() -> None:
    # TradingAgents run 103: the trader and the risk manager tie at 5.6333; the tool recorded
    # the trader, the first of the two (numpy's argmax), and flagged the tie itself.
    recorded = json.loads((RUNS / "trading_103.json").read_text())["voting_data"]
    assert recorded["voting_summary"]["is_tie"]
    run = read_run(RUNS / "trading_103.json")
    result = reaggregate(run, benchmark_spec(run, DATA))

    assert [result.region_ids[j] for j in result.top] == ["trader", "risk_manager"]
    assert result.recorded_top == (7,) and result.region_ids[7] == "trader"
    assert result.tie_broken_by_first and result.agrees


def test_a_tools_winner_that_is_not_the_first_of_the_tie_is_not_reproduced(
    tmp_path: Path,
) -> None:
    record = json.loads((RUNS / "trading_103.json").read_text())
    record["voting_data"]["winning_location"]["dimension_index"] = 11
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    run = read_run(path)
    result = reaggregate(run, benchmark_spec(run, DATA))

    assert result.top == (7, 11) and result.recorded_top == (11,)
    assert not result.tie_broken_by_first and not result.agrees


def test_cortex_weights_use_each_agents_recorded_beta() -> None:
    run = read_run(RUNS / "cortex_182.json")
    result = reaggregate(run, benchmark_spec(run, DATA))
    doctor = result.agents[0]
    # The doctor voted physiotherapist + exoskeleton from its own region: d_H = 3 of N = 7.
    assert (doctor.agent_id, doctor.beta) == ("doctor", 0.3536)
    assert doctor.weight == pytest.approx(0.3536 + 0.5 * (1 - 3 / 7))
    assert result.top == (3,) and result.region_ids[3] == "d2w_exoskeleton"


def test_the_all_zero_position_convention_is_selectable() -> None:
    run = read_run(RUNS / "trading_10.json")
    spec = benchmark_spec(run, DATA)
    recorded = reaggregate(run, spec, "as-recorded")
    own = reaggregate(run, spec, "own-region")

    [trader] = [a for a in recorded.agents if a.recorded_position is None]
    assert trader.agent_id == "trader"
    # As recorded: all zeros against an all-zero vote, d_H = 0, w = 0.25 + 0.5.
    assert trader.position is None and trader.weight == pytest.approx(0.75)
    [placed] = [a for a in own.agents if a.agent_id == "trader"]
    # At its own region (The Trader, dimension 7): d_H = 1 of 15.
    assert placed.position == 7 and placed.weight == pytest.approx(0.25 + 0.5 * 14 / 15)
    assert placed.recorded_weight == 0.75
    others = [(a.agent_id, a.weight) for a in own.agents if a.agent_id != "trader"]
    assert others == [(a.agent_id, a.weight) for a in recorded.agents if a.agent_id != "trader"]
    assert not own.agrees and own.weight_error == pytest.approx(0.75 - placed.weight)
    # All votes are zeros: the scores do not depend on the convention.
    assert own.scores == recorded.scores == (0.0,) * 15


def test_the_session_stops_where_the_tools_own_run_begins() -> None:
    run = read_run(RUNS / "cortex_182.json")
    assert not isinstance(run.chat_logs, str)
    assert session_length(run.chat_logs) == 39
    case = run_case(run, benchmark_spec(run, DATA))

    assert (case.dataset, case.case_id) == ("blame-cortex", "poirot_web_182")
    assert case.truth.regions == ("d2w_exoskeleton",)
    assert len(case.messages) == 39
    for m in case.messages:
        assert '"hazard_vector"' not in m.content and "**Request from" not in m.content
        assert not m.content.startswith(("AI Message:", "Human Message:", "Tool: "))
    doctor_calls = case.messages[1]
    assert (doctor_calls.sender, len(doctor_calls.tool_calls)) == ("doctor", 7)
    result = case.messages[2]
    assert (result.kind, result.tool_name) == (MessageKind.TOOL, "perform_cardiopulmonary_test")
    assert (result.sender, result.recipient) == ("doctor", "doctor")
    assert case.messages[-1].sender == "chief"  # the last sensor analysis


def test_a_run_without_chat_logs_has_no_case() -> None:
    run = read_run(RUNS / "trading_10.json")
    with pytest.raises(CaseFileError, match="chat_logs: no session to replay"):
        run_case(run, benchmark_spec(run, DATA))


async def test_the_written_case_replays_through_the_daemon(tmp_path: Path) -> None:
    run_ = read_run(RUNS / "cortex_182.json")
    path = tmp_path / "case.json"
    path.write_text(run_case(run_, benchmark_spec(run_, DATA)).model_dump_json())
    case = resolve_case(str(path), DATA)

    recorder = await run(
        [case], tmp_path / "out", ScriptedBackend(schema_answer, context_tokens=16384)
    )
    assert [r.status for r in recorder.finished] == ["ok"], recorder.finished
    [row] = lines(tmp_path / "out")
    assert (row["dataset"], row["case_id"]) == ("blame-cortex", "poirot_web_182")
    assert row["truth"]["regions"] == ["d2w_exoskeleton"]


def variant(tmp_path: Path, *dropped: str, **changes: Any) -> Path:
    record = json.loads((RUNS / "cortex_182.json").read_text()) | changes
    for field in dropped:
        del record[field]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    return path


def test_a_run_that_does_not_fit_the_format_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(CaseFileError, match=r"run.json: voting_data: Field required; expected"):
        read_run(variant(tmp_path, "voting_data"))
    votes = json.loads((RUNS / "cortex_182.json").read_text())["voting_data"]
    votes["agent_votes"][1]["voted_location"] = [0, 1]
    with pytest.raises(CaseFileError, match=r"agent_votes.1.voted_location: 2 entries for 7"):
        read_run(variant(tmp_path, voting_data=votes))
    with pytest.raises(CaseFileError, match=r"system: 'AutoGen' is not one of"):
        read_run(variant(tmp_path, system="AutoGen"))


def test_import_run_prints_the_comparison_and_writes_the_case(tmp_path: Path) -> None:
    case_file = tmp_path / "case.json"
    cortex = poirotd(
        "eval", "import-run", str(RUNS / "cortex_182.json"), "--data-dir", str(DATA),
        "--case-out", str(case_file),
    )  # fmt: skip
    assert cortex.returncode == 0, cortex.stderr
    assert "reproduced: largest differences" in cortex.stdout
    spec = tmp_path / "spec.yaml"
    written = poirotd("eval", "spec", str(case_file), "-o", str(spec), "--data-dir", str(DATA))
    assert written.returncode == 0, written.stderr

    args = ["eval", "import-run", str(RUNS / "trading_10.json"), "--data-dir", str(DATA)]
    assert poirotd(*args).returncode == 0
    own = poirotd(*args, "--zero-position", "own-region")
    assert own.returncode == 1 and "NOT reproduced" in own.stdout
    no_case = poirotd(*args, "--case-out", str(tmp_path / "t.json"))
    assert no_case.returncode == 2 and "no session to replay" in no_case.stderr


def test_import_run_names_the_tie_the_tool_broke() -> None:
    tie = poirotd("eval", "import-run", str(RUNS / "trading_103.json"), "--data-dir", str(DATA))
    assert tie.returncode == 0, tie.stdout
    verdict = " ".join(tie.stdout.split())
    assert "reproduced: largest differences" in verdict
    assert "a tie between trader, risk_manager, which the tool broke by taking the first" in verdict
