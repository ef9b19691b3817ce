"""bench.langgraph_overhead's section: what tracing adds to an instrumented LangGraph run."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    pass

SECTION = "bench.langgraph_overhead"
WAYS = {
    "plain": "not instrumented",
    "traced": "OpenInference, spans dropped",
    "poirotd": "OpenInference, spans exported to poirotd (OTLP/HTTP)",
}


def section(seconds: dict[str, list[float]], stored: int, runs: int, rounds: int) -> str:
    median = {way: statistics.median(s) * 1000 for way, s in seconds.items()}
    plain = median["plain"]
    rows = "\n".join(
        f"| {label} | {median[way]:.2f} ms | {median[way] / plain - 1:+.0%} |"
        for way, label in WAYS.items()
    )
    exporter = median["poirotd"] - median["traced"]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{report.begin_marker(SECTION)}
## What tracing adds to a LangGraph run (`python -m bench.langgraph_overhead`)

{when}, commit {report.commit_text()}; {runs} runs per way and round, {rounds} rounds, the ways
alternating.

| way | time per run (median of rounds) | over not instrumented |
| --- | ---: | ---: |
{rows}

The exporter with poirotd as its target adds **{exporter:.2f} ms** per run over the
instrumentation alone; all {stored:,} exported runs were read back from poirotd's store, eight
messages each. The graph is examples/langgraph_openinference.py's: a doctor that calls a tool
and reports, a chief that decides, on langchain-core's fake chat models, so a run is the
framework's and the instrumentation's work alone (a real model's seconds would dwarf all of
it). The spans go through the SDK's BatchSpanProcessor (a background thread exports them, 512 at
a time) to `poirotd run` in its own process, on the same two shared cores: the exporter's share
is that thread's encoding and sending, and poirotd's work competing for the CPU.
{report.end_marker(SECTION)}"""
