"""Wiring: every configured input feeding one sink.

The sink is the seam. The standalone bridge passes the gRPC ``Forwarder``; poirotd can build a
``Bridge`` with a sink that commits to its own store and skip the network hop entirely.

Delivery guarantees, end to end:

- MQTT QoS 1: nothing is lost at the bridge. A message is PUBACKed only after poirotd acked it
  durable, so whatever the bridge held when it stopped or crashed is redelivered by the broker:
  at least once, and exactly once on one store when the payloads carry their producer's key
  (codec ``key_field``, a message's ``seq``). Losses can still happen at the broker: messages
  published before the bridge's first subscription ever reached it (no session yet), beyond
  Mosquitto's ``max_queued_messages`` per client (default 1000, then dropped), or everything
  since the last save if the broker crashes (``persistence true`` saves on clean shutdown and
  every ``autosave_interval``).
- MQTT QoS 0 and TCP line feeds: no acknowledgements exist, so a stop or crash loses what the
  bridge held that poirotd had not yet acked: at most the decode queue (``max_batch``
  deliveries), the batches in flight (``max_batches_in_flight`` x ``max_batch`` samples) and the
  forwarder's window (``max_pending`` samples); plus, for QoS 0, aiomqtt's buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import asdict
from typing import Any

from hwbridge.config import BridgeConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.ingest import (
    Delivery,
    DeliveryInput,
    MessageInput,
    MessageSink,
    Sink,
    TelemetryInput,
)
from hwbridge.market import TcpLineFeed
from hwbridge.mqtt import MqttSubscriber
from hwbridge.topics import Route, Router

# The agent-message topics' MQTT connection, beside the telemetry one: its client id's suffix.
MESSAGES_CLIENT_SUFFIX = "-messages"


class Bridge:
    """`message_sink` takes the agent messages of the MQTT input's `messages` topics (required
    when there are any)."""

    def __init__(
        self,
        config: BridgeConfig,
        sink: Sink,
        dead_letters: DeadLetterStore,
        message_sink: MessageSink | None = None,
    ) -> None:
        self._dead_letters = dead_letters
        self._sources: list[tuple[str, DeliveryInput[Any, Any, Any], AsyncGenerator[Delivery]]] = []
        self.mqtt: MqttSubscriber | None = None
        self.mqtt_messages: MqttSubscriber | None = None
        self.messages: MessageInput | None = None
        self.feeds: list[TcpLineFeed] = []

        def pipeline(router: Router[Route], transport: str) -> TelemetryInput:
            return TelemetryInput(
                router, config.session_id, sink, dead_letters, config.pipeline, transport
            )

        mqtt = config.mqtt
        if mqtt is not None and mqtt.mappings:
            self.mqtt = MqttSubscriber(
                mqtt.broker, [(mqtt.subscription(m.topic), m.qos) for m in mqtt.mappings]
            )
            router = Router([m.route() for m in mqtt.mappings])
            self._sources.append(("mqtt", pipeline(router, "mqtt"), self.mqtt.deliveries()))
        if mqtt is not None and mqtt.messages:
            if message_sink is None:
                raise ValueError("agent-message topics are configured but nothing takes them")
            broker = mqtt.broker.model_copy(
                update={"client_id": mqtt.broker.client_id + MESSAGES_CLIENT_SUFFIX}
            )
            self.mqtt_messages = MqttSubscriber(
                broker, [(mqtt.subscription(m.topic), m.qos) for m in mqtt.messages]
            )
            self.messages = MessageInput(
                Router([m.route() for m in mqtt.messages]),
                config.session_id,
                message_sink,
                dead_letters,
                config.pipeline,
            )
            deliveries = self.mqtt_messages.deliveries()
            self._sources.append(("mqtt_messages", self.messages, deliveries))
        for feed_config in config.tcp_feeds:
            feed = TcpLineFeed(feed_config)
            self.feeds.append(feed)
            router = Router([feed_config.route()])
            self._sources.append((feed_config.name, pipeline(router, "tcp"), feed.deliveries()))

    async def run(self) -> None:
        """Runs every input until cancelled; the first input to fail (its sink raised) stops
        all of them, and its exception is raised here."""
        try:
            async with contextlib.AsyncExitStack() as stack, asyncio.TaskGroup() as group:
                for name, source_input, deliveries in self._sources:
                    # Closing the generator closes its connection (MQTT: a clean DISCONNECT; the
                    # session and its un-acked messages stay with the broker).
                    await stack.enter_async_context(contextlib.aclosing(deliveries))
                    group.create_task(source_input.run(deliveries), name=f"input-{name}")
        except ExceptionGroup as failure:
            raise failure.exceptions[0] from failure

    def stats(self) -> dict[str, dict[str, int]]:
        """A snapshot of every counter, for the periodic log line (and, later, metrics)."""
        snapshot = {f"input.{name}": asdict(pipe.stats) for name, pipe, _ in self._sources}
        snapshot["dead_letters"] = asdict(self._dead_letters.stats)
        if self.mqtt is not None:
            snapshot["mqtt"] = asdict(self.mqtt.stats)
            snapshot["mqtt_failures"] = dict(self.mqtt.failures)
        if self.mqtt_messages is not None:
            snapshot["mqtt_messages"] = asdict(self.mqtt_messages.stats)
        if self.messages is not None:
            snapshot["route_refusals"] = dict(self.messages.route_refusals)
        for feed in self.feeds:
            snapshot[f"tcp.{feed.name}"] = asdict(feed.stats)
        return snapshot
