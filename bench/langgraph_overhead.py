"""What tracing adds to an instrumented LangGraph run, with and without poirotd as the exporter's
target (issue 19).

    .venv/bin/python -m bench.langgraph_overhead            # about a minute
    .venv/bin/python -m bench.langgraph_overhead --runs 200 --rounds 5 --no-write

The graph is examples/langgraph_openinference.py's (a doctor with a tool node, a chief; fake
chat models, so a run is the framework's own work and nothing else). Three ways, round by round,
alternating: not instrumented; instrumented by OpenInference, its spans ended and dropped (the
instrumentation's own cost); instrumented, its spans sent by the SDK's BatchSpanProcessor and
OTLP/HTTP exporter to poirotd, a real `poirotd run` in its own process (as a sidecar is), which
stores every run as a session. Each instrumented way starts with an untimed run, and the two
go first in turn. The figure is the median over rounds of the mean time per run;
the exporter's share is the third way less the second. The result replaces this bench's
section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench import report
from bench.sections.langgraph_overhead import SECTION, section
from examples import langgraph_openinference as example
from poirotd.devtools.otlp_runs import SPEC
from poirotd.devtools.process import DaemonProcess, free_port
from poirotd.store import SqliteStore

# Not instrumented; OpenInference with its spans dropped; the same exported to poirotd.
WAYS = ("plain", "traced", "poirotd")


class _Dropped(SpanExporter):
    """Takes the spans and does nothing with them: the instrumentation's cost alone."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _timed_runs(graph: Any, runs: int, sessions: str) -> float:
    """Mean seconds per run; run i in session `<sessions>-<i>`."""
    started = time.perf_counter()
    for i in range(runs):
        example.run(graph, f"{sessions}-{i}")
    return (time.perf_counter() - started) / runs


def measure(endpoint: str, runs: int, rounds: int) -> dict[str, list[float]]:
    graph = example.build_graph()
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(rounds):
        seconds["plain"].append(_timed_runs(graph, runs, f"plain-{r}"))
        exporters: list[tuple[str, SpanExporter]] = [
            ("traced", _Dropped()),
            ("poirotd", OTLPSpanExporter(endpoint=endpoint)),
        ]
        for way, exporter in exporters[:: 1 if r % 2 == 0 else -1]:  # each goes first in turn
            provider, instrumentor = example.traced(BatchSpanProcessor(exporter))
            try:
                example.run(graph, f"warm-up-{way}-{r}")  # the first run after instrumenting
                seconds[way].append(_timed_runs(graph, runs, f"{way}-{r}"))
                assert provider.force_flush(60_000)
            finally:
                provider.shutdown()
                instrumentor.uninstrument()
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{w} {s[-1] * 1000:.2f} ms/run" for w, s in seconds.items()),
            flush=True,
        )
    return seconds


def run(runs: int, rounds: int) -> tuple[dict[str, list[float]], int]:
    """The figures, and how many runs poirotd stored as sessions."""
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        spec = SPEC.model_dump(mode="json", exclude_none=True)
        # No rules (no investigation competes for the CPU), and an LLM never called.
        spec.update(
            rules=[],
            llm={"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "none"},
        )
        config = workdir / "system.yaml"
        config.write_text(yaml.safe_dump(spec))
        port = free_port()
        daemon = DaemonProcess(config, workdir, env={"POIROTD_OTLP_HTTP_PORT": str(port)})
        daemon.start()
        try:
            seconds = measure(f"http://127.0.0.1:{port}/v1/traces", runs, rounds)
        finally:
            daemon.terminate()
        stored = asyncio.run(_stored_runs(daemon.db_path, runs, rounds))
    return seconds, stored


async def _stored_runs(db: Path, runs: int, rounds: int) -> int:
    """The exported runs, each read back from poirotd's store with its eight messages."""
    store = await SqliteStore.open(db)
    try:
        for r in range(rounds):
            for i in range(runs):
                stored = await store.session_messages(f"poirotd-{r}-{i}")
                assert len(stored) == 8, (r, i, len(stored))
    finally:
        await store.close()
    return runs * rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    report.add_no_write(parser)
    args = parser.parse_args()
    seconds, stored = run(args.runs, args.rounds)
    text = section(seconds, stored, args.runs, args.rounds)
    print(text)
    if not args.no_write:
        report.write_section(SECTION, text)


if __name__ == "__main__":
    main()
