"""Wiring: every configured input feeding one sink.

The sink is the seam. The standalone bridge passes the gRPC ``Forwarder``; poirotd can build a
``Bridge`` with a sink that commits to its own store and skip the network hop entirely.

Delivery guarantees, end to end:

- MQTT QoS 1: nothing is lost at the bridge. A message is PUBACKed only after poirotd acked it
  durable, so whatever the bridge held when it stopped or crashed is redelivered by the broker
  (duplicates possible: at least once). Losses can still happen at the broker: messages
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

from hwbridge.config import BridgeConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.ingest import Delivery, Sink, TelemetryInput
from hwbridge.market import TcpLineFeed
from hwbridge.mqtt import MqttSubscriber
from hwbridge.topics import Router


class Bridge:
    def __init__(self, config: BridgeConfig, sink: Sink, dead_letters: DeadLetterStore) -> None:
        self._dead_letters = dead_letters
        self._sources: list[tuple[str, TelemetryInput, AsyncGenerator[Delivery]]] = []
        self.mqtt: MqttSubscriber | None = None
        self.feeds: list[TcpLineFeed] = []

        def pipeline(router: Router) -> TelemetryInput:
            return TelemetryInput(router, config.session_id, sink, dead_letters, config.pipeline)

        if config.mqtt is not None:
            mappings = config.mqtt.mappings
            self.mqtt = MqttSubscriber(config.mqtt.broker, [(m.topic, m.qos) for m in mappings])
            router = Router([m.route() for m in mappings])
            self._sources.append(("mqtt", pipeline(router), self.mqtt.deliveries()))
        for feed_config in config.tcp_feeds:
            feed = TcpLineFeed(feed_config)
            self.feeds.append(feed)
            router = Router([feed_config.route()])
            self._sources.append((feed_config.name, pipeline(router), feed.deliveries()))

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
        for feed in self.feeds:
            snapshot[f"tcp.{feed.name}"] = asdict(feed.stats)
        return snapshot
