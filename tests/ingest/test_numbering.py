"""Messages whose producers leave the index to the daemon: numbered in arrival order, after what
the session has, with one count for every transport (the native stream's assign_index and OTLP)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, provider
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, MessageKind, Session
from tests.support.daemon import client_of, in_process_daemon

SESSION = "numbered"


def _message(content: str, index: int = 0) -> pb.IngestRequest:
    message = AgentMessage(
        session_id=SESSION,
        index=index,
        kind=MessageKind.AGENT,
        sender="doctor",
        content=content,
        sent_at=datetime.now(UTC),
    )
    request = convert.ingest_request(message)
    request.agent_message.assign_index = True
    return request


async def test_the_daemon_numbers_on_from_the_session_across_streams_and_transports(
    tmp_path: Path,
) -> None:
    start = convert.ingest_request(
        Session(session_id=SESSION, system=SPEC.system.name, started_at=datetime.now(UTC))
    )
    async with in_process_daemon(tmp_path, SPEC, ScriptedBackend(schema_answer)) as daemon:
        async with client_of(daemon) as client:
            # The index sent is ignored.
            await client.send([start, _message("first", 7), _message("second", 7)])
            await client.send([_message("third")])
        memory = InMemorySpanExporter()
        traced = provider(SimpleSpanProcessor(memory))
        reply = '[{"role": "assistant", "parts": [{"type": "text", "content": "fourth"}]}]'
        traced.get_tracer("t").start_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.agent.name": "doctor",
                "gen_ai.conversation.id": SESSION,
                "gen_ai.output.messages": reply,
            },
            start_time=time.time_ns(),
        ).end()
        traced.shutdown()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            await stub.Export(encode_spans(memory.get_finished_spans()))
        async with client_of(daemon) as client:
            await client.send([_message("fifth")])
        assert daemon._store is not None
        stored = await daemon._store.session_messages(SESSION)
    assert [(m.index, m.content) for m in stored] == [
        (0, "first"),
        (1, "second"),
        (2, "third"),
        (3, "fourth"),
        (4, "fifth"),
    ]


async def test_the_daemon_numbers_past_an_index_a_producer_chose_in_the_same_session(
    tmp_path: Path,
) -> None:
    """A producer's own index admitted first (here one still uncommitted in the same request)
    moves the count: a daemon-numbered message after it never lands on it, which would make it
    look like a resend and be dropped after its ack (a fuzzing find)."""
    start = convert.ingest_request(
        Session(session_id=SESSION, system=SPEC.system.name, started_at=datetime.now(UTC))
    )
    chosen = _message("chosen by its producer", 0)
    chosen.agent_message.assign_index = False
    async with in_process_daemon(tmp_path, SPEC, ScriptedBackend(schema_answer)) as daemon:
        async with client_of(daemon) as client:
            await client.send([start, _message("numbered first")])  # takes index 0
            chosen.agent_message.index = 5
            await client.send([chosen, _message("numbered after")])
        assert daemon._store is not None
        stored = await daemon._store.session_messages(SESSION)
    assert [(m.index, m.content) for m in stored] == [
        (0, "numbered first"),
        (5, "chosen by its producer"),
        (6, "numbered after"),
    ]
