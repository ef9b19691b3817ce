"""OTLP span ingest against the native Ingest stream, on the same messages, in one run (issue 19).

    .venv/bin/python -m bench.otlp                    # about a minute
    .venv/bin/python -m bench.otlp --messages 50000 --rounds 5
    .venv/bin/python -m bench.otlp --messages-per-span 2  # chat spans with their new input

One in-process daemon (the tests' scripted LLM, no rules) takes the same agent messages five
ways, round by round, alternating: the native `poirot.v1.Ingest` stream (the client's batched
requests, acked once durable), OTLP/gRPC `TraceService/Export` and OTLP/HTTP `POST /v1/traces`
(protobuf), each message one GenAI chat span with its output message (the keys' worst case: a
key a message), or with `--messages-per-span 2` each chat span its new user input and its
output (a key per two messages, as a conversational agent's model calls give), built by the real
OpenTelemetry SDK and encoded by its exporter's encoder, in exports of 512 spans as the SDK's
BatchSpanProcessor makes them. Every way's requests are built before its clock starts.

Like with like: the native stream keeps two requests in flight (the daemon admits the next while
the one before commits), an SDK exporter one export (it waits for the answer). So each OTLP
transport runs twice: one exporter (a single instrumented process), and `--exporters` of them
concurrently (default 2: two requests in flight, as the native stream; several instrumented
processes, or a Collector, whose exporter sends from 10 consumers by default). A rate is
messages durable per second from the first request to the last answer; the figures are the
median rate over rounds and the median of each round's ratio to the native rate (goal ≥ 0.5,
for the like-with-like rows). The clients run in the daemon's process (its CPU counts theirs):
grpc's for both gRPC ways, aiohttp's for OTLP/HTTP (httpx, measured first, cost the HTTP rows
several hundredths of the ratio). The result replaces this bench's section of BENCHMARKS.md
(one section per shape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import aiohttp
import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import report
from bench.agents import CONTENT
from bench.sections.otlp import section, section_name
from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient, batched
from poirotd.config import Settings, SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, provider
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, ItemKey, MessageKind, Session
from poirotd.observability.gc_tuning import tune_for_daemon
from poirotd.store.sqlite import SqliteStore
from poirotd.transports.otlp.mapping import map_export

# The ways, each a row of the section: the native stream, then OTLP over gRPC and over HTTP,
# each with one exporter and with `--exporters` of them (the `_n` ways).
WAYS = ("native", "otlp_grpc", "otlp_grpc_n", "otlp_http", "otlp_http_n")
SPANS_PER_EXPORT = 512
AGENTS = ("doctor", "chief")
T = TypeVar("T")


def _content(i: int) -> str:
    return f"{CONTENT[i % len(CONTENT)]} (#{i})"


def native_requests(session_id: str, count: int, per_span: int = 1) -> list[pb.IngestRequest]:
    """`count` messages: with `per_span` 2, a user's request to an agent, then its answer."""
    now = datetime.now(UTC)
    items: list[Session | AgentMessage] = [
        Session(session_id=session_id, system=SPEC.system.name, started_at=now)
    ]
    for i in range(count):
        agent = AGENTS[i // per_span % 2]
        asked = per_span == 2 and i % 2 == 0
        items.append(
            AgentMessage(
                session_id=session_id,
                index=i,
                kind=MessageKind.HUMAN if asked else MessageKind.AGENT,
                sender="user" if asked else agent,
                recipient=agent if asked else "",
                content=_content(i),
                sent_at=now,
            )
        )
    return [convert.ingest_request(item) for item in items]


def otlp_exports(
    conversation: str, count: int, per_span: int = 1
) -> list[ExportTraceServiceRequest]:
    """The same messages as GenAI chat spans, `per_span` each (its output; with 2, the user's
    request as its input before it), in exports of 512 spans."""
    if per_span not in (1, 2):
        raise ValueError(f"messages per span: 1 or 2, not {per_span}")
    memory = InMemorySpanExporter()
    traced = provider(SimpleSpanProcessor(memory))
    tracer = traced.get_tracer("bench")
    t0 = time.time_ns() - 10_000_000_000
    for n in range(count // per_span):
        i = n * per_span + per_span - 1  # the answer's number among the messages
        reply = [{"role": "assistant", "parts": [{"type": "text", "content": _content(i)}]}]
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.agent.name": AGENTS[n % 2],
            "gen_ai.conversation.id": conversation,
            "gen_ai.output.messages": json.dumps(reply),
        }
        if per_span == 2:
            request = [{"role": "user", "parts": [{"type": "text", "content": _content(i - 1)}]}]
            attributes["gen_ai.input.messages"] = json.dumps(request)
        start = t0 + n * 1000
        span = tracer.start_span("chat small-model", start_time=start, attributes=attributes)
        span.end(end_time=start + 500)
    traced.shutdown()
    spans = memory.get_finished_spans()
    return [
        encode_spans(spans[start : start + SPANS_PER_EXPORT])
        for start in range(0, len(spans), SPANS_PER_EXPORT)
    ]


class Rates(NamedTuple):
    wall: float  # messages durable per second
    cpu: float  # messages per CPU second of this process (the daemon and its clients)


async def _measured(messages: int, send: Callable[[], Awaitable[None]]) -> Rates:
    wall, cpu = time.perf_counter(), time.process_time()
    await send()
    return Rates(messages / (time.perf_counter() - wall), messages / (time.process_time() - cpu))


def _shares(exports: Sequence[T], exporters: int) -> list[list[T]]:
    """Each exporter's exports, dealt in turn: together they send in about the spans' order."""
    return [list(exports[k::exporters]) for k in range(exporters)]


async def _concurrently(
    shares: Sequence[Sequence[T]], send_one: Callable[[T], Awaitable[None]]
) -> None:
    """Each share sent by its own exporter, one request after the other."""

    async def exporter(share: Sequence[T]) -> None:
        for request in share:
            await send_one(request)

    async with asyncio.TaskGroup() as group:
        for share in shares:
            group.create_task(exporter(share))


async def started_daemon(folder: Path, spec: SystemSpec) -> Daemon:
    """An in-process daemon with its OTLP/HTTP transport open and the tests' scripted LLM; the
    caller stops it."""
    settings = Settings(
        db_path=folder / "poirotd.db",
        grpc_port=0,
        metrics_port=0,
        otlp_http_port=free_port(),
        drain_seconds=5,
    )
    daemon = Daemon(settings, spec, backend=ScriptedBackend(schema_answer))
    await daemon.start()
    return daemon


async def run(
    messages: int, rounds: int, exporters: int, per_span: int = 1
) -> dict[str, list[Rates]]:
    spec = SPEC.model_copy(update={"rules": ()})
    rates: dict[str, list[Rates]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as folder:
        daemon = await started_daemon(Path(folder), spec)
        settings = daemon.settings
        url = f"http://127.0.0.1:{settings.otlp_http_port}/v1/traces"
        try:
            async with (
                PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel,
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
            ):
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)

                async def export_grpc(export: ExportTraceServiceRequest) -> None:
                    answer = await stub.Export(export)
                    assert not answer.partial_success.rejected_spans, answer

                async def export_http(body: bytes) -> None:
                    headers = {"Content-Type": "application/x-protobuf"}
                    async with http.post(url, data=body, headers=headers) as answer:
                        assert answer.status == 200, await answer.text()
                        await answer.read()

                for r in range(rounds):
                    native = native_requests(f"native-{r}", messages, per_span)
                    batches = list(batched(native))
                    sends: dict[str, Callable[[], Awaitable[None]]] = {
                        "native": partial(_stream, client, batches)
                    }
                    for way, count in (("otlp_grpc", 1), ("otlp_grpc_n", exporters)):
                        exports = otlp_exports(f"{way}-{r}", messages, per_span)
                        shares = _shares(exports, count)
                        sends[way] = partial(_concurrently, shares, export_grpc)
                    for way, count in (("otlp_http", 1), ("otlp_http_n", exporters)):
                        exports = otlp_exports(f"{way}-{r}", messages, per_span)
                        bodies = [e.SerializeToString() for e in exports]
                        sends[way] = partial(_concurrently, _shares(bodies, count), export_http)
                    for way, send in sends.items():
                        rates[way].append(await _measured(messages, send))
                    print(
                        f"round {r + 1}/{rounds}: "
                        + ", ".join(
                            f"{k} {v[-1].wall:,.0f} msg/s ({v[-1].cpu:,.0f} per CPU s)"
                            for k, v in rates.items()
                        ),
                        flush=True,
                    )
                store = daemon._store
                assert store is not None
                for r in range(rounds):
                    for way in WAYS:
                        session = f"{way}-{r}"
                        stored = await store.session_messages(session)
                        assert len(stored) == messages, (session, len(stored))
        finally:
            await daemon.stop()
    return rates


async def _stream(client: PoirotClient, batches: Sequence[pb.IngestRequest]) -> None:
    """The native client's stream of requests batched beforehand (`PoirotClient.send` batches
    as it sends), until the last is acknowledged durable."""
    durable = 0
    async for ack in client.ingest.Stream(iter(batches)):
        durable = ack.durable_seq
    assert durable == batches[-1].seq + len(batches[-1].items) - 1, durable


def mapping_cpu_us(messages: int, per_span: int = 1, repeats: int = 5) -> float:
    """CPU microseconds the span mapping alone takes a message (best of `repeats` passes over
    one round's exports, already decoded): the part of OTLP's cost the native stream does not
    have."""
    exports = otlp_exports("mapping", messages, per_span)
    agents = SPEC.agents_by_alias()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for export in exports:
            map_export(export, agents, session_by="conversation")
        best = min(best, time.process_time() - start)
    return best / messages * 1e6


class KeyCost(NamedTuple):
    """CPU microseconds a message of `Store.commit_ingest` on SQLite, without and with keys."""

    without: float
    keyed: float


def keys_cpu_us(messages: int, per_span: int = 1, repeats: int = 5) -> KeyCost:
    """What the messages' idempotency keys cost the commit: one round's messages, mapped from
    their exports and committed an export at a time to a new SQLite store, without keys and
    with them (a producer per span, as the receiver gives), alternating; best of `repeats`
    each. CPU of every thread (the store's writer thread does the work)."""
    agents = SPEC.agents_by_alias()
    exports = [
        map_export(export, agents, session_by="conversation").messages
        for export in otlp_exports("keys", messages, per_span)
    ]
    now = datetime.now(UTC)
    batches = [
        [
            AgentMessage(
                session_id="keys",
                index=i * SPANS_PER_EXPORT * per_span + j,
                kind=m.kind,
                sender=m.sender,
                recipient=m.recipient,
                content=m.content,
                sent_at=now,
                trace_id=m.trace_id,
                span_id=m.span_id,
            )
            for j, m in enumerate(mapped)
        ]
        for i, mapped in enumerate(exports)
    ]
    keys = [[m.key() for m in mapped] for mapped in exports]
    best = {False: float("inf"), True: float("inf")}
    for _ in range(repeats):
        for keyed in (False, True):
            best[keyed] = min(best[keyed], asyncio.run(_commit_cpu(batches, keys, keyed)))
    return KeyCost(best[False] / messages * 1e6, best[True] / messages * 1e6)


async def _commit_cpu(
    batches: Sequence[Sequence[AgentMessage]],
    keys: Sequence[Sequence[ItemKey | None]],
    keyed: bool,
) -> float:
    """CPU seconds the commits of `batches` took a new store."""
    with tempfile.TemporaryDirectory() as folder:
        store = await SqliteStore.open(Path(folder) / "keys.db")
        try:
            start = Session(
                session_id="keys", system=SPEC.system.name, started_at=datetime.now(UTC)
            )
            await store.commit_ingest([start])
            cpu = time.process_time()
            for batch, batch_keys in zip(batches, keys, strict=True):
                await store.commit_ingest(batch, batch_keys if keyed else ())
            return time.process_time() - cpu
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--exporters", type=int, default=2, help="concurrent exporters of the like-with-like rows"
    )
    parser.add_argument(
        "--messages-per-span",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: each chat span its answer; 2: its new user input too",
    )
    report.add_no_write(parser)
    args = parser.parse_args()
    # The daemon's process runs with this collector setting (Daemon.run_until_signalled), as
    # bench.ingest's in-process runs do.
    tune_for_daemon()
    per_span = args.messages_per_span
    rates = asyncio.run(run(args.messages, args.rounds, args.exporters, per_span))
    mapping_us = mapping_cpu_us(args.messages, per_span)
    keys = keys_cpu_us(args.messages, per_span)
    text = section(
        rates,
        args.messages,
        args.rounds,
        args.exporters,
        mapping_us,
        keys,
        per_span,
        SPANS_PER_EXPORT,
    )
    print(text)
    if not args.no_write:
        report.write_section(section_name(per_span), text)


if __name__ == "__main__":
    main()
