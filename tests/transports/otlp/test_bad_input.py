"""Bad OTLP input gets a clear answer and a counted refusal, and the daemon goes on: truncated
protobuf, a wrong content type or encoding, an oversized or gzip-bomb body, JSON that is not an
export, spans that cannot be placed (in partial_success), and throttling under load, where every
acknowledged export is stored and a refused one is not."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import RUNS, SPEC, live_export
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from tests.support.daemon import in_process_daemon

PROTOBUF = {"Content-Type": "application/x-protobuf"}
BODY_LIMIT = 64 * 1024


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with in_process_daemon(
        tmp_path,
        SPEC,
        ScriptedBackend(schema_answer),
        otlp_http_port=free_port(),
        otlp_max_body_bytes=BODY_LIMIT,
        otlp_max_pending_messages=1,
    ) as d:
        yield d


def _url(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"


def _refusals(daemon: Daemon, rpc: str, reason: str) -> float:
    return daemon.metrics.requests_rejected.labels(rpc, reason)._value.get()  # type: ignore[no-any-return]


async def test_http_refuses_what_it_cannot_read_with_a_status_that_says_why(
    daemon: Daemon,
) -> None:
    good = live_export().SerializeToString()
    cases = [
        (good[: len(good) // 2], PROTOBUF, 400, "undecodable", "not an ExportTraceServiceRequest"),
        (good, {"Content-Type": "text/plain"}, 415, "wrong_content_type", "is not application"),
        (good, {**PROTOBUF, "Content-Encoding": "br"}, 415, "wrong_encoding", "'br'"),
        (b"x" * (BODY_LIMIT + 1), PROTOBUF, 413, "oversized", "over 65536 bytes"),
        (
            gzip.compress(b"\0" * (BODY_LIMIT * 16)),
            {**PROTOBUF, "Content-Encoding": "gzip"},
            413,
            "oversized",
            "once decompressed",
        ),
        (
            gzip.compress(good)[:-12],
            {**PROTOBUF, "Content-Encoding": "gzip"},
            400,
            "undecodable",
            "truncated",
        ),
        (
            b'{"resourceSpans": 7}',
            {"Content-Type": "application/json"},
            400,
            "undecodable",
            "not an OTLP/JSON",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "zz"}]}]}]}',
            {"Content-Type": "application/json"},
            400,
            "undecodable",
            "'zz' is not hex",
        ),
    ]
    async with httpx.AsyncClient() as client:
        for body, headers, status, reason, says in cases:
            answer = await client.post(_url(daemon), content=body, headers=headers)
            assert answer.status_code == status, (reason, answer.text)
            if answer.headers["content-type"].startswith("application/x-protobuf"):
                message = Status.FromString(answer.content).message
            else:
                message = answer.json()["message"]
            assert says in message, message
            assert _refusals(daemon, "otlp_http", reason) >= 1
        # and the daemon still takes a good export
        answer = await client.post(_url(daemon), content=good, headers=PROTOBUF)
        assert answer.status_code == 200


async def test_grpc_answers_a_truncated_export_invalid_argument(daemon: Daemon) -> None:
    good = live_export().SerializeToString()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda raw: raw,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(good[: len(good) // 2])
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert _refusals(daemon, "TraceService.Export", "undecodable") == 1
        answer = await export(good)
    # Spans that cannot be placed are reported, the rest is stored.
    assert answer.partial_success.rejected_spans == 2
    assert answer.partial_success.error_message.startswith("2 of 10 spans rejected; first: span")
    assert "no_content" in answer.partial_success.error_message
    assert daemon._store is not None
    assert len(await daemon._store.session_messages("conv-1")) == 7


async def test_json_exports_are_read_and_answered_in_json(daemon: Daemon) -> None:
    from poirotd.devtools.otlp_runs import otlp_json

    async with httpx.AsyncClient() as client:
        answer = await client.post(
            _url(daemon),
            content=otlp_json(live_export("conv-json")),
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code == 200
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "2"
    assert daemon._store is not None
    assert len(await daemon._store.session_messages("conv-json")) == 7


async def test_under_load_exports_are_throttled_and_every_acknowledged_one_is_stored(
    daemon: Daemon,
) -> None:
    bodies = [live_export(f"load-{i}").SerializeToString() for i in range(12)]
    async with httpx.AsyncClient() as client:
        answers = await asyncio.gather(
            *(client.post(_url(daemon), content=body, headers=PROTOBUF) for body in bodies)
        )
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, statuses
    assert all(a.headers["Retry-After"] == "1" for a in answers if a.status_code == 429)
    assert daemon._store is not None
    for i, answer in enumerate(answers):
        stored = await daemon._store.session_messages(f"load-{i}")
        assert len(stored) == (7 if answer.status_code == 200 else 0), (i, answer.status_code)
    print(
        f"throttling: {statuses.count(200)} acknowledged and stored, {statuses.count(429)} "
        "refused with 429 and not stored"
    )


async def test_grpc_throttling_carries_the_retry_delay(daemon: Daemon) -> None:
    exports = [live_export(f"grpc-load-{i}") for i in range(12)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        answers = await asyncio.gather(*(stub.Export(e) for e in exports), return_exceptions=True)
    throttled = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    assert throttled and len(throttled) < len(answers)
    for error in throttled:
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailers = dict(error.trailing_metadata() or ())
        retry = RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
        assert retry.retry_delay.seconds == 1
    assert {r for r in RUNS} and _refusals(daemon, "TraceService.Export", "throttled") == len(
        throttled
    )


async def test_a_fault_of_ours_is_answered_500_with_an_id_counted_and_the_daemon_goes_on(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    from poirotd.transports.otlp import receiver

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    good = live_export("after-the-fault").SerializeToString()
    async with httpx.AsyncClient() as client:
        with monkeypatch.context() as patched:
            patched.setattr(receiver, "map_spans", broken)
            answer = await client.post(_url(daemon), content=good, headers=PROTOBUF)
        assert answer.status_code == 500
        assert Status.FromString(answer.content).message.startswith("internal error ")
        assert _refusals(daemon, "otlp_http", "internal") == 1
        assert (await client.post(_url(daemon), content=good, headers=PROTOBUF)).status_code == 200
