"""The eval runner on hand-built cases and a scripted LLM: one line per case, resumable, and a case
that cannot fit the model recorded rather than dropped (orchestration only, no model answers)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from poirot_eval.cases import GroundTruth
from poirot_eval.journal import RunJournal, RunMismatchError
from poirot_eval.provenance import source_commit
from poirot_eval.results import CaseResult
from poirot_eval.runner import run_cases
from poirotd.config import EmbeddedLLMSpec
from poirotd.devtools.answers import schema_answer
from poirotd.llm import ChatMessage, LLMError
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import InvestigationMethod
from tests.eval.helpers import LLM, Recorder, case, lines, run


@pytest.mark.parametrize("method", ["poirot", "baseline"])
async def test_each_case_is_one_line_with_the_investigation_outcome(
    tmp_path: Path, method: InvestigationMethod
) -> None:
    backend = ScriptedBackend(schema_answer)
    recorder = await run([case("1"), case("2")], tmp_path, backend, method)

    assert recorder.plan == (2, 0)
    assert recorder.started == ["1", "2"]
    rows = lines(tmp_path)
    assert [(r["case_id"], r["method"], r["status"]) for r in rows] == [
        ("1", method, "ok"),
        ("2", method, "ok"),
    ]
    first = CaseResult.model_validate(rows[0])
    assert first.region_ids == ("doctor", "physio", "exo")
    assert first.decision == (1, 0, 0)
    assert first.predicted_regions == ("doctor",)
    assert first.truth == GroundTruth(regions=("doctor",), step=0)
    assert first.model == "embedded default"
    assert first.tokens.prompt > 0 and first.tokens.completion > 0
    assert first.seconds > 0
    assert len(first.votes) == (2 if method == "poirot" else 1)
    # The session reached the LLM as ingested: the physio's message is in the prompts.
    assert any("Knee angle 270" in m.content for call in backend.calls for m in call.messages)


async def test_a_rerun_skips_recorded_cases_and_adds_the_rest(tmp_path: Path) -> None:
    cases = [case("1"), case("2")]
    await run(cases[:1], tmp_path, ScriptedBackend(schema_answer))  # as if stopped after case 1
    backend = ScriptedBackend(schema_answer)
    recorder = await run(cases, tmp_path, backend)

    assert recorder.plan == (2, 1)
    assert recorder.started == ["2"]
    assert [r["case_id"] for r in lines(tmp_path)] == ["1", "2"]
    # Another method is another key: the same cases run again under it.
    recorder = await run(cases, tmp_path, ScriptedBackend(schema_answer), "baseline")
    assert recorder.started == ["1", "2"]
    assert len(lines(tmp_path)) == 4


async def test_a_torn_last_line_is_ignored_and_its_case_rerun(tmp_path: Path) -> None:
    await run([case("1")], tmp_path, ScriptedBackend(schema_answer))
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"case_id": "2", "dataset": "whowhen", "meth')  # a crash mid-write
    recorder = await run([case("1"), case("2")], tmp_path, ScriptedBackend(schema_answer))

    assert recorder.started == ["2"]
    assert [r.case_id for r in RunJournal(tmp_path).results()] == ["1", "2"]


async def test_a_case_that_does_not_fit_the_context_is_recorded(tmp_path: Path) -> None:
    def refuse_long(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        if any("HUGE" in m.content for m in messages):
            raise LLMError("prompt exceeds the context of 4096 tokens", reason="context_exceeded")
        return schema_answer(messages, schema)

    cases = [case("big", content="HUGE " * 10), case("small")]
    recorder = await run(cases, tmp_path, ScriptedBackend(refuse_long), "baseline")

    big, small = recorder.finished
    assert big.status == "context_exceeded", big.error
    assert big.error
    assert big.decision == ()
    assert big.region_ids == ("doctor", "physio", "exo")
    assert small.status == "ok"
    assert [r["status"] for r in lines(tmp_path)] == ["context_exceeded", "ok"]


async def test_a_case_the_daemon_refuses_is_a_failed_line(tmp_path: Path) -> None:
    stranger = case("1")
    bad = stranger.model_copy(
        update={"messages": (stranger.messages[0].model_copy(update={"sender": "nobody"}),)}
    )
    recorder = await run([bad], tmp_path, ScriptedBackend(schema_answer))

    [result] = recorder.finished
    assert result.status == "failed"
    assert "nobody" in result.error

    # Fixed (say, in the loader), a failed case is run again on request; its new line counts.
    assert (await run([stranger], tmp_path, ScriptedBackend(schema_answer))).started == []
    recorder = Recorder()
    await run_cases(
        [stranger],
        RunJournal(tmp_path),
        method="poirot",
        llm=LLM,
        observer=recorder,
        backend=ScriptedBackend(schema_answer),
        retry=("failed", "timeout"),
    )
    assert recorder.started == ["1"]
    assert len(lines(tmp_path)) == 2
    assert [r.status for r in RunJournal(tmp_path).results()] == ["ok"]


def test_run_json_refuses_a_directory_of_another_model(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path)
    journal.begin(dataset="whowhen", method="poirot", llm=LLM.model_dump(mode="json"), settings={})
    journal.begin(
        dataset="whowhen", method="baseline", llm=LLM.model_dump(mode="json"), settings={}
    )
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert [i["method"] for i in run_json["invocations"]] == ["poirot", "baseline"]
    assert run_json["invocations"][0]["poirotd_commit"] == source_commit()
    assert run_json["llm"]["context_tokens"] == 4096

    other = EmbeddedLLMSpec(context_tokens=8192).model_dump(mode="json")
    with pytest.raises(RunMismatchError):
        journal.begin(dataset="whowhen", method="poirot", llm=other, settings={})


async def test_a_case_over_its_time_limit_is_a_timeout_line(tmp_path: Path) -> None:
    async def never(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        await asyncio.Event().wait()
        return ""

    recorder = await run(
        [case("1")], tmp_path, ScriptedBackend(never), "baseline", case_timeout=0.2
    )
    [result] = recorder.finished
    assert (result.status, result.error) == ("timeout", "not finished after 0.2 s")


def poirotd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poirotd", *args], capture_output=True, text=True, timeout=120
    )


async def test_eval_report_scores_a_run_directory(tmp_path: Path) -> None:
    await run([case("1"), case("2")], tmp_path, ScriptedBackend(schema_answer))
    result = poirotd("eval", "report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = Path(result.stdout.strip())
    assert report.parent == tmp_path and await asyncio.to_thread(report.is_file)


def test_eval_cli_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    empty = poirotd("eval", "report", str(tmp_path))
    assert (empty.returncode, "no results in") == (2, empty.stderr[: len("no results in")])
    common = ["eval", "run", "--dataset", "whowhen", "--out", str(tmp_path / "run")]
    no_model = poirotd(*common, "--base-url", "http://127.0.0.1:1/v1")
    assert no_model.returncode == 2 and "--model" in no_model.stderr
    no_data = poirotd(*common, "--data-dir", str(tmp_path / "nowhere"), "--model-path", "x.gguf")
    assert no_data.returncode == 2 and "cannot load whowhen: no " in no_data.stderr
    assert 'lacks whowhen; docs/evaluation.md, "Evaluation on public benchmarks"' in no_data.stderr


async def test_cancelling_abandons_the_case_in_flight_and_records_nothing_for_it(
    tmp_path: Path,
) -> None:
    """What Ctrl-C does to a run: the finished case stays, the one in flight is not recorded."""
    asked = asyncio.Event()

    async def stall_on_second(
        messages: Sequence[ChatMessage], schema: dict[str, Any] | None
    ) -> str:
        if any("the second case" in m.content for m in messages):
            asked.set()
            await asyncio.Event().wait()
        return schema_answer(messages, schema)

    recorder = Recorder()
    task = asyncio.create_task(
        run_cases(
            [case("1"), case("2", content="the second case")],
            RunJournal(tmp_path),
            method="baseline",
            llm=LLM,
            observer=recorder,
            backend=ScriptedBackend(stall_on_second),
        )
    )
    await asyncio.wait_for(asked.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.started == ["1", "2"]
    assert [r["case_id"] for r in lines(tmp_path)] == ["1"]


async def test_cases_run_concurrently_up_to_the_limit_and_each_is_recorded(
    tmp_path: Path,
) -> None:
    in_flight: set[str] = set()
    most = 0

    async def slow(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        nonlocal most
        session = next(m.content for m in messages if "case-" in m.content)
        in_flight.add(session)
        most = max(most, len(in_flight))
        await asyncio.sleep(0.05)
        in_flight.discard(session)
        return schema_answer(messages, schema)

    cases = [case(str(i), content=f"case-{i}: knee angle 270") for i in range(5)]
    recorder = await run(cases, tmp_path, ScriptedBackend(slow), "baseline", concurrency=2)
    assert most == 2
    assert recorder.started == ["0", "1", "2", "3", "4"]
    assert sorted(r["case_id"] for r in lines(tmp_path)) == ["0", "1", "2", "3", "4"]
    assert {r["status"] for r in lines(tmp_path)} == {"ok"}


def test_concurrency_is_refused_for_the_embedded_model(tmp_path: Path) -> None:
    refused = poirotd(
        "eval", "run", "--dataset", "whowhen", "--out", str(tmp_path), "--concurrency", "2"
    )
    assert refused.returncode == 2 and "needs a server backend" in refused.stderr
