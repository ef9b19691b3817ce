"""Idempotency keys over real loopback gRPC: a producer's resend (after a lost ack, on a new
stream) is stored once, the ack says how many copies were dropped, and the daemon counts them."""

from __future__ import annotations

import grpc
import pytest

from poirotd.api.client import PoirotClient, batched
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.daemon import Daemon
from tests.support.daemon import stored_messages
from tests.support.ingest import start


def keyed(request: pb.IngestRequest, producer: str, producer_seq: int) -> pb.IngestRequest:
    copy = pb.IngestRequest()
    copy.CopyFrom(request)
    copy.producer, copy.producer_seq = producer, producer_seq
    return copy


def numbered_message(content: str) -> pb.IngestRequest:
    """A message the daemon numbers: only its key can tell a resend."""
    return pb.IngestRequest(
        agent_message=pb.AgentMessage(
            session_id="s1",
            kind=pb.MESSAGE_KIND_AGENT,
            sender="doctor",
            content=content,
            assign_index=True,
        )
    )


def reading(value: float) -> pb.IngestRequest:
    return pb.IngestRequest(
        telemetry=pb.TelemetrySample(session_id="s1", component="exo", signal="x", value=value)
    )


def duplicates(daemon: Daemon, kind: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_duplicates_total", {"kind": kind}
    )
    return value or 0.0


async def last_ack(client: PoirotClient, requests: list[pb.IngestRequest]) -> pb.IngestAck:
    acks: list[pb.IngestAck] = [ack async for ack in client.ingest.Stream(batched(requests))]
    return acks[-1]


async def test_a_resend_on_a_new_stream_is_stored_once_and_counted(
    daemon: Daemon, client: PoirotClient
) -> None:
    items = [keyed(numbered_message(f"turn {i}"), "bridge-1", i + 1) for i in range(5)] + [
        keyed(reading(float(i)), "bridge-1", i + 6) for i in range(5)
    ]
    first = await last_ack(client, [start(), *items])
    assert (first.durable_seq, first.duplicates) == (11, 0)
    # The producer never saw that ack: it resends everything from its fourth item on, and more.
    resend = [*items[3:], keyed(reading(9.0), "bridge-1", 11)]
    second = await last_ack(client, [start(), *resend])
    assert second.duplicates == 7, "the seven copies are dropped, the new reading kept"
    assert stored_messages(daemon) == 5
    assert duplicates(daemon, "agent_message") == 2
    assert duplicates(daemon, "telemetry") == 5
    total = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_items_total", {"kind": "telemetry"}
    )
    assert total == 6, "only what was stored is counted as ingested"


async def test_another_producer_with_the_same_seqs_is_not_a_copy(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send([start(), keyed(numbered_message("a"), "bridge-1", 1)])
    ack = await last_ack(client, [start(), keyed(numbered_message("b"), "bridge-2", 1)])
    assert ack.duplicates == 0
    assert stored_messages(daemon) == 2


@pytest.mark.parametrize(
    ("producer", "producer_seq", "detail"),
    [
        ("", 3, "seq 2: producer_seq needs a producer"),
        ("p" * 257, 3, "producer is 257 characters, the limit is 256"),
        ("otlp:abc", 3, "producer names starting 'otlp:' are the OTLP receiver's"),
        ("bridge", 2**63, "is beyond 9223372036854775807"),
    ],
)
async def test_a_bad_key_is_refused_naming_its_seq(
    client: PoirotClient, producer: str, producer_seq: int, detail: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.send([start(), keyed(reading(1.0), producer, producer_seq)])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (refused.value.details() or "")
