"""MQTT transport: the only module that imports aiomqtt (or touches paho-mqtt).

Subscribing: a fixed client id with clean_session=False, so the broker keeps the subscriptions
and queues QoS 1 messages while the bridge is away; reconnects with jittered exponential backoff.

Acknowledgement: a QoS 1 message is PUBACKed only when the pipeline calls its ``Delivery.ack``,
i.e. after the sink (poirotd) has it durably. aiomqtt 2.x has no option for that (open issue
empicano/aiomqtt#345, draft PR #346), but the paho-mqtt client it wraps does since 2.0
(``manual_ack_set`` / ``ack(mid, qos)``, eclipse-paho/paho.mqtt.python PR #753). This module
reaches that wrapped client in one place, ``_paho``, before connecting. An ack is sent on the
connection its message came in on and dropped if that connection is gone: after a reconnect the
broker redelivers every un-acked message itself, and a stale message id could name another.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Self

import aiomqtt
import paho.mqtt.client as paho
import structlog
from paho.mqtt.reasoncodes import ReasonCode

from hwbridge.backoff import Backoff
from hwbridge.config import BrokerConfig
from hwbridge.ingest import Delivery

log = structlog.get_logger(__name__)


@dataclass
class MqttStats:
    connects: int = 0
    # Messages the client discarded because its buffer (BrokerConfig.queue_size) was full.
    dropped: int = 0


def _client(
    broker: BrokerConfig,
    *,
    identifier: str | None,
    clean_session: bool,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
) -> aiomqtt.Client:
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=identifier,
        clean_session=clean_session,
        username=broker.username,
        password=None if broker.password is None else broker.password.get_secret_value(),
        keepalive=broker.keepalive_s,
        timeout=broker.timeout_s,
        queue_type=queue_type,
        max_queued_incoming_messages=broker.queue_size,
    )


def _paho(client: aiomqtt.Client) -> paho.Client:
    """The paho client inside aiomqtt (private attribute ``_client``), checked, not assumed."""
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho.Client):
        raise RuntimeError(
            "aiomqtt no longer wraps a paho-mqtt Client as `_client`; manual acks need updating"
        )
    return inner


class _Connection:
    def __init__(self, client: aiomqtt.Client) -> None:
        self._paho = _paho(client)
        self._paho.manual_ack_set(True)
        self.open = True

    def acker(self, message: aiomqtt.Message) -> Callable[[], None]:
        mid, qos = message.mid, message.qos

        def ack() -> None:
            if self.open and qos > 0:
                self._paho.ack(mid, qos)

        return ack


class MqttSubscriber:
    """Yields deliveries from the subscribed filters forever, reconnecting as needed."""

    def __init__(self, broker: BrokerConfig, subscriptions: Sequence[tuple[str, int]]) -> None:
        self._broker = broker
        self._subscriptions = list(subscriptions)
        self.stats = MqttStats()

    def _counting_queue(self) -> type[asyncio.Queue[aiomqtt.Message]]:
        """aiomqtt drops a message when its queue is full and only logs it; count it too."""
        stats = self.stats

        class CountingQueue(asyncio.Queue[aiomqtt.Message]):
            def put_nowait(self, item: aiomqtt.Message) -> None:
                try:
                    super().put_nowait(item)
                except asyncio.QueueFull:
                    stats.dropped += 1
                    raise

        return CountingQueue

    async def deliveries(self) -> AsyncGenerator[Delivery]:
        backoff = Backoff(self._broker.backoff)
        while True:
            client = _client(
                self._broker,
                identifier=self._broker.client_id,
                clean_session=False,
                queue_type=self._counting_queue(),
            )
            connection = _Connection(client)
            try:
                async with client:
                    granted = await client.subscribe(self._subscriptions)
                    self._report_refused(granted)
                    self.stats.connects += 1
                    backoff.reset()
                    log.info("mqtt subscribed", broker=f"{self._broker.host}:{self._broker.port}")
                    async for message in client.messages:
                        yield Delivery(
                            source=message.topic.value,
                            payload=_payload(message),
                            received_at=datetime.now(UTC),
                            ack=connection.acker(message),
                        )
            except aiomqtt.MqttError as exc:
                log.warning("mqtt connection lost", error=str(exc))
            finally:
                connection.open = False
            await backoff.sleep()

    def _report_refused(self, granted: Sequence[int | ReasonCode]) -> None:
        """A filter the broker refuses (SUBACK 0x80, e.g. its ACL) would otherwise just stay
        silent; retrying cannot fix it, so it is logged at every connect."""
        for (topic, _), code in zip(self._subscriptions, granted, strict=False):
            if (code.value if isinstance(code, ReasonCode) else code) >= 0x80:
                log.error("mqtt subscription refused", topic=topic, code=str(code))


def _payload(message: aiomqtt.Message) -> bytes:
    payload = message.payload
    # Received payloads are always bytes; aiomqtt's type also covers what one may publish.
    return bytes(payload) if isinstance(payload, bytes | bytearray) else str(payload).encode()


class MqttPublisher:
    """Publishing for the simulators, at least once: a QoS 1 publish whose PUBACK does not
    arrive within the timeout is sent again on a fresh connection (a duplicate is possible)."""

    def __init__(self, broker: BrokerConfig) -> None:
        self._broker = broker
        self._backoff = Backoff(broker.backoff)
        self._client: aiomqtt.Client | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._disconnect()

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        while True:
            client = await self._connected()
            try:
                await client.publish(topic, payload, qos=qos, timeout=self._broker.timeout_s)
                return
            except aiomqtt.MqttError as exc:
                log.warning("mqtt publish failed; reconnecting", error=str(exc))
                await self._disconnect()
                await self._backoff.sleep()

    async def _connected(self) -> aiomqtt.Client:
        while self._client is None:
            client = _client(self._broker, identifier=None, clean_session=True)
            try:
                await self._stack.enter_async_context(client)
            except aiomqtt.MqttError as exc:
                log.warning("mqtt connect failed", error=str(exc))
                await self._backoff.sleep()
                continue
            self._client = client
            self._backoff.reset()
        return self._client

    async def _disconnect(self) -> None:
        self._client = None
        with contextlib.suppress(aiomqtt.MqttError):
            await self._stack.aclose()
