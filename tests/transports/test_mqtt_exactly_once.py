"""Exactly-once storage and shared subscriptions on the daemon's MQTT input, against a real
Mosquitto: a producer's resend and a broker's redelivery after a lost PUBACK are stored once
(and counted), and two replicas in one share group split a topic with nothing stored twice."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from hwbridge import mqtt as hwbridge_mqtt
from hwbridge.codecs import DecodeError, DocumentCodec
from hwbridge.config import MqttInputConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.daemon import Daemon
from tests.support.gait import connected_daemon, counter, query
from tests.support.mosquitto import Mosquitto, broker
from tests.support.shared_mqtt import (
    MESSAGES,
    keyed_spec,
    publish_readings,
    reading,
    stored_values,
)
from tests.support.waiting import eventually


def duplicates(daemon: Daemon, kind: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_duplicates_total", {"kind": kind}
    )
    return value or 0.0


async def test_a_producers_resend_is_stored_once(tmp_path: Path, mosquitto: Mosquitto) -> None:
    system = keyed_spec(mosquitto, "poirotd-keyed")
    async with connected_daemon(tmp_path, system) as daemon:
        publisher = broker(mosquitto, "publisher")
        # The producer missed the broker's PUBACKs for 3..5 and publishes them again.
        await publish_readings(publisher, range(1, 6))
        await publish_readings(publisher, range(3, 8))
        message = json.dumps({"seq": 1, "content": "the offset is noise"}).encode()
        async with MqttPublisher(publisher) as client:
            for _ in range(2):  # numbered by the daemon each time: only the key tells
                await client.publish(MESSAGES.format(agent="doctor"), message)
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "messages_acked") == 10)
            await eventually(lambda: counter(daemon, "agent_messages_acked") == 2)
        assert stored_values(daemon.settings.db_path) == {float(i): 1 for i in range(1, 8)}
        assert query(daemon, "SELECT count(*) FROM agent_messages") == [(1,)]
        assert duplicates(daemon, "telemetry") == 3
        assert duplicates(daemon, "agent_message") == 1


async def test_every_reading_of_a_keyed_payload_is_stored_once(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """A payload of several readings: each gets a key of its own, so all are stored, once."""
    system = keyed_spec(mosquitto, "poirotd-several")
    async with connected_daemon(tmp_path, system) as daemon:
        payload = json.dumps({"seq": 1, "knee": 11.0, "ankle": 12.0, "hip": 13.0}).encode()
        async with MqttPublisher(broker(mosquitto, "publisher")) as client:
            for _ in range(2):
                await client.publish("plant/d1/reading", payload)
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "messages_acked") == 2)
        assert stored_values(daemon.settings.db_path) == {11.0: 1, 12.0: 1, 13.0: 1}
        assert duplicates(daemon, "telemetry") == 3


def swallow_acks(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """The input's PUBACKs are lost (as when its connection breaks right after the commit)
    until the returned function is called."""
    acker = hwbridge_mqtt._Connection.acker
    lost = [True]

    def maybe_lost(self: hwbridge_mqtt._Connection, message: object) -> Callable[[], None]:
        ack = acker(self, message)  # type: ignore[arg-type]
        return (lambda: None) if lost else ack

    monkeypatch.setattr(hwbridge_mqtt._Connection, "acker", maybe_lost)
    return lambda: lost.clear()


@pytest.mark.timeout(60)
async def test_a_redelivery_after_a_lost_puback_is_stored_once(
    tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    restore = swallow_acks(monkeypatch)
    system = keyed_spec(mosquitto, "poirotd-redelivered")
    async with connected_daemon(tmp_path, system) as daemon:
        # Fewer than Mosquitto's in-flight window (20): all are sent before any PUBACK.
        await publish_readings(broker(mosquitto, "publisher"), range(1, 16))
        async with asyncio.timeout(20):
            await eventually(lambda: counter(daemon, "samples_committed") == 15)
        restore()
        # The broker (persistence on) restarts: the session's 15 un-acked messages come again.
        await asyncio.to_thread(mosquitto.restart)

        def redelivered() -> float:
            return counter(daemon, "messages_received") - 15

        async with asyncio.timeout(30):
            await eventually(lambda: redelivered() > 0)
            await eventually(lambda: duplicates(daemon, "telemetry") == redelivered())
        print(f"\n{redelivered():.0f} of 15 redelivered after the broker's restart")
        assert stored_values(daemon.settings.db_path) == {float(i): 1 for i in range(1, 16)}


@pytest.mark.timeout(60)
async def test_two_replicas_in_a_share_group_split_a_topic(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    spec_a = keyed_spec(mosquitto, "poirotd-a", share_group="poirotd")
    spec_b = keyed_spec(mosquitto, "poirotd-b", share_group="poirotd")
    async with (
        connected_daemon(tmp_path / "a", spec_a) as a,
        connected_daemon(tmp_path / "b", spec_b) as b,
    ):
        await publish_readings(broker(mosquitto, "publisher"), range(1, 201))
        async with asyncio.timeout(20):
            await eventually(
                lambda: counter(a, "messages_acked") + counter(b, "messages_acked") == 200
            )
        in_a, in_b = stored_values(a.settings.db_path), stored_values(b.settings.db_path)
    assert in_a and in_b, "the broker gave each member a share"
    assert in_a + in_b == {float(i): 1 for i in range(1, 201)}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"share_group": "a/b"}, "may not contain '/', '+' or '#'"),
        ({"share_group": ""}, "at least 1 character"),
        (
            {"share_group": "g", "mappings": [{"topic": "$share/g/x", "component": "exo"}]},
            "write the plain filter and set share_group",
        ),
    ],
)
def test_a_share_group_is_checked(change: dict[str, object], problem: str) -> None:
    config = {"mappings": [{"topic": "x/+", "component": "exo"}], **change}
    with pytest.raises(ValidationError, match=re.escape(problem)):
        MqttInputConfig.model_validate(config)


def test_a_shared_subscription_names_the_group() -> None:
    config = MqttInputConfig.model_validate(
        {"share_group": "poirotd", "mappings": [{"topic": "d2w/+/joints", "component": "exo"}]}
    )
    assert config.subscription("d2w/+/joints") == "$share/poirotd/d2w/+/joints"


def test_a_keyed_payload_needs_an_integer_seq() -> None:
    codec = DocumentCodec("json", timestamp_field=None, timestamp_unit="s", key_field="seq")
    now = datetime.now(UTC)
    assert codec.decode_keyed(reading(7), now)[1] == ("", 7)
    for bad in (b'{"seq": "7", "v": 1}', b'{"seq": 0, "v": 1}', b'[{"seq": 1, "v": 1}]'):
        with pytest.raises(DecodeError):
            codec.decode_keyed(bad, now)


def test_a_payloads_producer_is_a_name_other_transports_do_not_own() -> None:
    codec = DocumentCodec(
        "json", timestamp_field=None, timestamp_unit="s", key_field="seq", producer_field="by"
    )
    now = datetime.now(UTC)
    assert codec.decode_keyed(b'{"seq": 2, "by": "bridge-a", "v": 1}', now)[1] == ("bridge-a", 2)
    for bad, says in [
        (b'{"seq": 2, "by": "", "v": 1}', "is not a name"),
        (b'{"seq": 2, "by": "otlp:0a", "v": 1}', "are the OTLP receiver's"),
        (b'{"seq": 2, "by": "' + b"p" * 257 + b'", "v": 1}', "the limit is 256"),
    ]:
        with pytest.raises(DecodeError, match=says):
            codec.decode_keyed(bad, now)
