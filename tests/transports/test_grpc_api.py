"""The gRPC API over real loopback gRPC, against an in-process daemon.

The LLM here is scripted (it answers whatever schema the protocol asks for): these tests are
about ingest, refusals, the investigation lifecycle and the events, not about model answers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient, batched
from poirotd.daemon import Daemon
from poirotd.devtools.ingest_requests import message, session, start
from poirotd.ingest.pipeline import Admission
from poirotd.investigations.service import MAX_TEXT_CHARS, InvestigationService
from poirotd.model import IngestItem
from poirotd.store.idempotency import LeftOut
from poirotd.transports.grpc.ingest import _Pending, _Unacked
from tests.support.daemon import rejected, stored_messages

MAX_ITEM_BYTES = 4096


@pytest.fixture
def daemon_settings() -> dict[str, Any]:
    return {"max_message_bytes": MAX_ITEM_BYTES}


async def send_collecting_acks(
    client: PoirotClient, requests: list[pb.IngestRequest]
) -> tuple[list[int], grpc.aio.AioRpcError | None]:
    numbered = []
    for seq, request in enumerate(requests, start=1):
        copy = pb.IngestRequest()
        copy.CopyFrom(request)
        copy.seq = seq
        numbered.append(copy)
    return await send_collecting_acks_raw(client, numbered)


async def test_ingest_acks_only_durable_items_and_resends_are_stored_once(
    daemon: Daemon, client: PoirotClient
) -> None:
    requests = session(5)
    assert await client.send(requests) == len(requests)
    assert stored_messages(daemon) == 5
    assert await client.send(requests) == len(requests)
    assert stored_messages(daemon) == 5


@pytest.mark.parametrize(
    ("bad", "code", "reason", "detail"),
    [
        (
            message(1, sender="mallory"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown_agent",
            "sender 'mallory' is not an agent of system 'clinic'",
        ),
        (
            message(1, session_id="nope"),
            grpc.StatusCode.NOT_FOUND,
            "unknown_session",
            "session 'nope' is not known",
        ),
        (
            message(1, content="x" * (MAX_ITEM_BYTES + 1)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "oversized",
            "the limit is 4096",
        ),
        (
            message(1, kind=pb.MESSAGE_KIND_UNSPECIFIED),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid",
            "message kind is unspecified",
        ),
        (
            start("s2", system="trading"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown_system",
            "this daemon monitors 'clinic'",
        ),
        (pb.IngestRequest(), grpc.StatusCode.INVALID_ARGUMENT, "invalid", "carries no item"),
        (
            pb.IngestRequest(
                agent_message=pb.AgentMessage(
                    session_id="s1",
                    index=1,
                    kind=pb.MESSAGE_KIND_AGENT,
                    sender="doctor",
                    sent_at=Timestamp(seconds=10**12),  # after year 9999
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid",
            "sent_at: Timestamp is not valid",
        ),
        (
            pb.IngestRequest(
                telemetry=pb.TelemetrySample(
                    session_id="s1", component="exo", signal="temp", value=float("nan")
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid",
            "is not a finite number",
        ),
        (
            pb.IngestRequest(
                telemetry=pb.TelemetrySample(
                    session_id="s1", component="exo", signal="temp", value=-1.797e308
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "value_out_of_range",
            "is outside [-9.0072e+15, 9.0072e+15], the default range (POIROTD_TELEMETRY_MAX",
        ),
    ],
    ids=[
        "unknown-agent",
        "unknown-session",
        "oversized",
        "no-kind",
        "wrong-system",
        "empty",
        "time-out-of-range",
        "nan-telemetry",
        "out-of-range-telemetry",
    ],
)
async def test_bad_item_ends_stream_with_precise_status_keeps_acked_data_and_daemon_serving(
    daemon: Daemon,
    client: PoirotClient,
    bad: pb.IngestRequest,
    code: grpc.StatusCode,
    reason: str,
    detail: str,
) -> None:
    acks, error = await send_collecting_acks(client, [start(), message(0), bad, message(2)])
    assert error is not None
    assert error.code() == code
    assert error.details().startswith("seq 3: ")
    assert detail in error.details()
    assert acks and acks[-1] == 2, "items before the bad one are acknowledged"
    assert stored_messages(daemon) == 1
    assert rejected(daemon, "Ingest.Stream", reason) == 1
    # The daemon keeps serving: a good stream afterwards is accepted.
    assert await client.send(session(3, "s3")) == 4
    assert stored_messages(daemon) == 4


async def test_a_fault_of_the_daemon_on_a_request_ends_the_stream_with_internal(
    daemon: Daemon, client: PoirotClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = convert.ingest_item

    def failing(
        request: pb.IngestRequest | pb.IngestItem, seq: int, at: datetime
    ) -> IngestItem | convert.UnnumberedMessage:
        if seq == 3:
            raise RuntimeError("simulated bug")
        return real(request, seq, at)

    monkeypatch.setattr(convert, "ingest_item", failing)
    acks, error = await asyncio.wait_for(
        send_collecting_acks(client, [start(), message(0), message(1)]), 10
    )
    assert error is not None and error.code() == grpc.StatusCode.INTERNAL
    assert (error.details() or "").startswith("seq 3: request failed: simulated bug")
    assert acks and acks[-1] == 2 and stored_messages(daemon) == 1
    assert rejected(daemon, "Ingest.Stream", "internal") == 1


def _with_session_id(raw_id: bytes) -> bytes:
    """A session start of seq 2 whose session_id is these bytes, UTF-8 or not."""
    request = start("@@")
    request.seq = 2
    return request.SerializeToString().replace(b"@@", raw_id)


@pytest.mark.parametrize(
    "garbage",
    [_with_session_id(b"\xff\xfe"), b"\x08\xff\xff"],
    ids=["invalid-utf8-in-a-string", "truncated-varint"],
)
async def test_an_undecodable_request_ends_the_stream_at_once(
    daemon: Daemon, garbage: bytes
) -> None:
    """Found by fuzzing: such a request left the stream open until the client gave up."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stream = channel.stream_stream("/poirot.v1.Ingest/Stream")
        first = start()
        first.seq = 1
        call = stream(iter([first.SerializeToString(), garbage]), timeout=10)
        acks = []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for raw in call:
                acks.append(pb.IngestAck.FromString(raw).durable_seq)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "after seq 1" in (refused.value.details() or "")
    assert acks == [1]
    assert rejected(daemon, "Ingest.Stream", "undecodable") == 1


async def test_transport_refuses_grossly_oversized_message(client: PoirotClient) -> None:
    _, error = await send_collecting_acks(
        client, [start(), message(0, content="x" * (MAX_ITEM_BYTES * 5))]
    )
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def batch(first_seq: int, requests: list[pb.IngestRequest]) -> pb.IngestRequest:
    """One request carrying the items of these single-item requests, numbered from first_seq."""
    (packed,) = batched(requests, first_seq, limit=1 << 20)
    return packed


async def test_batched_and_single_item_requests_mix_in_one_stream_and_ack_per_item_seq(
    daemon: Daemon, client: PoirotClient
) -> None:
    single = pb.IngestRequest(seq=5, agent_message=message(3).agent_message)
    requests = [batch(1, [start(), message(0), message(1), message(2)]), single]
    acks = [ack.durable_seq async for ack in client.ingest.Stream(iter(requests))]
    assert acks[-1] == 5 and stored_messages(daemon) == 4


async def test_a_bad_item_inside_a_batch_is_named_by_its_own_seq(
    daemon: Daemon, client: PoirotClient
) -> None:
    requests = [batch(1, [start(), message(0), message(1, sender="mallory"), message(2)])]
    acks, error = await send_collecting_acks_raw(client, requests)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("seq 3: sender 'mallory'")
    assert acks == [2] and stored_messages(daemon) == 1


async def test_items_are_held_to_the_size_limit_one_by_one_in_a_batch_over_it(
    daemon: Daemon, client: PoirotClient
) -> None:
    small = [message(i, content="x" * (MAX_ITEM_BYTES // 4)) for i in range(8)]
    large = message(8, content="y" * MAX_ITEM_BYTES)
    first = batch(1, [start(), *small])
    assert first.ByteSize() > MAX_ITEM_BYTES, "the batch is over the limit, no item is"
    acks, error = await send_collecting_acks_raw(client, [first, batch(10, [large])])
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = error.details() or ""
    assert details.startswith("seq 10: item is ") and "the limit is 4096" in details
    assert int(details.split()[4]) == pb.IngestItem(agent_message=large.agent_message).ByteSize()
    assert acks == [9] and stored_messages(daemon) == 8


async def test_a_request_with_an_item_and_a_batch_is_refused(client: PoirotClient) -> None:
    both = batch(2, [message(0)])
    both.agent_message.CopyFrom(message(1).agent_message)
    acks, error = await send_collecting_acks_raw(client, [batch(1, [start()]), both])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("seq 2: a request carries one item or a batch")
    assert acks == [1]


def test_batched_packs_items_up_to_the_limit_and_a_larger_one_alone() -> None:
    requests = [start(), *(message(i, content="x" * 100) for i in range(5)), message(5, "y" * 900)]
    packed = list(batched(requests, first_seq=7, limit=400))
    assert [(r.seq, len(r.items)) for r in packed] == [(7, 4), (11, 2), (13, 1)]
    assert all(r.ByteSize() <= 400 for r in packed[:2]) and packed[2].ByteSize() > 900
    assert packed[1].items[0].agent_message.index == 3


async def send_collecting_acks_raw(
    client: PoirotClient, requests: list[pb.IngestRequest]
) -> tuple[list[int], grpc.aio.AioRpcError | None]:
    """Sends the requests as they are (already numbered), collecting acks until an error."""
    acks: list[int] = []
    try:
        async for ack in client.ingest.Stream(iter(requests)):
            acks.append(ack.durable_seq)
    except grpc.aio.AioRpcError as error:
        return acks, error
    return acks, None


async def test_investigation_lifecycle_events_record_and_metrics(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send(session(6))
    queued = await client.trigger("s1", "operator saw a fall")
    assert queued.state == pb.INVESTIGATION_STATE_QUEUED
    events = [e async for e in client.watch(queued.investigation_id)]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-1] == "attribution_ready"
    phases = [e.phase_begun.phase for e in events if e.HasField("phase_begun")]
    assert phases == ["hazard_space", "self_assessment", "interrogation", "voting", "aggregation"]
    assert sorted(e.vote_cast.vote.agent_id for e in events if e.HasField("vote_cast")) == [
        "chief",
        "doctor",
        "physio",
    ]
    ids = [e.event_id for e in events]
    assert ids == sorted(set(ids))

    record = await client.get(queued.investigation_id)
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert [r.id for r in record.hazard_space.regions][:3] == ["doctor", "chief", "physio"]
    assert len(record.attribution.scores) == len(record.hazard_space.regions)
    assert record.attribution.rule == "argmax"
    assert record.llm_calls > 0 and record.prompt_tokens > 0
    assert {p.phase for p in record.phases} >= {"self_assessment", "aggregation"}

    listed = await client.investigations.List(pb.ListInvestigationsRequest(session_id="s1"))
    assert [i.investigation_id for i in listed.investigations] == [queued.investigation_id]
    space = await client.investigations.GetHazardSpace(pb.GetHazardSpaceRequest())
    assert [r.id for r in space.regions] == [r.id for r in record.hazard_space.regions]

    registry = daemon.metrics.registry
    doctor_score = registry.get_sample_value(
        "poirot_attribution_score", {"system": "clinic", "component": "doctor"}
    )
    assert doctor_score == pytest.approx(record.attribution.scores[0])
    assert (
        registry.get_sample_value(
            "poirot_investigations_total",
            {"system": "clinic", "outcome": "succeeded", "method": "poirot"},
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "poirot_votes_total", {"system": "clinic", "agent": "doctor", "outcome": "voted"}
        )
        == 1
    )


async def test_watch_resumes_after_last_seen_event_without_gap_or_duplicate(
    client: PoirotClient,
) -> None:
    await client.send(session(3))
    first = await client.trigger("s1", "first")
    all_events = [e async for e in client.watch(first.investigation_id)]
    cut = len(all_events) // 2
    resumed = [
        e
        async for e in client.watch(
            first.investigation_id, after_event_id=all_events[cut - 1].event_id
        )
    ]
    assert [e.event_id for e in resumed] == [e.event_id for e in all_events[cut:]]
    past_the_end = client.watch(first.investigation_id, after_event_id=all_events[-1].event_id)
    assert [e async for e in past_the_end] == []


async def test_get_right_after_the_terminal_event_sees_the_final_record(
    client: PoirotClient,
) -> None:
    await client.send(session(3))
    queued = await client.trigger("s1", "race")
    async for event in client.watch(queued.investigation_id):
        if event.HasField("attribution_ready"):
            record = await client.get(queued.investigation_id)
            assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
            assert list(record.attribution.scores) == list(
                event.attribution_ready.attribution.scores
            )


async def test_trigger_refusals(daemon: Daemon, client: PoirotClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await client.trigger("ghost", "why")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert rejected(daemon, "Investigations.Trigger", "unknown_session") == 1
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await client.get("0" * 32)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as token:
        await client.investigations.List(pb.ListInvestigationsRequest(page_token="garbage"))
    assert token.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_and_reflection_are_served(daemon: Daemon) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "poirot.v1.Ingest", "poirot.v1.Investigations"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"poirot.v1.Ingest", "poirot.v1.Investigations", "grpc.health.v1.Health"} <= names


async def test_health_watch_streams_serving_then_each_change(daemon: Daemon) -> None:
    """grpc's Watch answers with context.write, not by yielding: the guard must await it (it
    answered INTERNAL, with a logged traceback, for everyone). A watcher sees the state at
    once, then each change: here the store's outage as the store's own fault tracking reports
    it, and its end."""
    assert daemon._store is not None
    store = daemon._store.faults.availability
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        ready = health.Watch(health_pb2.HealthCheckRequest(service=""))
        part = health.Watch(health_pb2.HealthCheckRequest(service="poirotd.store"))
        async with asyncio.timeout(10):
            assert (await ready.read()).status == serving
            assert (await part.read()).status == serving
            store.failed("connection_lost", "the test cut it")
            assert (await ready.read()).status == not_serving
            assert (await part.read()).status == not_serving
            store.answered()
            assert (await ready.read()).status == serving
            assert (await part.read()).status == serving
        ready.cancel()
        part.cancel()
    assert rejected(daemon, "Health.Watch", "internal") == 0


async def test_get_returns_the_full_record_with_transcripts_on_request(
    client: PoirotClient,
) -> None:
    await client.send(session(3))
    queued = await client.trigger("s1", "full record")
    _ = [e async for e in client.watch(queued.investigation_id)]

    brief = await client.get(queued.investigation_id)
    assert brief.exchanges == [] and brief.incident.startswith("Reported: full record")
    assert sorted(r.agent_id for r in brief.reports) == ["chief", "doctor", "physio"]
    assert all(json.loads(r.report_json)["self_evaluation"] for r in brief.reports)
    assert sum(v.weight for v in brief.votes) > 0

    full = await client.investigations.Get(
        pb.GetInvestigationRequest(investigation_id=queued.investigation_id, include_exchanges=True)
    )
    assert len(full.exchanges) == full.llm_calls
    purposes = {x.purpose for x in full.exchanges}
    assert {"report", "turn"} <= purposes
    first = full.exchanges[0]
    assert first.messages and first.response and first.phase == "hazard_space"


async def test_filtered_watch_sends_only_attributions_meeting_the_filter(
    client: PoirotClient,
) -> None:
    await client.send(session(3))
    done = await client.trigger("s1", "filtered")
    events = [e async for e in client.watch(done.investigation_id)]
    ready = events[-1].attribution_ready
    top = ready.region_ids[ready.attribution.top[0]]
    top_score = ready.attribution.scores[ready.attribution.top[0]]

    async def watched(**filters: Any) -> list[pb.InvestigationEvent]:
        request = pb.WatchRequest(investigation_id=done.investigation_id, **filters)
        return [e async for e in client.investigations.Watch(request)]

    matched = await watched(component=top, min_score=top_score)
    assert [e.event_id for e in matched] == [events[-1].event_id]
    assert await watched(component=top, min_score=top_score + 0.01) == []
    assert await watched(component="no_such_region") == []
    assert [e.event_id for e in await watched(min_score=0.1)] == [events[-1].event_id]


async def test_watch_survives_a_forced_disconnect_without_gap_or_duplicate(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send(session(3))
    first = await client.trigger("s1", "before the disconnect")
    reference = [e async for e in client.watch(first.investigation_id)]

    seen: list[pb.InvestigationEvent] = []
    call = client.investigations.Watch(pb.WatchRequest())
    async for event in call:
        seen.append(event)
        if len(seen) == len(reference) // 2:
            break
    call.cancel()  # the client drops the stream mid-way
    second = await client.trigger("s1", "while disconnected")
    async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as again:
        resumed = again.investigations.Watch(pb.WatchRequest(after_event_id=seen[-1].event_id))
        async for event in resumed:
            seen.append(event)
            if event.investigation_id == second.investigation_id and event.HasField(
                "attribution_ready"
            ):
                break
        resumed.cancel()
    ids = [e.event_id for e in seen]
    assert ids == sorted(set(ids)), "no duplicate, in order"
    assert ids[: len(reference)] == [e.event_id for e in reference], "no gap"
    assert {e.investigation_id for e in seen} == {first.investigation_id, second.investigation_id}


async def test_watch_for_another_system_is_empty(client: PoirotClient) -> None:
    await client.send(session(3))
    done = await client.trigger("s1", "x")
    _ = [e async for e in client.watch(done.investigation_id)]
    other = client.investigations.Watch(pb.WatchRequest(system="trading"))
    assert [e async for e in other] == []


async def test_trigger_chooses_the_method(daemon: Daemon, client: PoirotClient) -> None:
    await client.send(session(4))
    queued = await client.investigations.Trigger(
        pb.TriggerRequest(session_id="s1", reason="compare", method="baseline")
    )
    assert queued.method == "baseline"
    _ = [e async for e in client.watch(queued.investigation_id)]
    record = await client.get(queued.investigation_id)
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert record.attribution.rule == "baseline"
    assert record.llm_calls == 2  # Phase I builds the hazard space, then the one baseline call
    # The baseline call waits for the hazard space: a chain of both, all the model's time.
    assert record.model_time.critical_path_calls == 2
    assert record.model_time.wall_seconds >= record.model_time.busy_seconds > 0
    (vote,) = record.votes
    assert vote.agent_id == "" and vote.HasField("step") and record.attribution.step == vote.step
    assert not record.context_cuts
    assert (
        daemon.metrics.registry.get_sample_value(
            "poirot_investigations_total",
            {"system": "clinic", "outcome": "succeeded", "method": "baseline"},
        )
        == 1
    )

    default = await client.investigations.Trigger(pb.TriggerRequest(session_id="s1", reason="x"))
    assert default.method == "poirot"
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await client.investigations.Trigger(
            pb.TriggerRequest(session_id="s1", reason="x", method="oracle")
        )
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "oracle" in (invalid.value.details() or "")
    assert rejected(daemon, "Investigations.Trigger", "invalid") == 1


async def test_unacked_requests_pause_reading_at_a_batch_and_are_acked_in_order() -> None:
    loop = asyncio.get_running_loop()
    durable = [loop.create_future() for _ in range(3)]
    unacked = _Unacked(limit=3, idle_seconds=60)
    await unacked.add(_Pending(2, Admission(2, (), durable[0])))
    await unacked.add(_Pending(4, Admission(2, (), durable[1])))  # a request goes in whole
    blocked = asyncio.create_task(unacked.add(_Pending(5, Admission(1, (), durable[2]))))
    acked = asyncio.create_task(unacked.next_durable())
    durable[1].set_result(LeftOut())
    await asyncio.sleep(0.01)
    assert not blocked.done(), "reading waits while a batch's worth is unacked"
    assert not acked.done(), "a later request's durability does not ack an earlier one"
    durable[0].set_result(LeftOut())
    assert await acked == 4, "the requests durable together are acked once, by the last seq"
    await asyncio.wait_for(blocked, 1)
    await unacked.end(None)
    durable[2].set_result(LeftOut())
    assert await unacked.next_durable() == 5
    assert await unacked.next_durable() is None


async def _silent() -> AsyncIterator[pb.IngestRequest]:
    """A client's requests when it sends none."""
    await asyncio.Event().wait()
    yield pb.IngestRequest()


async def test_the_idle_deadline_runs_only_while_everything_sent_is_acked() -> None:
    """A client that waits for its acks before it sends more waits for the daemon, not idle."""
    loop = asyncio.get_running_loop()
    idle = 0.2
    unacked = _Unacked(limit=8, idle_seconds=idle)
    began = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2):  # a deadline that does not fire fails below
            await unacked.next_request(_silent())
    assert idle <= loop.time() - began < idle + 0.5, "nothing unacked: from the wait's start"

    durable = loop.create_future()
    await unacked.add(_Pending(1, Admission(1, (), durable)))
    waiting = asyncio.create_task(unacked.next_request(_silent()))
    await asyncio.sleep(3 * idle)
    assert not waiting.done(), "no deadline while a request waits for its commit"
    durable.set_result(LeftOut())
    assert await unacked.next_durable() == 1
    acked = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2):
            await waiting
    assert idle <= loop.time() - acked + 0.01 < idle + 0.5, "from the last ack"


def _token(key: object) -> str:
    raw = key.encode() if isinstance(key, str) else json.dumps(key).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "page_token",
    [_token("[" * 2000), _token([2**70, "x"]), _token([1, "x"]) + "A" * 300],
    ids=["deeply-nested", "beyond-int64", "too-long"],
)
async def test_a_bad_page_token_is_invalid_argument_not_unknown(
    client: PoirotClient, page_token: str
) -> None:
    """Found by fuzzing: RecursionError and OverflowError escaped as UNKNOWN."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.investigations.List(pb.ListInvestigationsRequest(page_token=page_token))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_watch_after_an_event_id_beyond_the_store_is_invalid_argument(
    client: PoirotClient,
) -> None:
    call = client.investigations.Watch(pb.WatchRequest(after_event_id=2**64 - 1))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(call.read(), 5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_message_index_beyond_the_store_is_not_retryable(
    daemon: Daemon, client: PoirotClient
) -> None:
    """Found by fuzzing: UNAVAILABLE (store write failed) made a retrying client loop forever."""
    acks, error = await send_collecting_acks(client, [start(), message(2**63)])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("seq 2: message index")
    assert acks == [1]


async def test_a_batch_numbered_past_uint64_is_refused_at_the_seq_that_overflows(
    daemon: Daemon,
) -> None:
    """Found by fuzzing: the batch's items were committed but the ack could not be built."""
    request = batch(2**64 - 1, [start(), message(0)])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stream = channel.stream_stream(
            "/poirot.v1.Ingest/Stream",
            request_serializer=pb.IngestRequest.SerializeToString,
            response_deserializer=pb.IngestAck.FromString,
        )
        acks = []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for ack in stream(iter([request]), timeout=10):
                acks.append(ack.durable_seq)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"seq {2**64} is beyond" in (refused.value.details() or "")
    assert acks == [2**64 - 1]


@pytest.mark.parametrize(
    "method", ["/poirot.v1.Investigations/Get", "/poirot.v1.Investigations/Watch"]
)
async def test_undecodable_bytes_to_a_unary_request_are_invalid_argument(
    daemon: Daemon, method: str
) -> None:
    """Found by fuzzing: grpc answered UNKNOWN, and nothing was logged."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        if method.endswith("Get"):
            call: Any = channel.unary_unary(method)(b"\x0a\x05\xff", timeout=5)
        else:
            call = channel.unary_stream(method)(b"\x0a\x05\xff", timeout=5).read()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    rpc = method.rpartition(".")[2].replace("/", ".")
    assert rejected(daemon, rpc, "undecodable") == 1


async def test_a_fault_in_a_handler_is_internal_with_an_id_never_unknown(
    daemon: Daemon, client: PoirotClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: InvestigationService, investigation_id: str) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(InvestigationService, "get", broken)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await client.get("0" * 32)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert re.fullmatch(r"internal error [0-9a-f]{12} \(logged\)", failed.value.details() or "")
    assert rejected(daemon, "Investigations.Get", "internal") == 1


async def test_error_details_quote_a_clients_text_capped(
    daemon: Daemon, client: PoirotClient
) -> None:
    """Found by fuzzing: a 100 KB id turned NOT_FOUND into RESOURCE_EXHAUSTED (metadata)."""
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await client.get("x" * 3_000)  # within what Get takes (QUERY_REQUEST_BYTES)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    detail = missing.value.details() or ""
    assert len(detail) < 200 and "(3000 characters)" in detail
    _, error = await send_collecting_acks(client, [start(), message(0, sender="y" * 3_000)])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(error.details() or "") < 300


async def test_free_text_from_a_caller_is_bounded(daemon: Daemon, client: PoirotClient) -> None:
    """Found by fuzzing: a 3 MB reason was saved 15 times and put whole into every prompt."""
    await client.send(session(1))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.trigger("s1", "r" * (MAX_TEXT_CHARS + 1))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reason is 4001 characters" in (refused.value.details() or "")
    assert rejected(daemon, "Investigations.Trigger", "too_long") == 1
    assert (await client.trigger("s1", "r" * MAX_TEXT_CHARS)).reason == "r" * MAX_TEXT_CHARS
