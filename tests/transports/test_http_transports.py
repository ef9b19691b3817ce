"""Slow clients and floods of connections on the HTTP transports (/metrics, OTLP/HTTP), over real
sockets, plain and TLS: a request must be whole within POIROTD_HTTP_REQUEST_SECONDS, connections
are capped per peer and in all, each refusal is counted, and the transports go on serving."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from tests.support.daemon import in_process_daemon, rejected
from tests.support.pki import SERVER_NAME, Pki

TOKEN = "transports-token"  # holds the ingest and metrics roles
DEADLINE = 1.0
# How much later than the deadline a connection may end on a shared, loaded machine.
SLACK = 2.0
TRANSPORTS = ("metrics", "otlp_http")
REQUESTS = {
    "metrics": b"GET /metrics HTTP/1.1\r\nHost: poirotd\r\n",
    "otlp_http": b"POST /v1/traces HTTP/1.1\r\nHost: poirotd\r\n"
    b"Content-Type: application/x-protobuf\r\n",
}
AUTHORIZED = f"Authorization: Bearer {TOKEN}\r\n".encode()


@dataclass(frozen=True)
class HttpTransports:
    daemon: Daemon
    tls: ssl.SSLContext | None

    def port(self, transport: str) -> int:
        if transport == "metrics":
            return self.daemon.metrics_port
        return self.daemon.settings.otlp_http_port

    def refused(self, transport: str, reason: str) -> float:
        value = self.daemon.metrics.registry.get_sample_value(
            "poirot_http_connections_refused_total", {"transport": transport, "reason": reason}
        )
        return value or 0.0

    def open_connections(self, transport: str) -> float:
        value = self.daemon.metrics.registry.get_sample_value(
            "poirot_http_connections", {"transport": transport}
        )
        return value or 0.0

    async def connect(
        self, transport: str, source: str = "127.0.0.1", *, handshake: bool = True
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection from `source` (any 127.0.0.0/8 address is loopback), over TLS when the
        transports serve it, unless `handshake` is False (a client that never starts it)."""
        tls = self.tls if handshake else None
        return await asyncio.open_connection(
            "127.0.0.1",
            self.port(transport),
            ssl=tls,
            server_hostname=SERVER_NAME if tls else None,
            local_addr=(source, 0),
        )

    async def ask(self, transport: str, source: str = "127.0.0.1") -> int:
        """A whole authorized request on a new connection; the answer's status."""
        reader, writer = await self.connect(transport, source)
        writer.write(REQUESTS[transport] + AUTHORIZED + b"Content-Length: 0\r\n\r\n")
        try:
            return status(await asyncio.wait_for(reader.readline(), 5))
        finally:
            writer.close()


@asynccontextmanager
async def open_transports(
    tmp_path: Path, tls: bool, **settings: Any
) -> AsyncIterator[HttpTransports]:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({TOKEN: ("collector", ["ingest", "metrics"])}, {})
    locks: dict[str, Any] = {"auth_file": pki.auth_file}
    context = None
    if tls:
        locks |= {"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file}
        context = ssl.create_default_context()
        pki.ca.configure_trust(context)
    async with in_process_daemon(
        tmp_path,
        SPEC,
        ScriptedBackend(schema_answer),
        otlp_http_port=free_port(),
        **locks,
        **settings,
    ) as daemon:
        yield HttpTransports(daemon, context)


async def lifetime(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bytes = b""
) -> tuple[float, bytes]:
    """Seconds until the daemon ends the connection, sending `trickle` every 0.1 s meanwhile
    (at most 15 s), and what it answered."""
    loop = asyncio.get_running_loop()
    began, answer = loop.time(), b""
    try:
        while loop.time() - began < 15:
            if trickle:
                writer.write(trickle)
                await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(65536), 0.1)
            except TimeoutError:
                continue
            if not data:
                break
            answer += data
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()
    return loop.time() - began, answer


def status(answer: bytes) -> int:
    """The status of an HTTP answer (0: none)."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One answer on a kept-alive connection: its head, then as much body as it announces."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_request_not_whole_within_the_deadline_loses_its_connection(
    tmp_path: Path, tls: bool
) -> None:
    async with open_transports(tmp_path, tls, http_request_seconds=DEADLINE) as http:
        slow: dict[tuple[str, str], asyncio.Task[tuple[float, bytes]]] = {}
        for name in TRANSPORTS:
            cases = {
                "silent": (await http.connect(name), b""),
                "trickled headers": (await http.connect(name), REQUESTS[name] + b"X-Slow: "),
                "stalled body": (
                    await http.connect(name),
                    REQUESTS[name] + AUTHORIZED + b"Content-Length: 1000000000\r\n\r\n0123456789",
                ),
            }
            if tls:
                cases["no handshake"] = (await http.connect(name, handshake=False), b"")
            for case, ((reader, writer), first) in cases.items():
                writer.write(first)
                trickle = b"a" if case == "trickled headers" else b""
                slow[name, case] = asyncio.create_task(lifetime(reader, writer, trickle))
        # Meanwhile whole requests are answered.
        assert await http.ask("metrics") == await http.ask("otlp_http") == 200

        ended = {key: await task for key, task in slow.items()}
        for (name, case), (seconds, answer) in ended.items():
            assert seconds < DEADLINE + SLACK, f"{name}, {case}: held {seconds:.1f} s"
            if case == "stalled body" and name == "metrics":  # answered before the body is in
                assert status(answer) == 200
            else:
                assert answer == b"", f"{name}, {case}"
        for name in TRANSPORTS:
            assert http.refused(name, "request_deadline") == len(ended) / len(TRANSPORTS)
        # The export whose body never came is no fault of the daemon's.
        assert rejected(http.daemon, "otlp_http", "internal") == 0
        # A close reaches the transport a loop turn or two after the abort.
        await _until(lambda: all(http.open_connections(name) == 0 for name in TRANSPORTS))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_slow_but_timely_request_is_served_and_keep_alive_ends_quietly(
    tmp_path: Path, tls: bool
) -> None:
    deadline = 2 * DEADLINE  # room for a loaded machine: the client takes 60% of it
    async with open_transports(tmp_path, tls, http_request_seconds=deadline) as http:
        reader, writer = await http.connect("metrics")
        head = REQUESTS["metrics"] + AUTHORIZED + b"\r\n"
        for part in (head[:10], head[10:30], head[30:]):
            writer.write(part)
            await asyncio.sleep(deadline * 0.3)
        assert status(await read_answer(reader)) == 200
        await asyncio.sleep(deadline * 0.6)  # idle, then a second request on the same connection
        writer.write(head)
        assert status(await read_answer(reader)) == 200
        # Idle after an answer: the connection ends at the deadline, not counted as a refusal.
        seconds, rest = await lifetime(reader, writer)
        assert seconds < deadline + SLACK and rest == b""
        assert http.refused("metrics", "request_deadline") == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_connections_over_a_cap_are_refused_counted_and_the_transport_recovers(
    tmp_path: Path, tls: bool, transport: str
) -> None:
    caps = {"http_max_connections": 3, "http_max_connections_per_peer": 2}
    async with open_transports(tmp_path, tls, **caps) as http:

        async def held(source: str) -> asyncio.StreamWriter:
            _, writer = await http.connect(transport, source)
            return writer

        async def refused(source: str) -> bytes:
            reader, writer = await http.connect(transport, source, handshake=False)
            return (await lifetime(reader, writer))[1]

        holders = [await held("127.0.0.1"), await held("127.0.0.1")]
        await _until(lambda: http.open_connections(transport) == 2)
        answer = await refused("127.0.0.1")
        holders.append(await held("127.0.0.2"))  # another peer is still let in
        await _until(lambda: http.open_connections(transport) == 3)
        answer_in_all = await refused("127.0.0.3")

        if tls:  # refused before the handshake: the connection is closed
            assert answer == answer_in_all == b""
        else:
            assert status(answer) == 503 and b"Retry-After: 1" in answer
            assert b"POIROTD_HTTP_MAX_CONNECTIONS_PER_PEER=2" in answer
            assert b"POIROTD_HTTP_MAX_CONNECTIONS=3" in answer_in_all
        assert http.refused(transport, "too_many_peer_connections") == 1
        assert http.refused(transport, "too_many_connections") == 1

        for writer in holders:
            writer.close()
        await _until(lambda: http.open_connections(transport) == 0)
        assert await http.ask(transport) == await http.ask(transport, "127.0.0.3") == 200


async def _until(condition: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)
