"""Slow clients against the HTTP transports (issue 29.3): what 400 held connections cost a daemon.

    .venv/bin/python -m bench.http_transports             # about 2 minutes
    .venv/bin/python -m bench.http_transports --quick     # under a minute (a 10 s request deadline)

A real daemon process (`bench/daemon_child.py`: `poirotd run`'s wiring, the tests' scripted
LLM) with OTLP/HTTP on and an access file, on loopback; once plain, once with TLS (the transports'
certificate, as beyond loopback they must have). 400 connections are opened against it,
half on /metrics and half on OTLP/HTTP, from 100 loopback addresses (127.0.1.x; the per-peer cap
lets them all in; `--peers 1` shows it refusing), each one of three slow clients in turn: one
that sends nothing; one that trickles its headers, a byte a second; one that sends an authorized
request's headers claiming a 1 GB body and ten bytes of it, then stalls. Each keeps its
connection until the daemon ends it. The daemon's VmRSS and thread count are read before, while
they are held (once every client is connected, or refused, and has sent its bytes), once the
request deadline (POIROTD_HTTP_REQUEST_SECONDS) has passed, and after the clients hung up, with
how many connections were still open; a scrape from another address is timed while they are
held. The results replace this bench's section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trustme

from bench import report
from bench.ingest import proc_status, reap, spawn, until
from bench.sections.http_transports import NAME, section
from poirotd.devtools.otlp_runs import SPEC
from poirotd.devtools.process import free_port
from poirotd.transports.security.access import new_token, token_hash

KINDS = ("silent", "trickled headers", "stalled body")
TRANSPORTS = ("metrics", "otlp_http")
HEADS = {
    "metrics": b"GET /metrics HTTP/1.1\r\nHost: poirotd\r\n",
    "otlp_http": b"POST /v1/traces HTTP/1.1\r\nHost: poirotd\r\n"
    b"Content-Type: application/x-protobuf\r\n",
}


@dataclass(frozen=True)
class Plan:
    mode: str
    connections: int
    peers: int
    deadline: float  # the daemon's POIROTD_HTTP_REQUEST_SECONDS
    settle: float  # seconds, once all are connected, before "held" is read


@dataclass(frozen=True)
class Tls:
    """The daemon's certificate files and a client context that trusts them."""

    cert_file: Path
    key_file: Path
    client: ssl.SSLContext

    @classmethod
    def create(cls, folder: Path) -> Tls:
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1")
        cert_file, key_file = folder / "server.pem", folder / "server.key"
        server.cert_chain_pems[0].write_to_path(str(cert_file))
        server.private_key_pem.write_to_path(str(key_file))
        client = ssl.create_default_context()
        ca.configure_trust(client)
        return cls(cert_file, key_file, client)


@dataclass
class Client:
    transport: str
    kind: str
    source: str
    opened: bool = False
    refused: bool = False  # answered 503, or closed before its TLS handshake
    ended_after: float | None = None  # seconds until the daemon ended it
    hung_up: bool = False  # still open when the clients hung up

    @property
    def settled(self) -> bool:
        """Connected and its bytes sent, or already ended."""
        return self.opened or self.ended_after is not None

    @property
    def open(self) -> bool:
        return self.opened and self.ended_after is None and not self.hung_up


@dataclass(frozen=True)
class Reading:
    when: str
    rss_mib: float
    threads: int
    open_connections: int  # the clients' count


@dataclass
class Results:
    tls: bool
    readings: list[Reading] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    scrape_ms: float | None = None  # a scrape from another address while they are held
    refusals: dict[str, float] = field(
        default_factory=dict
    )  # the daemon's, by transport and reason


def clients(p: Plan) -> Iterator[Client]:
    for n in range(p.connections):
        yield Client(TRANSPORTS[n % 2], KINDS[n // 2 % 3], f"127.0.1.{1 + n % p.peers}")


async def hold(
    client: Client, port: int, token: str, tls: ssl.SSLContext | None, hang_up: asyncio.Event
) -> None:
    """One slow client, until the daemon ends its connection or `hang_up` is set."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(client.source, 0), ssl=tls
        )
    except OSError:  # refused before the TLS handshake
        client.refused, client.ended_after = True, loop.time() - began
        return
    if client.kind == "trickled headers":
        writer.write(HEADS[client.transport] + b"X-Slow: ")
    elif client.kind == "stalled body":
        authorized = f"Authorization: Bearer {token}\r\nContent-Length: 1000000000\r\n\r\n"
        writer.write(HEADS[client.transport] + authorized.encode() + b"0123456789")
    client.opened = True
    try:
        while not hang_up.is_set():
            try:
                data = await asyncio.wait_for(reader.read(65536), 1.0)
            except TimeoutError:
                if client.kind == "trickled headers":
                    writer.write(b"a")
                continue
            if not data:
                break
            client.refused = client.refused or data.startswith(b"HTTP/1.1 503")
        else:
            client.hung_up = True
            return
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()
    client.ended_after = loop.time() - began


def reading(when: str, pid: int, held: list[Client]) -> Reading:
    return Reading(
        when,
        proc_status(pid, "VmRSS") / 1024,
        proc_status(pid, "Threads"),
        sum(client.open for client in held),
    )


async def scrape(port: int, token: str, tls: ssl.SSLContext | None) -> tuple[float, str]:
    """GET /metrics from 127.0.0.1 (the slow clients are elsewhere): milliseconds, the page."""
    began = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    writer.write(
        HEADS["metrics"] + f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode()
    )
    page = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return (time.perf_counter() - began) * 1000, page.decode(errors="replace")


def refusals(page: str) -> dict[str, float]:
    """poirot_http_connections_refused_total by transport and reason (none before issue 29.3)."""
    prefix = "poirot_http_connections_refused_total{"
    out = {}
    for line in page.splitlines():
        if line.startswith(prefix):
            labels, value = line[len(prefix) :].rsplit("} ", 1)
            if float(value):
                out[labels.replace('"', "")] = float(value)
    return out


async def run(p: Plan, folder: Path, tls: Tls | None) -> Results:
    token = new_token()
    access = {"tokens": {token_hash(token): {"name": "bench", "roles": ["ingest", "metrics"]}}}
    (folder / "access.json").write_text(json.dumps(access))
    spec_path, db, ready = folder / "spec.json", folder / "bench.db", folder / "ready.json"
    spec_path.write_text(SPEC.model_dump_json())
    otlp_port = free_port()
    env = os.environ | {
        "POIROTD_OTLP_HTTP_PORT": str(otlp_port),
        "POIROTD_AUTH_FILE": str(folder / "access.json"),
        "POIROTD_HTTP_REQUEST_SECONDS": str(p.deadline),
    }
    if tls is not None:
        env |= {
            "POIROTD_TLS_CERT_FILE": str(tls.cert_file),
            "POIROTD_TLS_KEY_FILE": str(tls.key_file),
        }
    context = None if tls is None else tls.client
    argv = [sys.executable, "-m", "bench.daemon_child", str(spec_path), str(db), str(ready)]
    child = await asyncio.to_thread(spawn, argv, env)
    results = Results(tls is not None)
    try:
        await until(ready.exists, 60, 0.1)
        ports = {"metrics": json.loads(ready.read_text())["metrics_port"], "otlp_http": otlp_port}
        await asyncio.sleep(1.0)
        results.readings.append(reading("before", child.pid, results.clients))
        hang_up = asyncio.Event()
        results.clients = list(clients(p))
        began = time.monotonic()
        holders = [
            asyncio.create_task(hold(c, ports[c.transport], token, context, hang_up))
            for c in results.clients
        ]
        with contextlib.suppress(TimeoutError):  # a server that accepts slowly: read it anyway
            await until(lambda: all(c.settled for c in results.clients), 60, 0.1)
        settled = time.monotonic()
        await asyncio.sleep(p.settle)
        in_s = time.monotonic() - began
        results.readings.append(reading(f"held ({in_s:.0f} s in)", child.pid, results.clients))
        results.scrape_ms, _ = await scrape(ports["metrics"], token, context)
        # A deadline counts from a connection's opening, or its last answer: some come late.
        await asyncio.sleep(max(0.0, settled + p.deadline + p.settle - time.monotonic()))
        in_s = time.monotonic() - began
        results.readings.append(reading(f"{in_s:.0f} s in", child.pid, results.clients))
        hang_up.set()
        await asyncio.gather(*holders)
        await asyncio.sleep(2.0)
        results.readings.append(reading("clients gone", child.pid, results.clients))
        results.refusals = refusals((await scrape(ports["metrics"], token, context))[1])
    finally:
        await asyncio.to_thread(reap, child)
    return results


async def run_both(p: Plan, folder: Path) -> list[Results]:
    (folder / "plain").mkdir()
    (folder / "tls").mkdir()
    plain = await run(p, folder / "plain", None)
    return [plain, await run(p, folder / "tls", Tls.create(folder / "tls"))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 10 s request deadline")
    parser.add_argument("--connections", type=int, default=400)
    parser.add_argument("--peers", type=int, default=100, help="loopback source addresses")
    report.add_no_write(parser)
    args = parser.parse_args()
    deadline, mode = (10.0, "quick") if args.quick else (30.0, "full")
    p = Plan(mode, args.connections, args.peers, deadline, settle=2.0)
    with tempfile.TemporaryDirectory(prefix="bench-http-transports-") as tmp:
        sides = asyncio.run(run_both(p, Path(tmp)))
    report.publish(f"{NAME} {p.mode}", section(p, sides), write=not args.no_write)


if __name__ == "__main__":
    main()
