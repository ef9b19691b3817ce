"""What one client may hold open or do per second, and how long a stream it stopped using, or a
connection whose peer vanished, holds on; over real loopback gRPC.

The daemons here bind "localhost": 127.0.0.1 and ::1 on one port, two clients as
`client_identity` tells them apart (by host; every channel of one host counts together; behind
authentication, by the caller's name).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.held_stream import HeldStream
from poirotd.devtools.ingest_requests import session
from poirotd.errors import ResourceExhausted
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.grpc.clients import Bound, ClientRates
from poirotd.transports.token_bucket import TokenBucket
from tests.support.core_errors import client_core_error
from tests.support.daemon import in_process_daemon, limit_rejections, rejected, stored_messages
from tests.support.pki import Pki, locked_daemon
from tests.support.pki import client as pki_client

V4, V6 = "127.0.0.1", "[::1]"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_token_bucket_refuses_beyond_its_burst_and_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3.0, clock=clock)
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.try_take() == pytest.approx(0.5), "refused, with the wait until a token"
    clock.now += 0.5
    assert bucket.try_take() == 0.0
    clock.now += 3600
    assert bucket.full
    assert [bucket.try_take() for _ in range(4)][3] > 0, "an idle hour still holds only 3"


def test_reserving_paces_callers_in_turn_even_beyond_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=5.0, clock=clock)
    assert bucket.reserve(5) == 0.0
    assert bucket.reserve(10) == pytest.approx(1.0), "beyond the burst: in debt"
    assert bucket.reserve(1) == pytest.approx(1.1), "the next one waits behind the debt"
    clock.now += 1.1
    assert bucket.reserve(0) == 0.0 and not bucket.full
    clock.now += 0.5
    assert bucket.full


def test_client_rates_hold_each_client_to_its_own_bucket_and_forget_idle_ones() -> None:
    clock = FakeClock()
    rate, burst = Bound(0.5, "trigger_rate_per_client"), Bound(1, "trigger_burst_per_client")
    rates = ClientRates("trigger", reason="trigger_rate", rate=rate, burst=burst, clock=clock)
    rates.take("10.0.0.1")
    with pytest.raises(ResourceExhausted, match=r"POIROTD_TRIGGER_RATE_PER_CLIENT=0.5 .* 2.0 s"):
        rates.take("10.0.0.1")
    rates.take("10.0.0.2")
    clock.now += 2
    rates.take("10.0.0.3")  # the first two are full again: forgotten
    assert list(rates._buckets) == ["10.0.0.3"]
    rates.take("10.0.0.1")


def throttled_seconds(daemon: Daemon) -> float:
    return daemon.metrics.registry.get_sample_value("poirot_ingest_throttled_seconds_total") or 0.0


def client_at(daemon: Daemon, host: str) -> PoirotClient:
    return PoirotClient(f"{host}:{daemon.grpc_port}")


def loopback_daemon(tmp_path: Path, **settings: Any) -> AbstractAsyncContextManager[Daemon]:
    """A daemon on both loopback addresses, with these settings."""
    backend = ScriptedBackend(schema_answer)
    return in_process_daemon(tmp_path, CLINIC, backend, grpc_host="localhost", **settings)


async def test_a_client_may_hold_only_so_many_ingest_streams(tmp_path: Path) -> None:
    async with (
        loopback_daemon(tmp_path, max_ingest_streams_per_client=2) as daemon,
        AsyncExitStack() as clients,
    ):
        # A channel each: many connections (ports) of one host are one client.
        ones = [await clients.enter_async_context(client_at(daemon, V4)) for _ in range(3)]
        held = [HeldStream(ones[i], f"s{i}") for i in range(2)]
        assert [await stream.opened() for stream in held] == [1, 1]

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ones[2].send(session(2, "s2"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details() or ""
        assert "client 127.0.0.1 has 2 Ingest streams open" in details
        assert "POIROTD_MAX_INGEST_STREAMS_PER_CLIENT=2" in details
        assert limit_rejections(daemon, "too_many_streams") == 1
        assert rejected(daemon, "Ingest.Stream", "too_many_streams") == 1

        other = await clients.enter_async_context(client_at(daemon, V6))
        assert await other.send(session(2, "s3")) == 3, "another client has its own count"
        await held[0].close()
        assert await ones[2].send(session(2, "s2")) == 3, "a closed stream frees its slot"
        await held[1].close()
        assert stored_messages(daemon) == 4


async def test_silent_streams_give_their_slots_back_at_the_idle_deadline(tmp_path: Path) -> None:
    """Issue 28: streams that sent nothing more were held for good, and as many as a client may
    hold shut out every other producer of its host (in a sidecar, every producer)."""
    idle = 1.0
    async with (
        loopback_daemon(tmp_path, ingest_idle_seconds=idle) as daemon,
        client_at(daemon, V4) as stuck,
        client_at(daemon, V4) as late,
    ):
        bound = daemon.settings.max_ingest_streams_per_client
        silent = [HeldStream(stuck, f"s{i}") for i in range(bound)]
        assert [await stream.opened() for stream in silent] == [1] * bound
        all_acked = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await late.send(session(2, "late"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        endings = await asyncio.gather(*(stream.ended() for stream in silent))
        assert time.monotonic() - all_acked >= idle - 0.1, "not before the deadline"
        for code, details in endings:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert details.startswith("idle: no request for 1 s")
            assert "POIROTD_INGEST_IDLE_SECONDS=1" in details
        assert await late.send(session(2, "late")) == 3, "the same host's next producer is in"
        assert rejected(daemon, "Ingest.Stream", "idle") == bound
        with sqlite3.connect(daemon.settings.db_path) as db:
            (sessions,) = db.execute("SELECT count(*) FROM sessions").fetchone()
        assert sessions == bound + 1, "what the silent streams sent stays stored"


async def test_a_stream_that_sends_nothing_at_all_is_ended_at_the_idle_deadline(
    tmp_path: Path,
) -> None:
    async with (
        loopback_daemon(tmp_path, ingest_idle_seconds=0.5) as daemon,
        client_at(daemon, V4) as client,
    ):
        opened = time.monotonic()
        code, details = await asyncio.wait_for(HeldStream(client, None).ended(), 10)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and details.startswith("idle:")
        assert time.monotonic() - opened >= 0.5
        assert rejected(daemon, "Ingest.Stream", "idle") == 1


async def test_behind_authentication_each_caller_counts_its_own_streams(tmp_path: Path) -> None:
    """A client is its name in the access file, whatever host it calls from: producers of one
    host with tokens of their own hold streams of their own."""
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({"token-a": ("agents-a", ["ingest"]), "token-b": ("agents-b", ["ingest"])}, {})
    tls = pki.client_tls()
    async with (
        locked_daemon(
            tmp_path, pki, auth_file=pki.auth_file, max_ingest_streams_per_client=1
        ) as daemon,
        pki_client(daemon, tls, token="token-a") as a,
        pki_client(daemon, tls, token="token-a") as a_again,
        pki_client(daemon, tls, token="token-b") as b,
    ):
        held = HeldStream(a, "s-a")
        assert await held.opened() == 1
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await a_again.send(session(1, "s-a2"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "client token:agents-a has 1 Ingest streams open" in (refused.value.details() or "")
        assert await b.send(session(1, "s-b")) == 2
        await held.close()


async def test_a_clients_ingest_rate_paces_its_streams_together_and_loses_nothing(
    tmp_path: Path,
) -> None:
    rate, burst, per_stream = 400, 100, 300
    async with (
        loopback_daemon(
            tmp_path, ingest_rate_per_client=rate, ingest_burst_per_client=burst
        ) as daemon,
        client_at(daemon, V4) as one,
        client_at(daemon, V4) as same_host,
        client_at(daemon, V6) as other,
    ):
        clients = (one, same_host)  # two connections of one host
        began = time.monotonic()
        # One batched request of 300 items per stream: 600 items at 400/s after a burst of 100.
        paced = [client.send(session(per_stream - 1, f"s{i}")) for i, client in enumerate(clients)]
        assert await asyncio.gather(*paced) == [per_stream, per_stream], "nothing refused"
        assert time.monotonic() - began >= (2 * per_stream - burst) / rate - 0.05
        # The first waited (300 - 100) / 400 s, the second behind it (600 - 100) / 400 s (less
        # what accrued between them); with a bucket per stream both would have waited 0.5 s.
        owed = throttled_seconds(daemon)
        assert 1.4 < owed <= 1.75

        assert await other.send(session(burst - 1, "s-other")) == burst
        assert throttled_seconds(daemon) == owed, "another client has its own bucket"
        assert stored_messages(daemon) == 2 * (per_stream - 1) + burst - 1


async def test_watch_streams_are_bounded_per_client_and_in_all(tmp_path: Path) -> None:
    async with (
        loopback_daemon(tmp_path, max_watchers=3, max_watchers_per_client=2) as daemon,
        client_at(daemon, V4) as one,
        client_at(daemon, V6) as other,
    ):
        await one.send(session(3))
        done = await one.trigger("s1", "events to watch")
        assert [e async for e in one.watch(done.investigation_id)], "a watch that ends frees"

        watches: list[grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.InvestigationEvent]] = []

        async def watch_all(client: PoirotClient) -> None:
            call = client.investigations.Watch(pb.WatchRequest())
            watches.append(call)
            assert isinstance(await call.read(), pb.InvestigationEvent)  # held now

        await watch_all(one)
        await watch_all(one)
        await expect_refused(
            watch_all(one),
            "client 127.0.0.1 has 2 Watch streams open",
            "POIROTD_MAX_WATCHERS_PER_CLIENT=2",
        )
        await watch_all(other)
        await expect_refused(watch_all(other), "3 Watch streams are open", "POIROTD_MAX_WATCHERS=3")
        assert limit_rejections(daemon, "too_many_watchers") == 2

        watches[0].cancel()  # the daemon learns of it a moment later
        async with asyncio.timeout(10):
            while True:
                try:
                    await watch_all(one)
                    break
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.05)
        for call in watches:
            call.cancel()


async def expect_refused(call: Awaitable[None], *fragments: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = refused.value.details() or ""
    assert all(f in details for f in fragments), details


async def test_a_clients_triggers_are_held_to_its_rate(tmp_path: Path) -> None:
    async with (
        loopback_daemon(
            tmp_path, trigger_rate_per_client=0.001, trigger_burst_per_client=2
        ) as daemon,
        client_at(daemon, V4) as one,
        client_at(daemon, V6) as other,
    ):
        await one.send(session(3))
        for n in range(2):
            await one.trigger("s1", f"burst {n}")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await one.trigger("s1", "one too many")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details() or ""
        assert details.startswith("client 127.0.0.1 is over POIROTD_TRIGGER_RATE_PER_CLIENT=0.001")
        assert "POIROTD_TRIGGER_BURST_PER_CLIENT=2" in details and "retry in " in details
        assert limit_rejections(daemon, "trigger_rate") == 1
        assert (await other.trigger("s1", "another client")).investigation_id


class Blackhole:
    """A TCP proxy to a local port that, once `cut`, forwards nothing either way and keeps every
    connection open: to each side, the other went silent."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._cut = False
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            for pipe in self._pipes:
                pipe.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)
            for writer in self._writers:  # both ends of every connection it held
                writer.close()
            await asyncio.gather(*(w.wait_closed() for w in self._writers), return_exceptions=True)

    def cut(self) -> None:
        self._cut = True

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers += [writer, upstream_writer]
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(1 << 16):
            if not self._cut:
                sink.write(data)
                await sink.drain()


async def test_a_vanished_peers_stream_is_freed_by_keepalive(tmp_path: Path) -> None:
    keepalive, timeout = 0.5, 0.5
    async with loopback_daemon(
        tmp_path,
        max_ingest_streams_per_client=1,
        grpc_keepalive_seconds=keepalive,
        grpc_keepalive_timeout_seconds=timeout,
    ) as daemon:
        blackhole = Blackhole(daemon.grpc_port)
        async with (
            blackhole.serving() as port,
            PoirotClient(f"127.0.0.1:{port}") as vanishing,
            PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as other,
        ):
            held = HeldStream(vanishing, "s1")  # idle deadline: 30 s, far off
            assert await held.opened() == 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await other.send(session(1, "s2"))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            blackhole.cut()
            cut = time.monotonic()
            async with asyncio.timeout(10):
                while True:
                    try:
                        assert await other.send(session(1, "s2")) == 2
                        break
                    except grpc.aio.AioRpcError as error:
                        # still refused; grpc's client may report its own INTERNAL instead
                        refused_again = error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        assert refused_again or client_core_error(error), error
                        await asyncio.sleep(0.1)
            # The server pings once its keepalive time passed without a read, and gives up
            # `timeout` later; the client's cancelled call freed the slot.
            assert time.monotonic() - cut >= timeout
