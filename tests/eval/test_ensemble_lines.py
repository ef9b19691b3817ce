"""An ensemble line combined from the member lines a run directory holds: the same result as the
ensemble run for real on the same answers, without a single LLM call, and only when every member
line can stand in for a run (scripted LLM: orchestration only)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poirot_eval.cases import EvalCase
from poirot_eval.ensemble_lines import ensemble_line
from poirot_eval.journal import RunJournal
from poirot_eval.report import render_report
from poirot_eval.results import CaseResult
from poirotd.config.spec import EchoSpec, EnsembleSpec
from poirotd.devtools.answers import schema_answer
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import EnsembleMember
from tests.eval.helpers import case, lines, run

MEMBERS: tuple[EnsembleMember, ...] = ("baseline", "echo")


def two_member_case(case_id: str) -> EvalCase:
    """helpers.case with an ensemble of the baseline and a one-analyst ECHO."""
    base = case(case_id)
    protocol = base.spec.protocol.model_copy(
        update={
            "echo": EchoSpec(analysts=1, roles=("general",)),
            "ensemble": EnsembleSpec(members=MEMBERS),
        }
    )
    return base.model_copy(update={"spec": base.spec.model_copy(update={"protocol": protocol})})


def answers(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
    """ECHO's analyst blames the physio at step 1; the baseline votes region 0 (the doctor)."""
    if schema is not None and "conclusion" in schema["properties"]:
        return json.dumps(
            {
                "summary": "read the log",
                "evaluations": [
                    {"region": r, "likelihood": 0.8 if r == "physio" else 0.1, "evidence": "log"}
                    for r in ("doctor", "physio", "exo")
                ],
                "conclusion": {
                    "kind": "single",
                    "regions": ["physio"],
                    "step": 1,
                    "confidence": 0.9,
                    "reasoning": "the knee angle",
                },
                "alternatives": [],
            }
        )
    return schema_answer(messages, schema)


async def test_the_combined_line_is_what_the_ensemble_computes_and_calls_no_llm(
    tmp_path: Path,
) -> None:
    cases = [two_member_case("1"), two_member_case("2")]
    for member in MEMBERS:
        await run(cases, tmp_path / "reused", ScriptedBackend(answers), member)
    idle = ScriptedBackend(answers)
    recorder = await run(cases, tmp_path / "reused", idle, "ensemble")
    await run(cases, tmp_path / "ran", ScriptedBackend(answers), "ensemble", reuse_members=False)

    assert idle.calls == [] and recorder.started == [], "nothing was run"
    assert [r.case_id for r in recorder.finished] == ["1", "2"]
    reused = [CaseResult.model_validate(r) for r in lines(tmp_path / "reused")[-2:]]
    ran = [CaseResult.model_validate(r) for r in lines(tmp_path / "ran")]
    for combined, real in zip(reused, ran, strict=True):
        assert combined.ensemble_of == MEMBERS and real.ensemble_of == ()
        assert (combined.status, combined.decision, combined.step) == (
            real.status,
            real.decision,
            real.step,
        )
        assert combined.scores == real.scores
        assert [v.agent_id for v in combined.votes] == [v.agent_id for v in real.votes]
    # The two members disagree, so the combination is not one member's answer copied.
    assert reused[0].scores[0] > 0 and reused[0].scores[1] > 0
    members = [
        CaseResult.model_validate(r)
        for r in lines(tmp_path / "reused")
        if r["case_id"] == "1" and r["method"] in MEMBERS
    ]
    assert reused[0].tokens.prompt == sum(m.tokens.prompt for m in members)
    assert reused[0].seconds == sum(m.seconds for m in members)
    report = render_report(RunJournal(tmp_path / "reused").results(), tmp_path / "reused")
    assert "2 of 2 lines were combined from the lines of its members (baseline, echo)" in (
        report.read_text()
    )


async def test_a_missing_member_line_means_the_ensemble_runs(tmp_path: Path) -> None:
    cases = [two_member_case("1")]
    await run(cases, tmp_path, ScriptedBackend(answers), "baseline")
    backend = ScriptedBackend(answers)
    recorder = await run(cases, tmp_path, backend, "ensemble")

    assert recorder.started == ["1"] and len(backend.calls) == 2
    assert lines(tmp_path)[-1]["ensemble_of"] == []


async def test_a_failed_member_is_left_out_and_a_timed_out_one_is_not_combined(
    tmp_path: Path,
) -> None:
    the_case = two_member_case("1")
    for member in MEMBERS:
        await run([the_case], tmp_path, ScriptedBackend(answers), member)
    journal = RunJournal(tmp_path)
    recorded = journal.case_lines("whowhen", "1")
    model = recorded["baseline"].model
    failed = recorded["echo"].model_copy(
        update={"status": "failed", "error": "no analyst cast a valid vote", "votes": ()}
    )

    alone = ensemble_line(the_case, {**recorded, "echo": failed}, model)
    assert alone is not None and alone.status == "ok"
    assert alone.decision == recorded["baseline"].decision, "the baseline alone"
    timed_out = failed.model_copy(update={"status": "timeout", "error": "not finished"})
    assert ensemble_line(the_case, {**recorded, "echo": timed_out}, model) is None
    crashed = failed.model_copy(update={"error": "internal error: KeyError: 'x'"})
    assert ensemble_line(the_case, {**recorded, "echo": crashed}, model) is None
    assert ensemble_line(the_case, recorded, "another model") is None
    nobody: dict[str, CaseResult] = {m: failed.model_copy(update={"method": m}) for m in MEMBERS}
    none_left = ensemble_line(the_case, nobody, model)
    assert none_left is not None and none_left.status == "failed"
    assert "every member failed" in none_left.error
