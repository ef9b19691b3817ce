"""MQTT transport: with hwbridge.mqtt_failures, the only modules that import aiomqtt (or touch
paho-mqtt).

Subscribing: a fixed client id with clean_session=False, so the broker keeps the subscriptions
and queues QoS 1 messages while the bridge is away; reconnects with jittered exponential backoff.

Security: ``BrokerConfig.tls`` and ``password`` are applied here, in ``_client``, for every
connection the bridge, the daemon's input and the simulators open; both are read again at each
connect. A failed connect is classified (``hwbridge.mqtt_failures``), logged, counted by reason
and retried with backoff.

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
import logging
import socket
import ssl
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Self

import aiomqtt
import paho.mqtt.client as paho
import structlog
from paho.mqtt.matcher import MQTTMatcher
from paho.mqtt.reasoncodes import ReasonCode

from hwbridge.backoff import Backoff
from hwbridge.config import BrokerConfig
from hwbridge.ingest import Delivery
from hwbridge.mqtt_failures import ConnectionFailure, classify
from poirotd.client.secrets import SecretError
from poirotd.client.tls import ClientTLSError

log = structlog.get_logger(__name__)

# Room left in the client's buffer when reading pauses (see _Valve).
_READ_SLACK = 16
# Packets read from the broker's socket per event-loop turn at most (see _Valve).
_READ_BURST = 256


@dataclass
class MqttStats:
    connects: int = 0
    # Messages the client discarded because its buffer (BrokerConfig.queue_size) was full.
    dropped: int = 0
    # Times reading from the broker paused because that buffer was nearly full.
    paused: int = 0


# What may go wrong while a connection is set up: aiomqtt's errors, and the client's own TLS
# files or password that cannot be read.
_CONNECT_ERRORS = (aiomqtt.MqttError, ClientTLSError, SecretError)


def _client(
    broker: BrokerConfig,
    *,
    identifier: str | None,
    clean_session: bool,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
) -> aiomqtt.Client:
    """A client with the broker's TLS context and password as their files hold them now."""
    password = None if broker.password is None else broker.password.read().get_secret_value()
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=None if identifier is None else client_id(identifier),
        clean_session=clean_session,
        username=broker.username,
        password=password,
        tls_context=None if broker.tls is None else broker.tls.context(),
        keepalive=broker.keepalive_s,
        timeout=broker.timeout_s,
        queue_type=queue_type,
        max_queued_incoming_messages=broker.queue_size,
    )


def client_id(configured: str) -> str:
    """The configured client id with `{hostname}` replaced by this host's name."""
    return configured.replace("{hostname}", socket.gethostname())


def _paho(client: aiomqtt.Client) -> paho.Client:
    """The paho client inside aiomqtt (private attribute ``_client``), checked, not assumed."""
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho.Client):
        raise RuntimeError(
            "aiomqtt no longer wraps a paho-mqtt Client as `_client`; manual acks need updating"
        )
    return inner


class _NoTopicCallbacks(MQTTMatcher):
    """paho looks each message's topic up among its per-topic callbacks, none of which are
    registered here, with a matcher whose recursive closure is a reference cycle: five objects
    of cyclic garbage per message, which at sensor rates is most of what starts the cyclic
    collector (and its pause). This lookup finds nothing and leaves nothing."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # paho's matcher is not annotated

    def iter_match(self, topic: str) -> Iterator[object]:
        return iter(())


class _Connection:
    """paho-level settings of one connection: manual acks, no per-topic callbacks, and until
    ``up()`` the last socket error paho logs (the only trace of a broker that ends the TLS
    session before CONNACK; see ``hwbridge.mqtt_failures``)."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self._paho = _paho(client)
        self._paho.manual_ack_set(True)
        self._paho._on_message_filtered = _NoTopicCallbacks()
        self._paho.on_log = self._on_log
        self.socket_error: str | None = None
        self.open = True

    def _on_log(self, client: paho.Client, userdata: object, level: int, message: str) -> None:
        if level == paho.MQTT_LOG_ERR:
            self.socket_error = message

    def up(self) -> None:
        """Stops watching paho's log: at sensor rates it logs a line per message."""
        self._paho.on_log = None

    def failure(self, exc: BaseException) -> ConnectionFailure:
        return classify(exc, self.socket_error)

    def acker(self, message: aiomqtt.Message) -> Callable[[], None]:
        mid, qos = message.mid, message.qos

        def ack() -> None:
            if self.open and qos > 0:
                self._paho.ack(mid, qos)

        return ack


class _Valve:
    """TCP backpressure for one connection: stops reading the broker's socket once the client's
    buffer holds `high` messages, and reads again when it is down to half. Mosquitto lets
    un-acked deliveries run far past its max_inflight_messages once PUBACKs flow (see
    BENCHMARKS.md), so without this a burst lands in the buffer whole: memory grows with the
    burst, and past queue_size aiomqtt drops messages that then wait un-acked at the broker until
    a reconnect. Paused, the broker keeps the backlog; the buffer, hence memory, stays bounded.

    aiomqtt registers its own socket reader, which offers no pause and reads one packet per
    event-loop turn (paho's loop_read): every message then costs a turn of its own, and the
    pipeline sees batches of one. Arming replaces it with this valve's reader, which reads up to
    `_READ_BURST` packets per turn and otherwise does what aiomqtt's does. Armed only once
    subscribed: before that, nothing takes messages from the buffer, and a pause would also hold
    back the SUBACK.
    """

    def __init__(self, high: int, stats: MqttStats) -> None:
        self._high, self._low = high, high // 2
        self._stats = stats
        self.buffer: asyncio.Queue[aiomqtt.Message] | None = None
        self._paho: paho.Client | None = None
        self._paused_fd: int | None = None

    def arm(self, client: paho.Client) -> None:
        self._paho = client
        sock = client.socket()
        loop = asyncio.get_running_loop()
        if sock is not None and loop.remove_reader(sock.fileno()):
            loop.add_reader(sock.fileno(), self._read)
        if self.buffer is not None:
            self.after_put(self.buffer.qsize())

    def after_put(self, size: int) -> None:
        if size < self._high or self._paused_fd is not None or self._paho is None:
            return
        sock = self._paho.socket()
        if sock is not None and asyncio.get_running_loop().remove_reader(sock.fileno()):
            self._paused_fd = sock.fileno()
            self._stats.paused += 1

    def after_get(self, size: int) -> None:
        if self._paused_fd is None or size > self._low or self._paho is None:
            return
        fd, self._paused_fd = self._paused_fd, None
        sock = self._paho.socket()
        if sock is not None and sock.fileno() == fd:  # else the connection is gone: no reader
            loop = asyncio.get_running_loop()
            loop.add_reader(fd, self._read)
            if self._decrypted():
                loop.call_soon(self._read)

    def _read(self) -> None:
        """Reads packets until none completes (a non-PUBLISH packet also ends the burst; the
        next turn reads on), the valve pauses, or `_READ_BURST` is reached."""
        assert self._paho is not None and self.buffer is not None
        if self._paused_fd is not None:  # paused after this read was scheduled
            return
        try:
            for _ in range(_READ_BURST):
                before = self.buffer.qsize()
                self._paho.loop_read()
                if self._paused_fd is not None:
                    return
                if self.buffer.qsize() == before and not self._decrypted():
                    return
            if self._decrypted():
                asyncio.get_running_loop().call_soon(self._read)
        except Exception as exc:  # aiomqtt's reader ends the connection likewise
            log.warning("mqtt read failed; disconnecting", error=repr(exc))
            self._paho.disconnect()

    def _decrypted(self) -> bool:
        """Whether TLS holds bytes it decrypted that paho has not read. They no longer make the
        socket readable, so a reader waiting for that would wait for the broker's next packet
        (aiomqtt's own reader checks this too: eclipse-paho/paho.mqtt.python#131)."""
        sock = None if self._paho is None else self._paho.socket()
        return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


class MqttSubscriber:
    """Yields deliveries from the subscribed filters forever, reconnecting as needed."""

    def __init__(self, broker: BrokerConfig, subscriptions: Sequence[tuple[str, int]]) -> None:
        self._broker = broker
        self._subscriptions = list(subscriptions)
        self.stats = MqttStats()
        # Connections that failed or were lost, by reason (hwbridge.mqtt_failures.REASONS).
        self.failures: Counter[str] = Counter()

    def _counting_queue(self, valve: _Valve) -> type[asyncio.Queue[aiomqtt.Message]]:
        """aiomqtt drops a message when its queue is full and only logs it; count it too. The
        valve sees the queue's size after each put and get."""
        stats = self.stats

        class CountingQueue(asyncio.Queue[aiomqtt.Message]):
            def __init__(self, maxsize: int = 0) -> None:
                super().__init__(maxsize)
                valve.buffer = self

            def put_nowait(self, item: aiomqtt.Message) -> None:
                try:
                    super().put_nowait(item)
                except asyncio.QueueFull:
                    stats.dropped += 1
                    raise
                valve.after_put(self.qsize())

            def get_nowait(self) -> aiomqtt.Message:
                item = super().get_nowait()
                valve.after_get(self.qsize())
                return item

        return CountingQueue

    async def deliveries(self) -> AsyncGenerator[Delivery]:
        backoff = Backoff(self._broker.backoff)
        while True:
            # Paused a little short of full: a read may deliver a few messages at once.
            valve = _Valve(max(1, self._broker.queue_size - _READ_SLACK), self.stats)
            try:
                client = _client(
                    self._broker,
                    identifier=self._broker.client_id,
                    clean_session=False,
                    queue_type=self._counting_queue(valve),
                )
            except _CONNECT_ERRORS as exc:
                self._failed(classify(exc, None))
                await backoff.sleep()
                continue
            connection = _Connection(client)
            subscribed = False
            try:
                async with client:
                    connection.up()
                    granted = await client.subscribe(self._subscriptions)
                    self._report_refused(granted)
                    valve.arm(_paho(client))
                    self.stats.connects += 1
                    subscribed = True
                    backoff.reset()
                    log.info("mqtt subscribed", broker=_address(self._broker))
                    buffer = valve.buffer
                    assert buffer is not None, "aiomqtt made its queue on entering"
                    async for message in client.messages:
                        yield _delivery(message, connection)
                        # aiomqtt's iterator costs a task and a wait per message: what the
                        # buffer already holds is taken directly.
                        while not buffer.empty():
                            yield _delivery(buffer.get_nowait(), connection)
            except aiomqtt.MqttError as exc:
                lost = ConnectionFailure("lost", str(exc))
                self._failed(lost if subscribed else connection.failure(exc))
            finally:
                connection.open = False
                _read_disconnection_error(client)
            await backoff.sleep()

    def _failed(self, failure: ConnectionFailure) -> None:
        self.failures[failure.reason] += 1
        _log_failure(failure, self._broker)

    def _report_refused(self, granted: Sequence[int | ReasonCode]) -> None:
        """A filter the broker refuses (SUBACK 0x80, e.g. its ACL) would otherwise just stay
        silent; retrying cannot fix it, so it is logged at every connect."""
        for (topic, _), code in zip(self._subscriptions, granted, strict=False):
            if (code.value if isinstance(code, ReasonCode) else code) >= 0x80:
                log.error("mqtt subscription refused", topic=topic, code=str(code))


def _address(broker: BrokerConfig) -> str:
    return f"{broker.host}:{broker.port}"


def _log_failure(failure: ConnectionFailure, broker: BrokerConfig) -> None:
    """A warning when waiting may help (the broker or the network is down), an error when
    someone has to change a certificate, a password or the broker's settings."""
    transient = failure.reason in ("unreachable", "timeout", "lost")
    log.log(
        logging.WARNING if transient else logging.ERROR,
        "mqtt connection lost" if failure.reason == "lost" else "mqtt connect failed",
        reason=failure.reason,
        error=failure.detail,
        broker=_address(broker),
    )


def _read_disconnection_error(client: aiomqtt.Client) -> None:
    """Marks a left client's disconnection error as read. aiomqtt keeps the error of an
    unexpected disconnection in a future (private ``_disconnected``) that leaving the client
    does not read when the connection is already gone. asyncio then logs "Future exception was
    never retrieved" whenever the client is collected, a spurious error: the loss was reported
    already, by the MqttError that ended the connection or the publish."""
    disconnected = getattr(client, "_disconnected", None)
    if isinstance(disconnected, asyncio.Future) and disconnected.done():
        with contextlib.suppress(asyncio.CancelledError):
            disconnected.exception()


def _delivery(message: aiomqtt.Message, connection: _Connection) -> Delivery:
    return Delivery(
        source=message.topic.value,
        payload=_payload(message),
        received_at=datetime.now(UTC),
        ack=connection.acker(message),
    )


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
                _log_failure(ConnectionFailure("lost", str(exc)), self._broker)
                await self._disconnect()
                await self._backoff.sleep()

    async def _connected(self) -> aiomqtt.Client:
        while self._client is None:
            try:
                client = _client(self._broker, identifier=None, clean_session=True)
            except _CONNECT_ERRORS as exc:
                _log_failure(classify(exc, None), self._broker)
                await self._backoff.sleep()
                continue
            connection = _Connection(client)
            try:
                await self._stack.enter_async_context(client)
            except aiomqtt.MqttError as exc:
                _log_failure(connection.failure(exc), self._broker)
                await self._backoff.sleep()
                continue
            connection.up()
            self._client = client
            self._backoff.reset()
        return self._client

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        with contextlib.suppress(aiomqtt.MqttError):
            await self._stack.aclose()
        if client is not None:
            _read_disconnection_error(client)
