"""The time-to-attribution bench's pure parts: case conversion, vote test, report section."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import tta
from bench.report import begin_marker, end_marker, replace_section
from bench.sections.tta import render
from bench.tta import (
    RUN_TIMEOUT_S,
    SIDES,
    Call,
    Case,
    Run,
    Side,
    Sitting,
    library_job,
    library_vote_valid,
    load_case,
    load_runs,
    party_id,
    poirotd_spec,
    save_runs,
)
from poirotd.model import MessageKind

CASE = {
    "question": "How many?",
    "mistake_agent": "Excel_Expert",
    "system_prompt": {
        "Excel_Expert": "You read spreadsheets.",
        "Check_Expert": "You verify.",
        "Silent_Expert": "You never speak.",
    },
    "history": [
        {"content": "task", "role": "assistant", "name": "Excel_Expert"},
        {"content": "exitcode: 0", "role": "user", "name": "Computer_terminal"},
        {"content": "looks right", "role": "assistant", "name": "Check_Expert"},
        {"content": "TERMINATE", "role": "assistant", "name": "Excel_Expert"},
    ],
}


def _case(tmp_path: Path) -> Case:
    path = tmp_path / "7.json"
    path.write_text(json.dumps(CASE))
    return load_case(path)


def test_speaking_prompts_are_agents_other_speakers_components(tmp_path: Path) -> None:
    case = _case(tmp_path)
    assert [a.id for a in case.agents] == ["excel_expert", "check_expert"]
    assert [c.id for c in case.components] == ["computer_terminal"]
    assert case.truth == "excel_expert"
    kinds = [(m.kind, m.sender, m.recipient) for m in case.messages]
    assert kinds[1] == (MessageKind.TOOL, "computer_terminal", "")
    assert [m.index for m in case.messages] == [0, 1, 2, 3]


def test_library_histories_hold_each_message_once_per_recipient(tmp_path: Path) -> None:
    histories = _case(tmp_path).histories
    # The next other agent to speak receives a message; the last one goes back to the previous.
    assert [(m.own, m.sender, m.content) for m in histories["check_expert"]] == [
        (False, "excel_expert", "task"),
        (False, "computer_terminal", "exitcode: 0"),
        (True, "check_expert", "looks right"),
        (False, "excel_expert", "TERMINATE"),
    ]
    assert [(m.own, m.content) for m in histories["excel_expert"]] == [
        (True, "task"),
        (False, "looks right"),
        (True, "TERMINATE"),
    ]


def test_both_sides_get_the_same_pinned_space_and_limit(tmp_path: Path) -> None:
    case = _case(tmp_path)
    spec = poirotd_spec(case, "http://127.0.0.1:1/v1", 300)
    job = library_job(case, "http://127.0.0.1:1/v1", 300)
    assert spec.hazard_space is not None
    pinned = [r.model_dump() for r in spec.hazard_space.regions]
    assert job["error_space"]["error_regions"] == pinned
    assert [r["id"] for r in pinned] == ["excel_expert", "check_expert", "computer_terminal"]
    p = spec.protocol
    assert {p.report_max_tokens, p.turn_max_tokens, p.answer_max_tokens, job["max_tokens"]} == {300}


def test_party_ids_are_spec_identifiers() -> None:
    assert party_id("Python_ScikitLearn-Expert") == "python_scikitlearn_expert"
    assert party_id("3D_Expert") == "p_3d_expert"


def test_library_vote_valid_is_the_vote_schema() -> None:
    assert library_vote_valid([0, 1, 0], 3)
    assert not library_vote_valid([0, 1], 3)
    assert not library_vote_valid([0, 2, 0], 3)
    assert not library_vote_valid([False, True, False], 3)
    assert not library_vote_valid("x2", 3)


def test_render_replaces_only_its_own_section() -> None:
    call = Call(768, 1000, 200, 400, "stop", 200, 3.0)
    runs = [
        Run("poirotd", "7", 2, 3, 10.0, 2, ["excel_expert"], "excel_expert", calls=[call]),
        Run("library", "7", 2, 3, 40.0, 1, ["check_expert"], "excel_expert", calls=[call, call]),
    ]
    section = render(
        runs,
        768,
        [Sitting(datetime(2026, 1, 1, tzinfo=UTC), "`abc1234`")],
        RUN_TIMEOUT_S,
        tta.EMBEDDED,
    )
    assert section.startswith(begin_marker("bench.tta")) and section.endswith(
        end_marker("bench.tta")
    )
    assert "0.25x" in section and "2/2 (100%)" in section
    other = f"{begin_marker('bench.ingest quick')}\nkept\n{end_marker('bench.ingest quick')}"
    once = replace_section(f"# B\n\n{other}\n", "bench.tta", section)
    twice = replace_section(once, "bench.tta", section.replace("0.25x", "0.30x"))
    assert other in twice and "0.30x" in twice and "0.25x" not in twice


def test_saved_runs_render_again(tmp_path: Path) -> None:
    call = Call(None, 1000, 200, None, "length", 200, 3.0)
    runs = [Run("library", "7", 2, 3, 40.0, 1, ["check_expert"], "excel_expert", calls=[call])]
    sittings = [Sitting(datetime(2026, 1, 1, tzinfo=UTC), "`abc1234`", "machine idle", ["7"])]
    save_runs(tmp_path / "runs.json", sittings, 512, runs)
    assert load_runs(tmp_path / "runs.json") == (sittings, 512, runs, tta.EMBEDDED)
    section = " ".join(render(runs, 512, sittings, RUN_TIMEOUT_S, tta.EMBEDDED).split())
    assert "limits seen in requests: None" in section
    assert "- 2026-01-01 00:00 UTC, commit `abc1234`: cases 7; machine idle." in section


def test_a_resumed_run_says_so_and_skips_the_cases_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "runs.json"
    first = Sitting(datetime(2026, 1, 1, tzinfo=UTC), "`abc1234`")
    kept = [Run(side, "7", 2, 3, 40.0, 1, ["x"], "x") for side in SIDES]
    save_runs(saved, [first], 512, kept)
    ran: list[tuple[str, str]] = []

    def investigate(side: Side, case: Any, max_tokens: int, logs: Path, _: Any) -> Run:
        ran.append((case.case_id, side))
        return Run(side, case.case_id, 2, 3, 10.0, 1, ["x"], "x")

    monkeypatch.setattr(tta, "ensure_library_venv", lambda: None)
    monkeypatch.setattr(tta, "load_case", lambda path: SimpleNamespace(case_id=path.stem))
    monkeypatch.setattr(tta, "investigate", investigate)
    data = ["--data", str(tmp_path)]
    tta.main([*data, "--cases", "7", "8", "--runs", str(saved), "--no-write", "--note", "idle"])

    assert ran == [("8", "poirotd"), ("8", "library")]
    sittings, _, runs, _ = load_runs(saved)
    assert sittings[0] == first and len(sittings) == 2
    assert (sittings[1].note, sittings[1].cases) == ("idle", ["8"])
    assert [(r.case_id, r.side) for r in runs] == [("7", s) for s in SIDES] + ran
    section = " ".join(render(runs, 512, sittings, RUN_TIMEOUT_S, tta.EMBEDDED).split())
    assert "commit `abc1234`: cases not recorded." in section and ": cases 8; idle." in section
    with pytest.raises(SystemExit):
        tta.main([*data, "--cases", "7", "--runs", str(saved), "--max-tokens", "256", "--no-write"])


def test_the_cases_come_from_the_data_folder_the_user_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class ReadError(Exception):
        """Stops the bench at its first case, carrying the file it would read."""

    def load_case(path: Path) -> None:
        raise ReadError(path)

    monkeypatch.setattr(tta, "ensure_library_venv", lambda: None)
    monkeypatch.setattr(tta, "load_case", load_case)
    monkeypatch.delenv("POIROTD_EVAL_DATA", raising=False)
    with pytest.raises(SystemExit):
        tta.main(["--cases", "7", "--no-write"])
    assert "--data (or POIROTD_EVAL_DATA)" in capsys.readouterr().err
    monkeypatch.setenv("POIROTD_EVAL_DATA", str(tmp_path))
    with pytest.raises(ReadError) as read:
        tta.main(["--cases", "7", "--no-write"])
    assert read.value.args == (tmp_path / "whowhen" / "Algorithm-Generated" / "7.json",)


def test_a_run_without_attribution_makes_its_side_a_lower_bound() -> None:
    runs = [
        Run("poirotd", "7", 2, 3, 10.0, 2, ["excel_expert"], "excel_expert"),
        Run("library", "7", 2, 3, 40.0, 0, [], "excel_expert", error="timed out"),
    ]
    section = render(
        runs,
        512,
        [Sitting(datetime(2026, 1, 1, tzinfo=UTC), "`abc1234`")],
        RUN_TIMEOUT_S,
        tta.EMBEDDED,
    )
    assert "≥ 40 s" in section and "≤ 0.25x" in section and "none: timed out" in section


def test_the_library_paragraph_says_how_its_runs_ended() -> None:
    runs = [
        Run("library", "7", 2, 3, 1800.0, 0, [], "x", error="timed out"),
        Run("library", "8", 2, 3, 1700.0, 0, ["Unknown"], "x"),
        Run("poirotd", "8", 2, 3, 300.0, 2, ["x"], "x"),
    ]
    sittings = [Sitting(datetime(2026, 1, 1, tzinfo=UTC), "`a`")]
    section = " ".join(render(runs, 512, sittings, RUN_TIMEOUT_S, tta.EMBEDDED).split())
    assert "1 of 2 runs ended at the time limit" in section
    assert "The 1 that finished had 0/2 valid votes" in section and "named Unknown." in section


def test_an_external_servers_url_keeps_its_path_and_refuses_other_schemes() -> None:
    assert tta.Upstream.of("http://gpu-host:8000/v1") == tta.Upstream("gpu-host", 8000, "")
    assert tta.Upstream.of("http://gw/vllm/v1/") == tta.Upstream("gw", 80, "/vllm")
    with pytest.raises(ValueError, match="http://"):
        tta.Upstream.of("https://gpu-host/v1")


def test_without_a_server_log_evaluated_is_prompt_less_cached(tmp_path: Path) -> None:
    proxy = SimpleNamespace(log=None)
    body = json.dumps({"max_tokens": 64}).encode()
    usage = {"prompt_tokens": 900, "completion_tokens": 12}
    answer = {"usage": usage, "choices": [{"finish_reason": "stop"}]}
    plain = tta._call(body, json.dumps(answer).encode(), 200, 1.0, proxy, 0)  # type: ignore[arg-type]
    usage["prompt_tokens_details"] = {"cached_tokens": 640}  # type: ignore[assignment]
    cached = tta._call(body, json.dumps(answer).encode(), 200, 1.0, proxy, 0)  # type: ignore[arg-type]
    assert (plain.evaluated, cached.evaluated) == (None, 260)
    assert (cached.prompt_tokens, cached.completion_tokens, cached.max_tokens) == (900, 12, 64)
