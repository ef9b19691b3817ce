"""OTLP span ingest against the native Ingest stream, on the same messages, in one run (issue 19).

    .venv/bin/python -m bench.otlp                    # about a minute
    .venv/bin/python -m bench.otlp --messages 50000 --rounds 5

One in-process daemon (the tests' scripted LLM, no rules) takes the same agent messages three
ways, round by round, alternating: the native `poirot.v1.Ingest` stream (the client's batched
requests, acked once durable), OTLP/gRPC `TraceService/Export` and OTLP/HTTP `POST /v1/traces`
(protobuf), each message one GenAI chat span with its output message, built by the real
OpenTelemetry SDK and encoded by its exporter's encoder, sent one export after the other in
exports of 512 spans as the SDK's BatchSpanProcessor does. A rate is messages durable per
second from the first request to the last answer; the figures are the median rate over rounds
and the median of each round's ratio to the native rate (goal ≥ 0.5). The result replaces this
bench's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
import httpx
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import report
from bench.agents import CONTENT
from hwbridge.broker import free_port
from poirotd.api import convert
from poirotd.api.client import PoirotClient
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config import Settings
from poirotd.daemon import Daemon
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, MessageKind, Session
from tests.support.answers import schema_answer
from tests.support.otlp_runs import SPEC, provider

SECTION = "bench.otlp"
SPANS_PER_EXPORT = 512
AGENTS = ("doctor", "chief")


def _content(i: int) -> str:
    return f"{CONTENT[i % len(CONTENT)]} (#{i})"


def native_requests(session_id: str, count: int) -> list[pb.IngestRequest]:
    now = datetime.now(UTC)
    items: list[Session | AgentMessage] = [
        Session(session_id=session_id, system=SPEC.system.name, started_at=now)
    ]
    items += [
        AgentMessage(
            session_id=session_id,
            index=i,
            kind=MessageKind.AGENT,
            sender=AGENTS[i % 2],
            content=_content(i),
            sent_at=now,
        )
        for i in range(count)
    ]
    return [convert.ingest_request(item) for item in items]


def otlp_exports(conversation: str, count: int) -> list[ExportTraceServiceRequest]:
    """The same messages as GenAI chat spans, one message each, in exports of 512 spans."""
    memory = InMemorySpanExporter()
    traced = provider(SimpleSpanProcessor(memory))
    tracer = traced.get_tracer("bench")
    t0 = time.time_ns() - 10_000_000_000
    for i in range(count):
        reply = [{"role": "assistant", "parts": [{"type": "text", "content": _content(i)}]}]
        span = tracer.start_span(
            "chat small-model",
            start_time=t0 + i * 1000,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.agent.name": AGENTS[i % 2],
                "gen_ai.conversation.id": conversation,
                "gen_ai.output.messages": json.dumps(reply),
            },
        )
        span.end(end_time=t0 + i * 1000 + 500)
    traced.shutdown()
    spans = memory.get_finished_spans()
    return [
        encode_spans(spans[start : start + SPANS_PER_EXPORT])
        for start in range(0, len(spans), SPANS_PER_EXPORT)
    ]


async def _timed(send: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await send()
    return time.perf_counter() - started


async def run(messages: int, rounds: int) -> dict[str, list[float]]:
    spec = SPEC.model_copy(update={"rules": ()})
    rates: dict[str, list[float]] = {"native": [], "otlp_grpc": [], "otlp_http": []}
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(
            db_path=Path(folder) / "bench.db",
            grpc_port=0,
            metrics_port=0,
            otlp_http_port=free_port(),
        )
        daemon = Daemon(settings, spec, backend=ScriptedBackend(schema_answer))
        await daemon.start()
        url = f"http://127.0.0.1:{settings.otlp_http_port}/v1/traces"
        try:
            async with (
                PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel,
                httpx.AsyncClient(timeout=60) as http,
            ):
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)
                for r in range(rounds):
                    requests = native_requests(f"native-{r}", messages)
                    grpc_exports = otlp_exports(f"otlp-grpc-{r}", messages)
                    http_bodies = [
                        e.SerializeToString() for e in otlp_exports(f"otlp-http-{r}", messages)
                    ]

                    async def native(requests: list[pb.IngestRequest] = requests) -> None:
                        await client.send(requests)

                    async def over_grpc(
                        exports: list[ExportTraceServiceRequest] = grpc_exports,
                    ) -> None:
                        for export in exports:
                            answer = await stub.Export(export)
                            assert not answer.partial_success.rejected_spans, answer

                    async def over_http(bodies: list[bytes] = http_bodies) -> None:
                        for body in bodies:
                            answer = await http.post(
                                url,
                                content=body,
                                headers={"Content-Type": "application/x-protobuf"},
                            )
                            assert answer.status_code == 200, answer.text

                    for name, send in (
                        ("native", native),
                        ("otlp_grpc", over_grpc),
                        ("otlp_http", over_http),
                    ):
                        rates[name].append(messages / await _timed(send))
                    print(
                        f"round {r + 1}/{rounds}: "
                        + ", ".join(f"{k} {v[-1]:,.0f} msg/s" for k, v in rates.items()),
                        flush=True,
                    )
                store = daemon._store
                assert store is not None
                for r in range(rounds):
                    for session in (f"native-{r}", f"otlp-grpc-{r}", f"otlp-http-{r}"):
                        stored = await store.session_messages(session)
                        assert len(stored) == messages, (session, len(stored))
        finally:
            await daemon.stop()
    return rates


def section(rates: dict[str, list[float]], messages: int, rounds: int) -> str:
    native = statistics.median(rates["native"])
    grpc_rate = statistics.median(rates["otlp_grpc"])
    http_rate = statistics.median(rates["otlp_http"])
    # Each round's ways ran back to back: a round's ratio sees the same load on both sides.
    grpc_ratio = _median_ratio(rates["otlp_grpc"], rates["native"])
    http_ratio = _median_ratio(rates["otlp_http"], rates["native"])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{report.begin_marker(SECTION)}
## OTLP trace ingest against the native stream (`python -m bench.otlp`)

{when}, commit {report.commit_text()}; {_cpus()} CPUs, Python {platform.python_version()}.
{messages:,} agent messages per way and round, {rounds} rounds, the ways alternating;
OTLP exports of 512 spans (protobuf), one at a time.

| way | median rate | median of the rounds' ratios to native | goal |
| --- | ---: | ---: | --- |
| native `poirot.v1.Ingest` stream, batched | {native:,.0f} msg/s | 1.00 | |
| OTLP/gRPC `TraceService/Export` | {grpc_rate:,.0f} msg/s | **{grpc_ratio:.2f}** | ≥ 0.5 |
| OTLP/HTTP `POST /v1/traces` | {http_rate:,.0f} msg/s | **{http_ratio:.2f}** | ≥ 0.5 |

Every round's messages are checked stored (all {messages:,} of each way) before the figures
are written. Each message is one GenAI chat span (agent name, conversation id, its output
message as `gen_ai.output.messages` JSON), built by the OpenTelemetry SDK and encoded by its
exporter's encoder before the clock starts; the native requests are built the same way. An
export waits for its answer before the next is sent, as the SDK's BatchSpanProcessor does; the
native client keeps several batches in flight on its one stream. What OTLP adds per message is
the span's decoding and mapping (attributes to a dict, the messages' JSON) and an export's
commit round trip: one durable commit per export of 512 spans.
{report.end_marker(SECTION)}"""


def _median_ratio(rates: list[float], native: list[float]) -> float:
    return statistics.median(r / n for r, n in zip(rates, native, strict=True))


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-report", action="store_true", help="print, do not write BENCHMARKS.md"
    )
    args = parser.parse_args()
    rates = asyncio.run(run(args.messages, args.rounds))
    text = section(rates, args.messages, args.rounds)
    print(text)
    if not args.no_report:
        report.write_section(SECTION, text)


if __name__ == "__main__":
    main()
