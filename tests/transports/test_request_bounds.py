"""What a refused request may cost: each Investigations method's request bound, enforced before
the request is decoded, and nothing of a refused call left in memory once it has ended (issue 28).

Over real loopback gRPC against an in-process daemon; the memory of a daemon process under a
flood of refused requests is tests/bench/test_grpc_transport.py's.
"""

from __future__ import annotations

import gc
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest

from poirotd.api.limits import MAX_REQUEST_BYTES, TEXT_REQUEST_BYTES
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.ingest.validation import MAX_NAME_CHARS
from poirotd.investigations.service import MAX_TEXT_CHARS
from poirotd.transports.grpc.guard import rpc_name
from tests.support.daemon import limit_rejections, rejected

INVESTIGATIONS = pb.DESCRIPTOR.services_by_name["Investigations"]


def _path(method: str) -> str:
    return f"/{INVESTIGATIONS.full_name}/{method}"


def test_every_investigations_and_health_method_has_a_request_bound() -> None:
    health = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")
    assert set(MAX_REQUEST_BYTES) == {_path(m.name) for m in INVESTIGATIONS.methods} | {*health}


def test_the_largest_requests_the_service_accepts_fit_their_bound() -> None:
    """Four-byte characters throughout: a reason or a note at the service's text limit, with a
    session id at the ingest name limit, still goes through."""
    wide = "\U0001f9e0"
    trigger = pb.TriggerRequest(
        session_id=wide * MAX_NAME_CHARS, reason=wide * MAX_TEXT_CHARS, method="errorprobe"
    )
    confirm = pb.ConfirmOutcomeRequest(
        investigation_id="0" * 32,
        region_ids=[wide * 64] * 64,
        note=wide * MAX_TEXT_CHARS,
        supersede=True,
    )
    assert trigger.ByteSize() <= MAX_REQUEST_BYTES[_path("Trigger")] == TEXT_REQUEST_BYTES
    assert confirm.ByteSize() <= MAX_REQUEST_BYTES[_path("ConfirmOutcome")]
    watch = pb.WatchRequest(
        investigation_id="0" * 32, component=wide * MAX_NAME_CHARS, system=wide * MAX_NAME_CHARS
    )
    listing = pb.ListInvestigationsRequest(session_id=wide * MAX_NAME_CHARS, page_token="t" * 512)
    assert watch.ByteSize() <= MAX_REQUEST_BYTES[_path("Watch")]
    assert listing.ByteSize() <= MAX_REQUEST_BYTES[_path("List")]


async def _call_raw(daemon: Daemon, path: str, raw: bytes) -> grpc.aio.AioRpcError:
    """`raw` as the request of the method at `path` (a server stream's first reply awaited)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        if path.endswith("/Watch"):
            call: Awaitable[Any] = channel.unary_stream(path)(raw, timeout=10).read()
        else:
            call = channel.unary_unary(path)(raw, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
    return refused.value


@pytest.mark.parametrize("path", sorted(MAX_REQUEST_BYTES))
async def test_a_request_over_its_methods_bound_is_refused_before_it_is_decoded(
    daemon: Daemon, path: str
) -> None:
    limit = MAX_REQUEST_BYTES[path]
    # Not a protobuf message at all: decoded, it would be INVALID_ARGUMENT (undecodable).
    refused = await _call_raw(daemon, path, b"\xff" * (limit + 1))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    rpc = rpc_name(path)
    assert refused.details() == f"the request is {limit + 1} bytes; {rpc} takes at most {limit}"
    assert rejected(daemon, rpc, "request_size") == 1
    assert rejected(daemon, rpc, "undecodable") == 0
    assert limit_rejections(daemon, "request_size") == 1


async def test_a_request_at_its_bound_is_read(daemon: Daemon, client: PoirotClient) -> None:
    limit = MAX_REQUEST_BYTES[_path("Get")]
    request = pb.GetInvestigationRequest(investigation_id="x" * (limit - 3))
    assert request.ByteSize() == limit
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await client.investigations.Get(request)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert limit_rejections(daemon, "request_size") == 0


def _refusals(
    client: PoirotClient, channel: grpc.aio.Channel
) -> Iterator[tuple[str, Callable[[], Awaitable[Any]]]]:
    """A refusal of each kind the transport and the service give."""
    stub, long_id = client.investigations, "x" * 2000
    yield "not found", lambda: stub.Get(pb.GetInvestigationRequest(investigation_id=long_id))
    yield "unknown session", lambda: stub.Trigger(pb.TriggerRequest(session_id=long_id))
    yield "bad token", lambda: stub.List(pb.ListInvestigationsRequest(page_token=long_id))
    yield (
        "confirm unknown",
        lambda: stub.ConfirmOutcome(pb.ConfirmOutcomeRequest(investigation_id=long_id)),
    )
    yield "watch unknown", lambda: stub.Watch(pb.WatchRequest(after_event_id=2**63)).read()
    yield "oversized", lambda: stub.Get(pb.GetInvestigationRequest(investigation_id="x" * 10**5))
    yield "undecodable", lambda: channel.unary_unary(_path("Get"))(b"\x0a\x05\xff")


def _kept(garbage: list[Any]) -> list[str]:
    """What of a refused call waits in `garbage` for the cyclic collector: grpc's AbortError, the
    frames of poirotd's handlers and requests."""
    kept = []
    for thing in garbage:
        if isinstance(thing, grpc.aio.AbortError):
            kept.append(repr(thing))
        elif isinstance(thing, types.FrameType) and "/poirotd/" in thing.f_code.co_filename:
            kept.append(f"frame {thing.f_code.co_name}")
        elif type(thing).__name__.endswith("Request"):
            kept.append(type(thing).__name__)
    return kept


async def test_nothing_of_a_refused_call_waits_for_the_cyclic_collector(
    daemon: Daemon, client: PoirotClient
) -> None:
    """Issue 28: grpc keeps the AbortError of a refusal on the call, and its traceback held the
    handler's frames, hence the request: a reference cycle only the cyclic collector frees,
    which the daemon runs rarely (observability.gc_tuning). 300 refused 3 MB Gets took a daemon
    from 122 MB to 1.9 GB."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}")
    refusals = list(_refusals(client, channel))
    gc.collect()
    gc.disable()
    try:
        for kind, call in refusals:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call()
            assert refused.value.code() not in (
                grpc.StatusCode.INTERNAL,
                grpc.StatusCode.UNKNOWN,
            ), kind
        del refused
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kept = _kept(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await channel.close()
    assert kept == []
