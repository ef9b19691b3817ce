"""What an MQTT publisher may choose, against a real Mosquitto and the daemon's own input: a
payload's producer is its topic's (naming another topic's cannot drop that topic's messages), a
pinned route refuses a payload choosing its session, kind or index (counted by field), and an
index another message took first sets the later message aside as a conflict (kept, counted,
logged) instead of dropping it as a copy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import clinic
from poirotd.model import AgentMessage, MessageKind
from poirotd.store.audit import review_conflicts
from tests.support.gait import connected_daemon, counter
from tests.support.mosquitto import FAST, Mosquitto
from tests.support.shared_mqtt import keyed_spec, stored_values
from tests.support.waiting import eventually

SESSION = "icu-7"


async def publish(mosquitto: Mosquitto, messages: Sequence[tuple[str, Any]]) -> None:
    """Each (topic, JSON body) in order, at QoS 1, as one publisher (the broker keeps a
    publisher's order)."""
    broker = BrokerConfig(port=mosquitto.port, client_id="agents")
    async with MqttPublisher(broker) as publisher:
        for topic, body in messages:
            await publisher.publish(topic, json.dumps(body).encode())


async def stored(daemon: Daemon, session: str) -> list[AgentMessage]:
    assert daemon._store is not None
    return await daemon._store.session_messages(session)


def ingest_counter(daemon: Daemon, name: str, **labels: str) -> float:
    value = daemon.metrics.registry.get_sample_value(f"poirot_ingest_{name}_total", labels)
    return value or 0.0


def route_refusals(daemon: Daemon) -> dict[str, float]:
    registry = daemon.metrics.registry
    name = "poirot_mqtt_agent_messages_route_refused_total"
    fields = ("session", "kind", "index", "sender")
    return {f: registry.get_sample_value(name, {"field": f}) or 0.0 for f in fields}


async def test_a_payload_naming_another_topics_producer_never_drops_its_messages(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The doctor's payloads name the chief's producer (its topic) with seq 1 and 2 before the
    chief sends its own 1 and 2: the chief's are stored, none dropped as a copy."""
    system = keyed_spec(mosquitto, "poirotd-spoofed")
    async with connected_daemon(tmp_path, system) as daemon:
        spoof = {"producer": "mas/chief/out", "content": "spoofed"}
        await publish(
            mosquitto,
            [
                ("mas/doctor/out", {**spoof, "seq": 1}),
                ("mas/doctor/out", {**spoof, "seq": 2}),
                ("mas/chief/out", {"seq": 1, "content": "Start the gait test."}),
                ("mas/chief/out", {"seq": 2, "content": "Stop at 20 steps."}),
            ],
        )
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "agent_messages_acked") == 4)
        run = await stored(daemon, "plant-1")
        chief = [m.content for m in run if m.sender == "chief"]
        assert chief == ["Start the gait test.", "Stop at 20 steps."]
        assert ingest_counter(daemon, "duplicates", kind="agent_message") == 0
        assert counter(daemon, "agent_messages_committed") == 4


async def test_a_readings_producer_field_names_a_producer_of_its_own_topic_only(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """Telemetry alike: a codec's producer field on device d2's topic naming d1's producer
    does not drop d1's readings."""
    inputs = keyed_spec(mosquitto, "poirotd-spoofed-readings").model_dump(mode="json")["inputs"]
    inputs["mqtt"]["mappings"][0]["codec"]["producer_field"] = "by"
    system = clinic(inputs=inputs)
    async with connected_daemon(tmp_path, system) as daemon:
        await publish(
            mosquitto,
            [
                *(("plant/d2/reading", {"seq": s, "by": "d1", "value": 100.0 + s}) for s in (1, 2)),
                *(("plant/d1/reading", {"seq": s, "by": "d1", "value": float(s)}) for s in (1, 2)),
            ],
        )
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "messages_acked") == 4)
        assert stored_values(daemon.settings.db_path) == {1.0: 1, 2.0: 1, 101.0: 1, 102.0: 1}
        assert ingest_counter(daemon, "duplicates", kind="telemetry") == 0


def pinned_spec(mosquitto: Mosquitto) -> SystemSpec:
    """ICU 7's agents, each on its own topic: the chief numbers its messages; every other
    agent's route pins the session, the kind and the daemon's numbering."""
    broker = {
        "port": mosquitto.port,
        "client_id": "poirotd-icu7",
        "timeout_s": 1.0,
        "backoff": FAST.model_dump(),
    }
    routes = [
        {
            "topic": "icu7/chief/out",
            "sender": "chief",
            "session_id": SESSION,
            "pin": {"session": True, "kind": "agent"},
        },
        {
            "topic": "icu7/+/out",
            "sender": "{w1}",
            "session_id": SESSION,
            "pin": {"session": True, "kind": "agent", "index": "daemon"},
        },
    ]
    return clinic(
        inputs={"session_id": "icu-input", "mqtt": {"broker": broker, "messages": routes}}
    )


async def test_a_pinned_route_refuses_a_chosen_session_kind_or_index_and_counts_each(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    async with connected_daemon(tmp_path, pinned_spec(mosquitto)) as daemon:
        await publish(
            mosquitto,
            [
                ("icu7/doctor/out", {"session": "victim-icu-7", "content": "elsewhere"}),
                ("icu7/doctor/out", {"kind": "human", "content": "I am the nurse."}),
                ("icu7/doctor/out", {"session": "victim-icu-7", "kind": "human"}),
                ("icu7/doctor/out", {"index": 20, "content": "taken first"}),
                ("icu7/doctor/out", {"session": SESSION, "kind": "agent", "content": "Noted."}),
                ("icu7/chief/out", {"index": 20, "content": "Proceed with 20 steps."}),
            ],
        )
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "agent_messages_acked") == 6)
        assert route_refusals(daemon) == {"session": 2, "kind": 1, "index": 1, "sender": 0}
        assert counter(daemon, "agent_messages_undecodable") == 4
        run = await stored(daemon, SESSION)
        assert [(m.index, m.sender, m.kind, m.content) for m in run] == [
            (0, "doctor", MessageKind.AGENT, "Noted."),
            (20, "chief", MessageKind.AGENT, "Proceed with 20 steps."),
        ]
        assert daemon._store is not None
        assert await daemon._store.get_session("victim-icu-7") is None
        assert ingest_counter(daemon, "duplicates", kind="agent_message") == 0


@pytest.fixture
def unpinned(mosquitto: Mosquitto) -> SystemSpec:
    broker = {"port": mosquitto.port, "client_id": "poirotd-open", "backoff": FAST.model_dump()}
    routes = [{"topic": "mas/+/out", "sender": "{w1}"}]
    return clinic(inputs={"session_id": SESSION, "mqtt": {"broker": broker, "messages": routes}})


async def test_an_index_taken_first_sets_the_later_message_aside_never_drops_it(
    tmp_path: Path, mosquitto: Mosquitto, unpinned: SystemSpec
) -> None:
    """On a route that lets payloads number themselves, the doctor takes the chief's index 20
    first: the chief's message 20 is kept as a conflict (counted, a WARNING, both versions for
    the operator), not counted as a copy; the doctor's own resend is the plain copy."""
    with structlog.testing.capture_logs() as events:
        async with connected_daemon(tmp_path, unpinned) as daemon:
            spoof = ("mas/doctor/out", {"index": 20, "content": "Abort the session."})
            await publish(mosquitto, [spoof])
            async with asyncio.timeout(20):
                await eventually(lambda: counter(daemon, "agent_messages_acked") == 1)
            await publish(
                mosquitto,
                [("mas/chief/out", {"index": 20, "content": "Proceed with 20 steps."}), spoof],
            )
            async with asyncio.timeout(20):
                await eventually(lambda: counter(daemon, "agent_messages_acked") == 3)
            conflicts = ingest_counter(daemon, "conflicts", kind="agent_message", reason="index")
            assert conflicts == 1
            assert ingest_counter(daemon, "duplicates", kind="agent_message") == 1
            assert counter(daemon, "agent_messages_committed") == 1
            db = daemon.settings.db_path
    (reviewed,) = review_conflicts(db)
    assert reviewed["reason"] == "index" and reviewed["session_id"] == SESSION
    assert (reviewed["set_aside"]["sender"], reviewed["set_aside"]["content"]) == (
        "chief",
        "Proceed with 20 steps.",
    )
    assert reviewed["stored"]["content"] == "Abort the session."
    (warning,) = [e for e in events if e["event"] == "ingest conflicts set aside"]
    assert warning["log_level"] == "warning" and warning["first_reason"] == "index"
    assert (warning["session_id"], warning["index"], warning["count"]) == (SESSION, 20, 1)
