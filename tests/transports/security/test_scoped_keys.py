"""Idempotency keys belong to who sent them, over real TLS on loopback with tokens: two clients
naming the same producer never hold each other's keys, while one client's resend (from any of
its connections, a forwarder's replica holding the same token) is still stored once."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import batched
from poirotd.daemon import Daemon
from tests.support.daemon import stored_messages
from tests.support.pki import Pki, client, locked_daemon

WARD_A, WARD_B = "ward-a-token", "ward-b-token"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({WARD_A: ("ward-a", ["ingest"]), WARD_B: ("ward-b", ["ingest"])}, {})
    return pki


@pytest.fixture
async def daemon(tmp_path: Path, pki: Pki) -> AsyncIterator[Daemon]:
    async with locked_daemon(tmp_path, pki, auth_file=pki.auth_file) as d:
        yield d


def requests(content: str, seq: int) -> list[pb.IngestRequest]:
    """A session start and one message numbered by the daemon, keyed ("bridge", seq)."""
    start = pb.SessionStart(session_id="s1", system="clinic")
    message = pb.AgentMessage(
        session_id="s1",
        kind=pb.MESSAGE_KIND_AGENT,
        sender="doctor",
        content=content,
        assign_index=True,
    )
    keyed = pb.IngestRequest(agent_message=message, producer="bridge", producer_seq=seq)
    return [pb.IngestRequest(session_start=start), keyed]


async def last_ack(
    daemon: Daemon, pki: Pki, token: str, items: list[pb.IngestRequest]
) -> pb.IngestAck:
    async with client(daemon, pki.client_tls(), token=token) as ward:
        acks: list[pb.IngestAck] = [ack async for ack in ward.ingest.Stream(batched(items))]
    return acks[-1]


async def test_two_identities_naming_the_same_producer_do_not_collide(
    daemon: Daemon, pki: Pki
) -> None:
    first = await last_ack(daemon, pki, WARD_A, requests("Ward A: start the gait test.", 1))
    other = await last_ack(daemon, pki, WARD_B, requests("Ward B: hold the session.", 1))
    assert (first.duplicates, first.conflicts) == (0, 0)
    assert (other.duplicates, other.conflicts) == (0, 0), "ward B's seq 1 is its own"
    assert stored_messages(daemon) == 2
    # A resend from ward A (another stream, as a forwarder's replica with its token) is a copy.
    again = await last_ack(daemon, pki, WARD_A, requests("Ward A: start the gait test.", 1))
    assert (again.duplicates, again.conflicts) == (1, 0)
    assert stored_messages(daemon) == 2
    with sqlite3.connect(daemon.settings.db_path) as db:
        producers = {p for (p,) in db.execute("SELECT producer FROM ingest_keys")}
    assert producers == {"grpc:token:ward-a|bridge", "grpc:token:ward-b|bridge"}
