"""Idempotency keys over real loopback gRPC: a producer's resend (after a lost ack, on a new
stream) is stored once, the ack says how many copies were dropped, and the daemon counts them; a
key reused for other content is set aside as a conflict (kept with the stored version for the
operator, counted, logged), never dropped."""

from __future__ import annotations

import grpc
import pytest
from structlog.testing import capture_logs

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient, batched
from poirotd.daemon import Daemon
from poirotd.devtools.ingest_requests import start
from poirotd.store.audit import review_conflicts
from tests.support.daemon import stored_messages


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
        ("fz\x00-1", 3, "producer contains a NUL character"),
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


def conflicts(daemon: Daemon, kind: str, reason: str = "key") -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_conflicts_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


async def test_a_key_reused_for_other_content_is_set_aside_with_both_versions_and_a_warning(
    daemon: Daemon, client: PoirotClient
) -> None:
    """The producer restarted its count without a new name: its new message 1 and reading 2
    are neither stored in the session nor dropped as copies; the same content again is."""
    await client.send(
        [
            start(),
            keyed(numbered_message("Start the gait test."), "bridge-1", 1),
            keyed(reading(1.0), "bridge-1", 2),
        ]
    )
    reused = [
        keyed(numbered_message("Abort the session."), "bridge-1", 1),
        keyed(reading(7.5), "bridge-1", 2),
    ]
    with capture_logs() as events:
        ack = await last_ack(client, [start(), *reused])
    assert (ack.duplicates, ack.conflicts) == (0, 2)
    assert stored_messages(daemon) == 1
    assert conflicts(daemon, "agent_message") == 1 and conflicts(daemon, "telemetry") == 1
    assert duplicates(daemon, "agent_message") == 0 and duplicates(daemon, "telemetry") == 0
    (warning,) = [e for e in events if e["event"] == "ingest conflicts set aside"]
    assert warning["log_level"] == "warning" and warning["count"] == 2
    assert (warning["first_reason"], warning["producer"], warning["seq"]) == ("key", "bridge-1", 1)
    reading_conflict, message_conflict = review_conflicts(daemon.settings.db_path)
    assert message_conflict["set_aside"]["content"] == "Abort the session."
    assert message_conflict["stored"]["content"] == "Start the gait test."
    assert (reading_conflict["set_aside"]["value"], reading_conflict["stored"]["value"]) == (
        7.5,
        1.0,
    )
    # The stored content under the same key is a plain copy.
    same = [
        keyed(numbered_message("Start the gait test."), "bridge-1", 1),
        keyed(reading(1.0), "bridge-1", 2),
    ]
    again = await last_ack(client, [start(), *same])
    assert (again.duplicates, again.conflicts) == (2, 0)
    assert len(review_conflicts(daemon.settings.db_path)) == 2
