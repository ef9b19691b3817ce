"""The Sessions service over real loopback gRPC, against an in-process daemon: paging, the
telemetry summary, pages of messages within the reply's byte bound, and counted refusals."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.ingest_requests import T0, message, motor_temp, session, start
from poirotd.transports.grpc import sessions as sessions_servicer
from tests.support.daemon import rejected


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


async def test_sessions_page_newest_first_with_their_counts(
    daemon: Daemon, client: PoirotClient
) -> None:
    for n in range(3):
        await client.send(session(n, f"s{n}"))
    pages: list[list[tuple[str, int]]] = []
    token = ""
    while True:
        page = await client.list_sessions(page_size=2, page_token=token)
        pages.append([(s.session_id, s.messages) for s in page.sessions])
        token = page.next_page_token
        if not token:
            break
    assert pages == [[("s2", 2), ("s1", 1)], [("s0", 0)]]
    error = await refused(client.list_sessions(page_size=501))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "page_size is at most 500"
    error = await refused(client.list_sessions(page_token="not ours"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected(daemon, "Sessions.List", "invalid") == 2


async def test_a_session_with_its_telemetry_summary_and_no_messages_unless_asked(
    daemon: Daemon, client: PoirotClient
) -> None:
    readings = [motor_temp(s, v) for s, v in ((1, 41.0), (2, 39.5), (3, 44.0))]
    await client.send([*session(2), *readings])
    detail = await client.get_session("s1")
    assert detail.session.messages == 2 and detail.session.investigations == 0
    assert not detail.messages and not detail.HasField("next_index")
    (signal,) = detail.telemetry
    assert (signal.component, signal.signal, signal.samples) == ("exo", "motor_temp_c", 3)
    assert (signal.min, signal.max, signal.last) == (39.5, 44.0, 44.0)
    assert signal.first_at.ToSeconds() == T0.timestamp() + 1
    assert signal.last_at.ToSeconds() == T0.timestamp() + 3
    assert detail.telemetry_window == 10_000

    error = await refused(client.get_session("nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "session 'nope' is not known"
    assert rejected(daemon, "Sessions.Get", "unknown_session") == 1
    error = await refused(client.get_session("s1", include_messages=True, max_messages=1001))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected(daemon, "Sessions.Get", "invalid") == 1


async def test_pages_of_messages_stop_at_their_count_or_their_bytes(
    client: PoirotClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.send([start(), *(message(i, content=f"{i}" * 1000) for i in (0, 1, 2, 4, 5))])

    async def page(**kw: int) -> tuple[list[int], int | None]:
        detail = await client.get_session("s1", include_messages=True, **kw)
        following = detail.next_index if detail.HasField("next_index") else None
        return [m.index for m in detail.messages], following

    assert await page() == ([0, 1, 2, 4, 5], None)
    assert await page(max_messages=2) == ([0, 1], 2)
    assert await page(from_index=3, max_messages=1) == ([4], 5)
    assert await page(from_index=6) == ([], None)
    monkeypatch.setattr(sessions_servicer, "MESSAGE_BYTES", 2500)
    assert await page() == ([0, 1], 2), "cut where the next would pass the bound"
    monkeypatch.setattr(sessions_servicer, "MESSAGE_BYTES", 10)
    assert await page(from_index=1) == ([1], 2), "at least one, however large"


async def test_the_sessions_service_reports_its_health(daemon: Daemon) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="poirot.v1.Sessions"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert pb.DESCRIPTOR.services_by_name["Sessions"].full_name == "poirot.v1.Sessions"
