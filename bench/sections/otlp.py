"""bench.otlp's section: each way's rate and CPU per message against the native stream, and
what OTLP adds per message (decoding and mapping, the idempotency keys' commit)."""

from __future__ import annotations

import os
import platform
import statistics
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from bench import report

if TYPE_CHECKING:
    from bench.otlp import KeyCost, Rates

SECTION = "bench.otlp"


def _labels(exporters: int) -> dict[str, str]:
    """Each way (bench.otlp.WAYS) and its row in the section."""
    return {
        "native": "native `poirot.v1.Ingest` stream, batched",
        "otlp_grpc": "OTLP/gRPC `TraceService/Export`, 1 exporter",
        "otlp_grpc_n": f"OTLP/gRPC `TraceService/Export`, {exporters} exporters",
        "otlp_http": "OTLP/HTTP `POST /v1/traces`, 1 exporter",
        "otlp_http_n": f"OTLP/HTTP `POST /v1/traces`, {exporters} exporters",
    }


def section(
    rates: dict[str, list[Rates]],
    messages: int,
    rounds: int,
    exporters: int,
    mapping_us: float,
    keys: KeyCost,
    per_span: int,
    spans_per_export: int,
) -> str:
    ways = _labels(exporters)
    rows = []
    for way, label in ways.items():
        walls = [r.wall for r in rates[way]]
        cpus = [r.cpu for r in rates[way]]
        # Each round's ways ran back to back: a round's ratio sees the same load on both sides.
        wall_ratio = _median_ratio(walls, [r.wall for r in rates["native"]])
        cpu_ratio = _median_ratio(cpus, [r.cpu for r in rates["native"]])
        goal = "≥ 0.5" if way.endswith("_n") else ""
        rows.append(
            f"| {label} | {statistics.median(walls):,.0f} msg/s | **{wall_ratio:.2f}** "
            f"| {statistics.median(cpus):,.0f} | **{cpu_ratio:.2f}** | {goal} |"
        )
    table = "\n".join(rows)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    name, shape = _shaped(per_span)
    return f"""{report.begin_marker(name)}
## OTLP trace ingest against the native stream (`python -m bench.otlp{shape.flag}`)

{when}, commit {report.commit_text()}; {_cpus()} CPUs, Python {platform.python_version()};
the garbage collector set as `poirotd run` sets it (`gc_tuning.tune_for_daemon`).
{messages:,} agent messages per way and round, {rounds} rounds, the ways alternating;
OTLP exports of {spans_per_export} spans (protobuf).

| way | median rate | ratio to native | messages per CPU second | ratio to native | goal |
| --- | ---: | ---: | ---: | ---: | --- |
{table}

Every round's messages are checked stored (all {messages:,} of each way) before the figures
are written. Ratios are the median of each round's ratio (the ways of a round ran back to back,
under about the same load); the CPU columns count the whole process's CPU time (daemon and
clients, every thread: grpc's clients, aiohttp's for OTLP/HTTP), which the machine's other
tenants disturb less than the clock. {shape.text}
built by the OpenTelemetry SDK and encoded by its exporter's
encoder before the clock starts; the native requests are built and batched (64 KB requests,
some 1,400 messages each) before it too. Like with like: the native stream has two requests in
flight (the daemon admits the next while the one before commits); an exporter waits for each
export's answer, so one exporter has one in flight and leaves the daemon idle while it commits,
and {exporters} exporters (several instrumented processes, or a Collector's exporter, which
sends from 10 consumers by default) have {exporters}. The goal applies to those rows. What OTLP
adds per message is the span's decoding and mapping (attributes to a dict, the messages' JSON,
placing the span in its trace) and a durable commit per export of {spans_per_export} spans where
the native stream commits some 1,400 messages at a time. The mapping alone took
{mapping_us:.1f} µs of CPU a message in this run (best of 5 passes over the decoded spans),
against {1e6 / statistics.median(r.cpu for r in rates["native"]):.1f} µs a message for all of the
native way (daemon and client). The messages' idempotency keys (a producer per span, a seq per
message in it: {shape.keys}) cost the commit {keys.keyed - keys.without:.1f} µs of CPU a
message: the same {messages:,} messages committed to a new SQLite store an export at a time took
{keys.without:.1f} µs a message without keys and {keys.keyed:.1f} µs with them (best of 5 each,
alternating).
{report.end_marker(name)}"""


class _Shape(NamedTuple):
    flag: str  # the option that gives it, as the section's title shows it
    text: str  # what a span carries
    keys: str  # what that means for the keys


def section_name(per_span: int) -> str:
    """The BENCHMARKS.md section of a run with `per_span` messages a span."""
    return _shaped(per_span)[0]


def _shaped(per_span: int) -> tuple[str, _Shape]:
    """The report section of a run with `per_span` messages a span, and how it reads."""
    if per_span == 1:
        return SECTION, _Shape(
            "",
            "Each message is one GenAI chat span (agent name, conversation id, its output "
            "message as `gen_ai.output.messages` JSON),",
            "here a key a message, the most a message can cost",
        )
    return f"{SECTION}.{per_span}", _Shape(
        f" --messages-per-span {per_span}",
        "Each GenAI chat span (agent name, conversation id) carries two messages: the user's "
        "request as `gen_ai.input.messages` and the agent's answer as "
        "`gen_ai.output.messages`; the native way sends the same requests and answers,",
        "here one key row for each span's two messages",
    )


def _median_ratio(rates: list[float], native: list[float]) -> float:
    return statistics.median(r / n for r, n in zip(rates, native, strict=True))


def _cpus() -> int:
    return os.cpu_count() or 0
