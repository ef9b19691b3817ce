"""Agent messages in the standalone bridge: the payload schema, their own MQTT connection beside
the telemetry one (real Mosquitto), and the gRPC forwarder taking them to a real poirotd, which
starts their sessions and numbers the ones without an index."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hwbridge.bridge import Bridge
from hwbridge.codecs import DecodeError
from hwbridge.config import BridgeConfig, DeadLetterConfig, MessageTopic
from hwbridge.deadletter import DeadLetterStore
from hwbridge.messages import ReceivedMessage, RouteRefusedError
from hwbridge.mqtt import MqttPublisher
from poirotd.daemon import Daemon
from poirotd.model import ItemKey, MessageKind
from tests.support.bridge import forwarder
from tests.support.mosquitto import Mosquitto, broker
from tests.support.waiting import Collector, eventually

AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
ROUTE = MessageTopic(topic="mas/+/out", sender="{w1}", session_id="mas").route()


def decode(body: object, topic: str = "mas/doctor/out") -> ReceivedMessage:
    captures = ROUTE.filter.match(topic)
    assert captures is not None
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return ROUTE.decode(payload, topic, captures, AT, "bridge-session")


def test_the_payload_schema() -> None:
    received = decode({"content": "hi", "recipient": "chief", "sent_at": 1767603600})
    assert received.numbered is False and received.message.index == 0
    message = received.message
    assert (message.session_id, message.sender, message.kind) == ("mas", "doctor", "agent")
    assert message.sent_at == datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    tool = decode({"session": "s2", "index": 4, "kind": "tool", "tool_name": "t", "content": "1"})
    assert tool.numbered and tool.message.index == 4 and tool.message.kind is MessageKind.TOOL
    assert tool.message.session_id == "s2" and tool.message.sent_at == AT
    for body, says in [
        (b"{", "Invalid JSON"),
        ({"contnet": "x"}, "contnet: Extra inputs are not permitted"),
        ({"index": -1}, "index: Input should be greater than or equal to 0"),
        ({"kind": "robot"}, "kind: Input should be"),
        ({"sender": "chief"}, "sender 'chief' is not the topic's sender 'doctor'"),
        ({"seq": 1, "producer": "otlp:1"}, "producer names starting 'otlp:' are the OTLP"),
    ]:
        with pytest.raises(DecodeError, match=says):
            decode(body)
    no_sender = MessageTopic(topic="mas/all").route()
    with pytest.raises(DecodeError, match="no sender"):
        no_sender.decode(b"{}", "mas/all", (), AT, "s")
    with pytest.raises(DecodeError, match="no session"):
        no_sender.decode(b'{"sender": "doctor"}', "mas/all", (), AT, "")


def test_a_payloads_key_is_its_topics_whatever_producer_it_names() -> None:
    spoofed = decode({"seq": 3, "producer": "mas/chief/out"})
    assert spoofed.key == ItemKey("mqtt:mas/doctor/out|mas/chief/out", 3)
    assert decode({"seq": 3}, "mas/chief/out").key == ItemKey("mqtt:mas/chief/out|", 3)
    # A topic's "|" is escaped: no topic can end where another's name begins.
    assert decode({"seq": 1}, "mas/a|b/out").key == ItemKey("mqtt:mas/a%7Cb/out|", 1)
    with pytest.raises(DecodeError, match="the producer's name with its topic"):
        decode({"seq": 1, "producer": "p" * 250})


def test_a_pinned_route_decides_session_kind_and_index() -> None:
    pin = {"session": True, "kind": "agent", "index": "daemon"}
    icu = MessageTopic(topic="icu7/+/out", sender="{w1}", session_id="icu-7", pin=pin).route()

    def icu_decode(body: object) -> ReceivedMessage:
        payload = json.dumps(body).encode()
        return icu.decode(payload, "icu7/doctor/out", ("doctor",), AT, "input")

    repeated = icu_decode({"session": "icu-7", "kind": "agent", "content": "Noted."})
    assert (repeated.message.session_id, repeated.numbered) == ("icu-7", False)
    for body, field in [
        ({"session": "victim-icu-7"}, "session"),
        ({"kind": "human"}, "kind"),
        ({"index": 20}, "index"),
        ({"sender": "chief"}, "sender"),
    ]:
        with pytest.raises(RouteRefusedError) as refused:
            icu_decode(body)
        assert refused.value.field == field, body
    console = MessageTopic(topic="ward/console", sender="nurse", pin={"kind": "human"}).route()
    said = console.decode(b'{"content": "Pause."}', "ward/console", (), AT, "ward")
    assert (said.message.kind, said.message.session_id) == (MessageKind.HUMAN, "ward")


async def test_the_bridge_reads_messages_on_their_own_connection(mosquitto: Mosquitto) -> None:
    config = BridgeConfig.model_validate(
        {
            "session_id": "bridge-session",
            "poirotd": {"system": "clinic"},
            "mqtt": {
                "broker": broker(mosquitto).model_dump(),
                "mappings": [{"topic": "exo/+", "component": "exo"}],
                "messages": [{"topic": "mas/+/out", "sender": "{w1}"}],
            },
        }
    )
    samples = Collector()
    messages: list[ReceivedMessage] = []

    async def take(batch: list[ReceivedMessage]) -> None:
        messages.extend(batch)

    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    bridge = Bridge(config, samples, dead_letters, take)
    with pytest.raises(ValueError, match="nothing takes them"):
        Bridge(config, samples, dead_letters)
    running = asyncio.create_task(bridge.run())
    try:
        async with asyncio.timeout(10):
            await eventually(
                lambda: all(
                    s is not None and s.stats.connects for s in (bridge.mqtt, bridge.mqtt_messages)
                )
            )
            async with MqttPublisher(broker(mosquitto, "agents")) as publisher:
                await publisher.publish("exo/knee", b'{"ts": 1767603600, "deg": 12.5}')
                await publisher.publish("mas/chief/out", b'{"content": "Continue."}')
                await publisher.publish("mas/chief/out", b"[1, 2]")
            await eventually(lambda: bool(messages) and bool(samples.samples))
            await eventually(lambda: bridge.stats()["input.mqtt_messages"]["acked"] == 2)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert [(m.message.sender, m.message.content) for m in messages] == [("chief", "Continue.")]
    assert [s.signal for s in samples.samples] == ["deg"]
    stats = bridge.stats()
    assert stats["input.mqtt_messages"]["undecodable"] == 1 and stats["mqtt_messages"]["connects"]
    assert [letter.source for letter in dead_letters.recent()] == ["mas/chief/out"]


async def test_the_forwarder_takes_messages_to_poirotd(daemon: Daemon, tmp_path: Path) -> None:
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    async with forwarder(daemon.grpc_port, dead_letters=dead_letters) as sink:
        async with asyncio.timeout(10):
            await sink.messages(
                [
                    decode({"content": "first"}),
                    decode({"content": "second"}, "mas/physio/out"),
                    decode({"content": "refused"}, "mas/toaster/out"),
                    decode({"session": "e2e", "index": 3, "content": "numbered"}),
                    decode({"content": "third"}),
                ]
            )
        assert sink.stats.rejected == 1
    assert daemon._store is not None
    mas = await daemon._store.session_messages("mas")
    # poirotd numbered them, in order; the refused message (and what the stream it ended had
    # numbered after it) left indexes unused.
    assert [(m.sender, m.content) for m in mas] == [
        ("doctor", "first"),
        ("physio", "second"),
        ("doctor", "third"),
    ]
    assert [m.index for m in mas][:2] == [0, 1] and mas[2].index > 2
    session = await daemon._store.get_session("mas")
    assert session is not None and session.labels == {"input": "mqtt"}
    e2e = await daemon._store.session_messages("e2e")
    assert [(m.index, m.content) for m in e2e] == [(3, "numbered")]
    (letter,) = dead_letters.recent()
    assert "'toaster' is not an agent" in letter.reason and b"refused" in letter.payload
