"""Bridge configuration: pydantic models for one YAML file, validated up front.

Codec formats, topic filters and name templates are compiled here, at load time, so a typo in
``bridge.yaml`` stops the bridge before it connects anywhere instead of dead-lettering every
message at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwbridge.codecs import Codec, DocumentCodec, FrameCodec, TimestampUnit
from hwbridge.messages import MessageRoute, PinnedFields
from hwbridge.topics import Route, Template, TopicFilter
from poirotd.client.secrets import SecretRef
from poirotd.client.tls import ClientTLS


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackoffConfig(_Model):
    """Exponential reconnect backoff (jittered) shared by MQTT, TCP feeds and the gRPC link."""

    initial_s: float = Field(default=0.5, gt=0)
    max_s: float = Field(default=30.0, gt=0)
    factor: float = Field(default=2.0, ge=1.0)


# ------------------------------------------------------------------ codecs


class _TimestampedCodec(_Model):
    # Field holding the measurement time (epoch number in `timestamp_unit`, an ISO-8601 string or
    # a CBOR datetime); without it a reading is stamped with the time the bridge received it.
    timestamp_field: str | None = "ts"
    timestamp_unit: TimestampUnit = "s"


class DocumentCodecConfig(_TimestampedCodec):
    """A JSON or CBOR document per message: a number, an object, or a list of objects."""

    kind: Literal["json", "cbor"] = "json"
    # Value fields to read; empty = every numeric field except the timestamp and the prefix.
    fields: tuple[str, ...] = ()
    # A string field prepended to each signal name, e.g. "symbol" -> "ACME.price".
    prefix_field: str | None = None
    # The producer's idempotency key (exactly-once storage): an integer field numbering its
    # payloads (a copy of a stored payload is dropped), and optionally a string field naming
    # one of the topic's producers (the key is the topic's whatever the payload says: a payload
    # cannot name another topic's producer). The producer must never reuse a number within the
    # daemon's idempotency window: a publisher that restarts its count takes a new name (a
    # number reused for other readings is set aside as a conflict, not stored).
    key_field: str | None = None
    producer_field: str | None = None

    @model_validator(mode="after")
    def _producer_with_key(self) -> DocumentCodecConfig:
        if self.producer_field is not None and self.key_field is None:
            raise ValueError("producer_field needs key_field")
        return self

    def build(self) -> Codec:
        return DocumentCodec(
            self.kind,
            timestamp_field=self.timestamp_field,
            timestamp_unit=self.timestamp_unit,
            fields=self.fields,
            prefix_field=self.prefix_field,
            key_field=self.key_field,
            producer_field=self.producer_field,
        )


class StructCodecConfig(_TimestampedCodec):
    """Fixed binary frames (Python ``struct`` format), several per message for high-rate sensors."""

    kind: Literal["struct"] = "struct"
    format: str
    # One name per struct item, in order; the timestamp field is one of them.
    fields: tuple[str, ...]
    timestamp_field: str | None = "t"

    def build(self) -> Codec:
        return FrameCodec(
            self.format,
            self.fields,
            timestamp_field=self.timestamp_field,
            timestamp_unit=self.timestamp_unit,
        )


CodecConfig = Annotated[DocumentCodecConfig | StructCodecConfig, Field(discriminator="kind")]


# ------------------------------------------------------------------ inputs


class TopicMapping(_Model):
    """MQTT topic filter -> (component, signal) with a payload codec.

    ``component`` and ``signal`` are templates: ``{w1}``, ``{w2}``... are the topic levels the
    filter's wildcards matched (a ``#`` capture keeps its slashes), ``{field}`` is the codec's
    field name and ``{topic}`` the whole topic. E.g. filter ``d2w/+/ankle/+/cable`` with signal
    ``ankle_{w2}_{field}`` turns field ``tension_n`` on ``d2w/p7/ankle/left/cable`` into
    ``ankle_left_tension_n``.
    """

    topic: str
    component: str
    signal: str = "{field}"
    codec: CodecConfig = Field(default_factory=DocumentCodecConfig)
    qos: Literal[0, 1] = 1

    def route(self) -> Route:
        return Route(TopicFilter(self.topic), self.component, self.signal, self.codec.build())

    @model_validator(mode="after")
    def _compiles(self) -> TopicMapping:
        self.route()  # a bad filter, template or codec raises ValueError, reported on this field
        return self


class MessageTopic(_Model):
    """MQTT topic filter whose payloads are agent messages (schema: hwbridge/messages.py).

    ``sender`` names the sender of a payload that does not, as a template of the filter's
    wildcards (``{w1}``...; ``{topic}``), e.g. filter ``mas/+/out`` with sender ``{w1}`` names
    the agent by the topic's second level; ``session_id`` is the session of a payload that does
    not name one ("": the input's); ``pin`` what a payload may not choose, e.g.
    ``{session: true, kind: agent, index: daemon}``.
    """

    topic: str
    sender: str = ""
    session_id: str = ""
    pin: PinnedFields = PinnedFields()
    qos: Literal[0, 1] = 1

    def route(self) -> MessageRoute:
        topic_filter = TopicFilter(self.topic)
        sender = Template(self.sender, topic_filter.wildcards)
        return MessageRoute(topic_filter, sender, self.session_id, self.pin)

    @model_validator(mode="after")
    def _compiles(self) -> MessageTopic:
        self.route()
        return self


class BrokerConfig(_Model):
    """Where the broker is and how to prove who both sides are.

    With ``tls`` the connection is encrypted and the broker's certificate is verified against
    ``tls.ca_file`` and ``host`` (Mosquitto's TLS listener is usually port 8883); a client
    certificate in ``tls`` answers ``require_certificate true``. ``password`` is named, never
    written: ``{file: /run/secrets/mqtt-password}`` or ``{env: MQTT_PASSWORD}``, read at each
    connect so that a rotated password is used at the next one.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    # Fixed on purpose: the broker keys the persistent session (subscriptions and queued QoS 1
    # messages) on it, so a restarted bridge receives what was published while it was down.
    client_id: str = Field(default="hwbridge", min_length=1)
    keepalive_s: int = Field(default=30, ge=5)
    username: str | None = None
    password: SecretRef | None = None
    tls: ClientTLS | None = None
    # Messages the client buffers between the socket and the pipeline; must exceed the broker's
    # in-flight window (Mosquitto `max_inflight_messages`, 20 by default) or QoS 1 messages stall.
    queue_size: int = Field(default=10_000, ge=1)
    # Time an MQTT operation (connect, subscribe, publish ack) may take before it is retried.
    timeout_s: float = Field(default=5.0, gt=0)
    backoff: BackoffConfig = BackoffConfig()

    @model_validator(mode="after")
    def _password_has_a_user(self) -> BrokerConfig:
        if self.password is not None and self.username is None:
            raise ValueError("password needs a username")
        return self


class MqttInputConfig(_Model):
    broker: BrokerConfig = BrokerConfig()
    # Telemetry topics.
    mappings: tuple[TopicMapping, ...] = ()
    # Agent-message topics, read on a connection of their own (client id `<client_id>-messages`),
    # so that each kind's PUBACKs keep their order.
    messages: tuple[MessageTopic, ...] = ()
    # Join this MQTT shared-subscription group: every filter is subscribed as
    # `$share/<share_group>/<filter>`, and the broker hands each message to one member of the
    # group, so replicas split the load. Each replica keeps its own persistent session: its
    # `broker.client_id` must differ from every other member's and stay the same across its
    # restarts (`{hostname}` in it is the host's name, e.g. a StatefulSet pod's).
    share_group: str | None = Field(default=None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _has_topics(self) -> MqttInputConfig:
        if not self.mappings and not self.messages:
            raise ValueError("configure at least one topic: mappings or messages")
        return self

    @model_validator(mode="after")
    def _shares_plain_filters(self) -> MqttInputConfig:
        if self.share_group is not None and any(c in self.share_group for c in "/+#"):
            raise ValueError(
                f"share_group {self.share_group!r} may not contain '/', '+' or '#' (MQTT "
                "share names are one topic level)"
            )
        for topic in (*(m.topic for m in self.mappings), *(m.topic for m in self.messages)):
            if topic.startswith(("$share/", "$queue/")):
                raise ValueError(
                    f"topic {topic!r}: write the plain filter and set share_group; the "
                    "messages arrive on their own topics, which a $share filter never matches"
                )
        return self

    def subscription(self, topic: str) -> str:
        """What is subscribed for a configured filter: itself, or its shared form."""
        return topic if self.share_group is None else f"$share/{self.share_group}/{topic}"


class TcpFeedConfig(_Model):
    """A newline-delimited stream over TCP (market data): one payload per line, no acks."""

    name: str = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    component: str
    signal: str = "{field}"
    codec: CodecConfig = Field(default_factory=lambda: DocumentCodecConfig(prefix_field="symbol"))
    max_line_bytes: int = Field(default=65_536, ge=64)
    backoff: BackoffConfig = BackoffConfig()

    def route(self) -> Route:
        # The feed's name stands in for the topic, so templates work as for MQTT.
        return Route(TopicFilter("#"), self.component, self.signal, self.codec.build())

    @model_validator(mode="after")
    def _compiles(self) -> TcpFeedConfig:
        self.route()
        return self


class PipelineConfig(_Model):
    # Samples per sink call at most; a batch is cut earlier when no more input is waiting.
    max_batch: int = Field(default=512, ge=1)
    # Sink calls outstanding at once (pipelining over the poirotd round trip).
    max_batches_in_flight: int = Field(default=4, ge=1)
    # Larger payloads are dead-lettered without being decoded.
    max_payload_bytes: int = Field(default=1 << 20, ge=16)
    # An undecodable topic is logged at most once per this interval (with a suppressed count).
    log_interval_s: float = Field(default=60.0, gt=0)


class DeadLetterConfig(_Model):
    capacity: int = Field(default=1000, ge=1)
    # Optional JSONL copy; rotated once to `<path>.1`, so it takes at most 2 x max_file_bytes.
    path: Path | None = None
    max_file_bytes: int = Field(default=10 << 20, ge=1024)
    # Payload bytes kept per record (the rest is cut; the original length is recorded).
    max_payload_bytes: int = Field(default=4096, ge=0)


class PoirotdTlsConfig(_Model):
    """TLS to poirotd's gRPC port: the CA of its certificate (none: the system's CAs), this
    bridge's certificate and key when poirotd requires client certificates, and the name its
    certificate carries when the target's host is not that name."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None

    @model_validator(mode="after")
    def _cert_with_key(self) -> PoirotdTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class PoirotdConfig(_Model):
    target: str = "127.0.0.1:50051"
    # Further replicas (over one shared store): a stream that fails, or that a draining replica
    # ends, reconnects to the next of `target` and these, in turn, and resends what was not
    # acked there.
    failover_targets: tuple[str, ...] = ()
    # Set when poirotd's port has TLS (POIROTD_TLS_CERT_FILE).
    tls: PoirotdTlsConfig | None = None
    # A file holding the bearer token poirotd's access file grants `ingest` (kept out of here).
    token_file: Path | None = None
    # Must equal the system name of poirotd's spec; the bridge opens `session_id` under it.
    system: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    # Samples accepted but not yet durable at poirotd; callers wait when it is full.
    max_pending: int = Field(default=20_000, ge=1)
    backoff: BackoffConfig = BackoffConfig()


class BridgeConfig(_Model):
    session_id: str = Field(min_length=1)
    poirotd: PoirotdConfig
    mqtt: MqttInputConfig | None = None
    tcp_feeds: tuple[TcpFeedConfig, ...] = ()
    pipeline: PipelineConfig = PipelineConfig()
    dead_letter: DeadLetterConfig = DeadLetterConfig()

    @model_validator(mode="after")
    def _has_input(self) -> BridgeConfig:
        if self.mqtt is None and not self.tcp_feeds:
            raise ValueError("configure at least one input: mqtt or tcp_feeds")
        return self


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and every problem."""


def load_config(path: Path) -> BridgeConfig:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    try:
        return BridgeConfig.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(
            f"{path}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(problems) from exc
