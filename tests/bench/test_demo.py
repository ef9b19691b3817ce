"""bench.demo's section: the ratios it prints come from the run's own record."""

from __future__ import annotations

from bench.demo import DemoRun
from bench.report import begin_marker, end_marker, reflow
from bench.sections.demo import render


def _run(wall: float, busy: float, critical: float) -> DemoRun:
    return DemoRun(
        started="2026-11-28T07:00:00+00:00",
        commit="`abc1234`",
        state="INVESTIGATION_STATE_SUCCEEDED",
        llm_calls=14,
        prompt_tokens=22_000,
        completion_tokens=3_900,
        wall_seconds=wall,
        busy_seconds=busy,
        floor_seconds=busy - 5.0 if busy else 0.0,
        critical_path_seconds=critical,
        critical_path_calls=6,
        critical_path_prompt_tokens=9_000,
        critical_path_completion_tokens=1_300,
        prefill_tokens_per_second=410.0,
        decode_tokens_per_second=21.5,
        per_call_seconds=0.4,
        load_average=1.2,
    )


def test_each_run_shows_wall_over_busy_and_over_floor() -> None:
    section = render([_run(235.0, 220.0, 80.0), _run(100.0, 0.0, 0.0)])
    assert section.startswith(begin_marker("bench.demo"))
    assert section.endswith(end_marker("bench.demo"))
    first, second = [line for line in section.splitlines() if line.startswith("| 2026")]
    assert "| 215 s | **1.09x** | 80 s (6 calls, 9000 + 1300 tokens) | 2.94x |" in first
    assert "succeeded" in first
    assert "**n/a**" in second and "| n/a |" in second, "a run without speeds has no ratio"


def test_the_published_section_keeps_its_end_marker_whole() -> None:
    text = reflow(render([_run(235.0, 220.0, 80.0)]))
    assert text.splitlines()[-1] == end_marker("bench.demo")
