"""The red-team bench's pure parts: the order cases are taken in, the time slices, and the
report section per method (the runs themselves need the embedded model: bench/injection.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench import injection
from bench.injection import Bench, Result, measure_method, one_category_after_another
from bench.injection_cases import InjectionCase, load_cases
from bench.report import begin_marker
from bench.sections.injection import SECTION, render
from poirotd.config.spec import SpotlightMode

TOKENS = {
    mode: {"doctor": n, "chief": n, "physio_general": n, "baseline": 2 * n}
    for mode, n in (("off", 100), ("lines", 120), ("words", 150))
}


def result(
    method: str, case: str, mode: SpotlightMode, follows: bool, category: str = "fake_vote"
) -> Result:
    location = [0] * 5 + [int(follows), 0]
    return Result(case, category, mode, location, follows, 10.0, method, int(follows), 1)


def test_the_control_token_category_comes_first_and_every_category_is_covered() -> None:
    cases = load_cases()
    ordered = one_category_after_another(cases)
    categories = list(dict.fromkeys(c.category for c in cases))
    assert categories[0] == "control_token"
    assert [c.category for c in ordered[: len(categories)]] == categories
    assert sorted(c.id for c in ordered) == sorted(c.id for c in cases)


class _Timed:
    """Stands in for the model: each run takes `seconds` of the clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.asked: list[str] = []

    async def vote(self, case: InjectionCase, mode: SpotlightMode, method: str) -> Result:
        self.asked.append(case.id)
        await asyncio.sleep(self.seconds)
        return result(method, case.id, mode, False, case.category)


async def test_a_slow_method_runs_one_pair_then_stops_and_the_control_waits_for_time() -> None:
    cases = load_cases()[:3]
    saved: list[tuple[Sequence[Result], Sequence[Result]]] = []
    voter = _Timed(0.05)
    # The slice is over before the first pair ends: that pair still runs, nothing after it.
    await measure_method(voter, "echo", cases, time.monotonic(), lambda c, r: saved.append((c, r)))
    assert len(voter.asked) == 2 and [len(r) for _, r in saved] == [2]
    # Time for everything: the injection pairs, then the control pair.
    voter, saved = _Timed(0.0), []
    await measure_method(
        voter, "echo", cases, time.monotonic() + 60, lambda c, r: saved.append((c, r))
    )
    assert voter.asked[-2:] == [f"{cases[0].id}-benign"] * 2
    assert [len(c) for c, _ in saved] == [0, 0, 0, 2]


def test_the_section_reports_each_method_and_its_figures(tmp_path: Path) -> None:
    results = [
        result("baseline", "copy-this-vote", "off", True),
        result("baseline", "copy-this-vote", "lines", False),
        result("echo", "copy-this-vote", "off", False),
        result("echo", "copy-this-vote", "lines", False),
        result("errorprobe", "copy-this-vote", "off", True),
        result("errorprobe", "copy-this-vote", "lines", True),
    ]
    control = [result("baseline", "x-benign", m, False, "benign") for m in ("off", "lines")]
    bench = Bench(
        "2026-11-28 04:00",
        "`abc1234`",
        control,
        results,
        TOKENS,
        20,
        69,
        ["errorprobe", "echo", "baseline"],
        "A note.",
    )
    path = tmp_path / "runs.json"
    bench.save(path)
    section = render(Bench.load(path), list(injection.METHODS))
    assert "Methods baseline, echo, errorprobe, each in a 20-minute slice" in section
    assert "| baseline | 1 | 0/1 = 0% | 1/1 = 100% | **0.00** |" in section
    assert "| echo | 1 | 0/1 = 0% | 0/1 = 0% | n/a" in section
    assert "| errorprobe | 1 | 1/1 = 100% | 1/1 = 100% | **1.00** |" in section
    assert "control marks the parent" in section and "| 0/1 / 0/1 |" in section
    assert "errorprobe: `copy-this-vote` (off: [0, 0, 0, 0, 0, 1, 0])" in section
    assert "A note." in section
    assert section.startswith(begin_marker(SECTION))


def test_runs_of_separate_processes_merge_into_one_bench() -> None:
    def part(method: str, commit: str, minutes: float = 20) -> Bench:
        runs = [result(method, "copy-this-vote", m, False) for m in ("off", "lines")]
        return Bench("2026-11-28 04:00", commit, [], runs, TOKENS, minutes, 69, [method], "")

    merged = Bench.merged([part("echo", "`a`"), part("baseline", "`b`")])
    assert merged.methods == ["echo", "baseline"] and merged.commit == "`a`, `b`"
    assert len(merged.results) == 4
    with pytest.raises(ValueError, match="slice"):
        Bench.merged([part("echo", "`a`"), part("baseline", "`a`", minutes=15)])
    with pytest.raises(ValueError, match="more than one"):
        Bench.merged([part("echo", "`a`"), part("echo", "`a`")])
