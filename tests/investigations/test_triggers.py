"""Rules over ingested telemetry open investigations by themselves, once per incident."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import clinic
from poirotd.devtools.ingest_requests import OVERHEAT, T0, message, motor_temp, session

RULES = [
    OVERHEAT,
    {
        "kind": "message_pattern",
        "name": "fall_reported",
        "severity": "warning",
        "pattern": "(?i)patient fell",
        "cooldown_seconds": 600,
    },
    {
        "kind": "reply_expected",
        "name": "plan_unanswered",
        "severity": "warning",
        "after": {"sender": "doctor", "pattern": "(?i)which plan"},
        "expect": {"sender": "chief"},
        "within_seconds": 600,
    },
]


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return clinic(rules=RULES)


async def investigations(client: PoirotClient) -> list[pb.Investigation]:
    listed = await client.investigations.List(pb.ListInvestigationsRequest(session_id="s1"))
    return list(listed.investigations)


async def test_a_firing_rule_opens_one_investigation_with_hardware_evidence(
    daemon: Daemon,
) -> None:
    async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        clean = [motor_temp(i * 0.1, 40.0 + i % 3) for i in range(50)]
        await client.send([*session(3), *clean])
        assert await investigations(client) == []

        hot = [motor_temp(5 + i * 0.1, 80.0 + i) for i in range(20)]
        await client.send(hot)
        opened = await investigations(client)
        assert len(opened) == 1, "twenty hot samples are one incident"
        assert opened[0].reason.startswith("rule exo_overheat: ")
        events = [e async for e in client.watch(opened[0].investigation_id)]
        assert events[-1].HasField("attribution_ready")

    record = await daemon._store.get_investigation(opened[0].investigation_id)  # type: ignore[union-attr]
    assert record is not None and record.trigger is not None
    assert record.trigger.rule == "exo_overheat" and record.trigger.evidence
    assert "exo.motor_temp_c" in record.incident
    fired = daemon.metrics.registry.get_sample_value(
        "poirot_hazard_events_total",
        {"system": "clinic", "rule": "exo_overheat", "severity": "critical"},
    )
    assert fired is not None and fired >= 1


async def test_a_message_rule_fires_and_a_second_rule_in_the_cooldown_does_not_reopen(
    daemon: Daemon,
) -> None:
    async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        sent_at = Timestamp()
        sent_at.FromDatetime(T0)
        fall = pb.IngestRequest(
            agent_message=pb.AgentMessage(
                session_id="s1",
                index=10,
                kind=pb.MESSAGE_KIND_AGENT,
                sender="physio",
                content="Alert: the patient fell during the session.",
                sent_at=sent_at,
            )
        )
        await client.send([*session(3), fall, motor_temp(1.0, 90.0)])
        await asyncio.sleep(0)
        opened = await investigations(client)
        assert len(opened) == 1
        assert opened[0].reason.startswith("rule fall_reported: ")
        # The second rule's reason is not lost: it joined the investigation.
        (joined,) = (await client.get(opened[0].investigation_id)).coalesced
        assert joined.rule == "exo_overheat" and joined.reason.startswith("rule exo_overheat: ")
    counted = {
        rule: daemon.metrics.registry.get_sample_value(
            "poirot_hazard_events_total", {"system": "clinic", "rule": rule, "severity": sev}
        )
        for rule, sev in (("fall_reported", "warning"), ("exo_overheat", "critical"))
    }
    assert counted == {"fall_reported": 1.0, "exo_overheat": 1.0}


async def test_a_question_the_session_ends_without_answering_opens_an_investigation(
    daemon: Daemon,
) -> None:
    async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        question = message(3, "doctor", content="Chief, which plan do you choose for Ana?")
        end = pb.IngestRequest(session_end=pb.SessionEnd(session_id="s1"))
        await client.send([*session(3), question])
        assert await investigations(client) == []
        await client.send([end])
        await asyncio.sleep(0)
        [opened] = await investigations(client)
        assert opened.reason == (
            "rule plan_unanswered: message #3 from doctor got no reply (message from chief) "
            "before the session ended"
        )
        events = [e async for e in client.watch(opened.investigation_id)]
        assert events[-1].HasField("attribution_ready")
