"""An exporter's retry of an export that was stored (its answer lost, a timeout: OTLP exporters
retry by spec) is stored once, over both transports and encodings and on both store adapters: the
copies are dropped by their spans' keys, counted, and the retry is answered as success."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, live_export, otlp_json
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import ItemKey, MessageKind
from poirotd.transports.otlp.mapping import MappedMessage
from tests.support.daemon import in_process_daemon
from tests.support.stores import StoreDb

Send = Callable[[Daemon, ExportTraceServiceRequest], Awaitable[ExportTraceServiceResponse]]
# The GenAI run: 7 messages from 6 spans, 2 more spans rejected (poirotd/devtools/otlp_runs.py).
MESSAGES = 7
REJECTED = 2


async def _grpc(daemon: Daemon, export: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        answer: ExportTraceServiceResponse = await trace_service_pb2_grpc.TraceServiceStub(
            channel
        ).Export(export, timeout=30)
    return answer


async def _http_protobuf(
    daemon: Daemon, export: ExportTraceServiceRequest
) -> ExportTraceServiceResponse:
    body = await _post(daemon, export.SerializeToString(), "application/x-protobuf")
    return ExportTraceServiceResponse.FromString(body)


async def _http_json(
    daemon: Daemon, export: ExportTraceServiceRequest
) -> ExportTraceServiceResponse:
    body = await _post(daemon, otlp_json(export), "application/json")
    return json_format.Parse(body, ExportTraceServiceResponse())


async def _post(daemon: Daemon, body: bytes, content_type: str) -> bytes:
    url = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(url, content=body, headers={"Content-Type": content_type})
    assert answer.status_code == 200, answer.text
    return answer.content


@pytest.fixture
async def daemon(tmp_path: Path, store_db: StoreDb) -> AsyncIterator[Daemon]:
    on_postgres = {"db_url": store_db.target} if store_db.name == "postgres" else {}
    async with in_process_daemon(
        tmp_path,
        SPEC.model_copy(update={"rules": ()}),
        ScriptedBackend(schema_answer),
        otlp_http_port=free_port(),
        **on_postgres,
    ) as d:
        yield d


def _duplicates(daemon: Daemon) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_duplicates_total", {"kind": "agent_message"}
    )
    return value or 0.0


async def _stored(daemon: Daemon, session_id: str) -> list[tuple[int, MessageKind, str, str]]:
    assert daemon._store is not None
    messages = await daemon._store.session_messages(session_id)
    return [(m.index, m.kind, m.sender, m.content) for m in messages]


@pytest.mark.parametrize("send", [_grpc, _http_protobuf, _http_json])
async def test_the_same_export_sent_twice_is_stored_once(daemon: Daemon, send: Send) -> None:
    export = live_export("retried")
    first = await send(daemon, export)
    stored = await _stored(daemon, "retried")
    assert len(stored) == MESSAGES
    retry = await send(daemon, export)
    assert retry == first, "the retry is answered as the export was"
    assert retry.partial_success.rejected_spans == REJECTED
    assert await _stored(daemon, "retried") == stored
    assert _duplicates(daemon) == MESSAGES
    # The daemon goes on numbering past the indexes the dropped copies took.
    await send(daemon, live_export("retried"))
    again = await _stored(daemon, "retried")
    assert len(again) == 2 * MESSAGES
    assert again[MESSAGES][0] > stored[-1][0]


async def test_a_retry_sent_before_the_first_copy_is_answered_is_stored_once(
    daemon: Daemon,
) -> None:
    """An exporter that timed out resends while its first export still waits for its commit:
    both may be committed together, and the batch keeps the first holder of each key."""
    export = live_export("raced")
    answers = await asyncio.gather(_grpc(daemon, export), _http_protobuf(daemon, export))
    assert [a.partial_success.rejected_spans for a in answers] == [REJECTED, REJECTED]
    assert len(await _stored(daemon, "raced")) == MESSAGES
    assert _duplicates(daemon) == MESSAGES


async def test_spans_resent_in_another_batch_are_stored_once(daemon: Daemon) -> None:
    """A Collector's retry queue may resend a span batched with others: the key is the span's,
    not the export's."""
    export = live_export("rebatched")
    spans = export.resource_spans[0].scope_spans[0].spans
    half = ExportTraceServiceRequest()
    half.CopyFrom(export)
    del half.resource_spans[0].scope_spans[0].spans[len(spans) // 2 :]
    await _grpc(daemon, half)
    partly = await _stored(daemon, "rebatched")
    assert 0 < len(partly) < MESSAGES
    other = live_export("another")
    export.resource_spans.extend(other.resource_spans)  # the whole trace, with another one
    await _http_protobuf(daemon, export)
    whole = await _stored(daemon, "rebatched")
    assert len(whole) == MESSAGES
    assert len(await _stored(daemon, "another")) == MESSAGES
    assert _duplicates(daemon) == len(partly)


def _message(trace_id: str, span_id: str, position: int = 0) -> MappedMessage:
    start = 1_767_225_600 * 10**9
    return MappedMessage(
        "s",
        MessageKind.AGENT,
        "doctor",
        "",
        "hi",
        (),
        "",
        start + 5,
        trace_id,
        span_id,
        position,
        start,
    )


def test_a_message_is_keyed_by_its_span_and_its_place_in_it() -> None:
    trace_id, span_id = "ab" * 16, "cd" * 8
    producer = f"otlp:18867251edfa0000{trace_id}{span_id}"
    assert _message(trace_id, span_id, 2).key() == ItemKey(producer, 2)


def test_an_authenticated_exporters_spans_are_keyed_apart_from_anothers() -> None:
    """Span ids are the exporter's to choose: with authentication on, the same ids from two
    exporters are two keys, and a name with "|" cannot pass for another exporter's."""
    message = _message("ab" * 16, "cd" * 8, 0)
    a, b = message.key("token:collector-a"), message.key("token:collector-b")
    assert a is not None and b is not None and a != b != message.key()
    assert a.producer.endswith("cd" * 8 + "|token:collector-a")
    assert message.key("token:a|b") != message.key("token:a") and "%7C" in str(
        message.key("token:a|b")
    )


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [("", "cd" * 8), ("ab" * 16, ""), ("0" * 32, "cd" * 8), ("ab" * 16, "0" * 16), ("ab", "cd")],
)
def test_a_span_without_valid_ids_gives_no_key(trace_id: str, span_id: str) -> None:
    """Such spans would share one key: their messages are stored at least once, as before."""
    assert _message(trace_id, span_id).key() is None
