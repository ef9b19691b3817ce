"""In-process MQTT input: hwbridge's pipeline feeding the daemon's own core, no gRPC hop.

The standalone bridge forwards samples to poirotd over gRPC. Here the sink is the ingest
pipeline in the daemon's event loop: the hazard rules see a sample as it arrives, and it
is stored durably before the broker gets its PUBACK (hwbridge acks a delivery only once the
sink has returned for it). hwbridge's ``Bridge``, config models, codecs and dead letters are used
as they are; this module adds the sink, a restart loop and the Prometheus view of the counters.

Session: every sample goes to the spec's ``inputs.session_id`` (see ``MqttInputSpec``), started
under this system before the first sample (a no-op when the store has it already). In the spec:

    inputs:
      session_id: d2w-session-001
      mqtt:                         # hwbridge's MqttInputConfig: broker and topic mappings
        broker:
          host: mqtt.clinic.internal
          port: 8883
          client_id: poirotd-d2w
          username: poirotd
          password: {file: /run/secrets/mqtt/password}   # or {env: NAME}; never in clear
          tls: {ca_file: /etc/poirotd/mqtt/ca.crt,       # hwbridge's BrokerConfig.tls
                cert_file: /etc/poirotd/mqtt/tls.crt, key_file: /etc/poirotd/mqtt/tls.key}
        mappings: [...]             # as in hwbridge/bridge.example.yaml
      pipeline: {max_batch: 512}    # optional, hwbridge's PipelineConfig
      dead_letter: {path: dead.jsonl}  # optional, hwbridge's DeadLetterConfig

Agent messages: the input's ``mqtt.messages`` topics (hwbridge's ``MessageTopic``, payload
schema in hwbridge/messages.py) are read on a connection of their own. A message goes to the
session its payload or topic names (else ``inputs.session_id``), started implicitly (labels
input=mqtt) if the store does not have it; without an index it is numbered by the daemon. E.g.

      mqtt:
        messages: [{topic: "mas/+/out", sender: "{w1}"}]   # agent = the topic's second level

A route may pin what a payload would otherwise choose (hwbridge's ``PinnedFields``): the session
(the route's ``session_id``, else the input's), the kind, and the index policy (``daemon``: every
message numbered by the daemon). A payload that disagrees is refused: dead-lettered, counted in
``poirot_mqtt_agent_messages_route_refused_total{field}`` (a sender other than the topic's is
too, field sender). E.g., the agents of one ICU session, each publishing on its own topic:

        messages:
          - topic: "icu7/+/out"
            sender: "{w1}"
            session_id: icu-7
            pin: {session: true, kind: agent, index: daemon}

Keys: a payload's ``seq`` (and its codec's ``key_field``) is kept under a producer scoped by the
topic it came on (``mqtt:<topic>|<producer>``): a payload can only ever name its own topic's
producers, never another's. With a broker ACL that lets each agent publish on its own topic only
(Mosquitto ``pattern write icu7/%u/out``) that is the agent's broker identity.

Samples and messages the daemon refuses (a templated component that is not declared, a sender
that is not an agent) are dead-lettered like undecodable payloads and acked: retrying cannot
make them valid. A delivery is acked (PUBACK) once its items are committed. A failed commit
(the store raised) stops the bridge with nothing from that batch on acked; the input logs, waits
(the broker's backoff) and starts a new bridge, to which the broker redelivers what was not
acked. Stopping cancels the bridge the same way. Delivery is therefore at least once: batches
in flight at a stop or failure may come again, never lost; a payload with its producer's key
(codec ``key_field``, a message's ``seq``) is then stored once (an agent message with its own
index is too).

A connection to the broker that fails (a wrong password, an untrusted certificate, the broker
down) is logged with its reason, counted in ``poirot_mqtt_connection_failures_total{reason}``
and retried with the broker's backoff; the daemon serves everything else meanwhile.

Memory stays bounded under any burst: the input stops reading from the broker while its client
buffer (``mqtt.broker.queue_size`` messages) is nearly full, and holds at most
``pipeline.max_batch`` undecoded deliveries plus ``pipeline.max_batches_in_flight`` batches of
samples; the backlog waits, un-acked, at the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from hwbridge.backoff import Backoff
from hwbridge.bridge import Bridge
from hwbridge.config import (
    BridgeConfig,
    DeadLetterConfig,
    MqttInputConfig,
    PipelineConfig,
    PoirotdConfig,
)
from hwbridge.deadletter import DeadLetterStore
from hwbridge.messages import PINNABLE, ReceivedMessage
from hwbridge.mqtt_failures import REASONS
from poirotd.config import SystemSpec
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.ingest.sessions import ImplicitSessions
from poirotd.ingest.validation import IngestScope
from poirotd.model import CommitItem, Session, TelemetryBatch, sample_of

log = structlog.get_logger(__name__)

# (metric name without _total, counter key, help). Keys are hwbridge's InputStats and MqttStats
# fields, plus this module's own.
_COUNTERS = (
    ("poirot_mqtt_messages_received", "received", "MQTT messages received by the input"),
    (
        "poirot_mqtt_messages_acked",
        "acked",
        "MQTT messages acknowledged (PUBACK) after their samples were committed",
    ),
    (
        "poirot_mqtt_messages_undecodable",
        "undecodable",
        "MQTT messages dead-lettered undecoded: bad payload, too large, or no mapping",
    ),
    (
        "poirot_mqtt_messages_dropped",
        "dropped",
        "MQTT messages the client discarded because its buffer was full",
    ),
    (
        "poirot_mqtt_read_pauses",
        "paused",
        "Times the input stopped reading from the broker because its buffer was nearly full",
    ),
    ("poirot_mqtt_samples_decoded", "decoded", "Samples decoded from MQTT payloads"),
    (
        "poirot_mqtt_samples_committed",
        "committed",
        "MQTT samples stored durably and evaluated by the hazard rules",
    ),
    (
        "poirot_mqtt_samples_refused",
        "refused",
        "MQTT samples the daemon refused (e.g. an undeclared component), dead-lettered",
    ),
    (
        "poirot_mqtt_agent_messages_received",
        "messages_received",
        "MQTT messages received on agent-message topics",
    ),
    (
        "poirot_mqtt_agent_messages_undecodable",
        "messages_undecodable",
        "Agent-message payloads dead-lettered undecoded: not the schema, too large, no topic",
    ),
    (
        "poirot_mqtt_agent_messages_committed",
        "messages_committed",
        "Agent messages from MQTT stored durably and evaluated by the hazard rules",
    ),
    (
        "poirot_mqtt_agent_messages_refused",
        "messages_refused",
        "Agent messages from MQTT the daemon refused (e.g. a sender that is no agent), "
        "dead-lettered",
    ),
    (
        "poirot_mqtt_agent_messages_acked",
        "messages_acked",
        "Agent-message deliveries acknowledged (PUBACK) after their commit",
    ),
    ("poirot_mqtt_dead_letters", "stored", "Dead letters recorded by the MQTT input"),
    (
        "poirot_mqtt_dead_letter_write_errors",
        "write_errors",
        "Dead letters that could not be appended to the dead-letter file",
    ),
    ("poirot_mqtt_connects", "connects", "Connections to the broker that subscribed"),
    ("poirot_mqtt_input_restarts", "restarts", "Restarts of the input after a failed commit"),
)
_FAILURES = (
    "poirot_mqtt_connection_failures",
    "Connections to the broker that failed or were lost, by reason (config, unreachable, "
    "timeout, tls_server_unverified, tls_handshake, not_authorized, refused, lost)",
)
_ROUTE_REFUSALS = (
    "poirot_mqtt_agent_messages_route_refused",
    "Agent-message payloads that chose what their route decides, dead-lettered (also counted "
    "as undecodable), by field: session, kind or index a route pins, or a sender other than "
    "the topic's",
)


class MqttInputSpec(BaseModel):
    """The spec's ``inputs`` section with hwbridge's settings validated (``InputsSpec``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str = Field(min_length=1)
    mqtt: MqttInputConfig
    pipeline: PipelineConfig = PipelineConfig()
    dead_letter: DeadLetterConfig = DeadLetterConfig()

    @model_validator(mode="after")
    def _mappings_name_declared_parts(self, info: ValidationInfo) -> MqttInputSpec:
        """A mapping to a fixed undeclared component would dead-letter every sample; templated
        components ({w1}...) are only known per message and checked then."""
        parties: frozenset[str] = (info.context or {}).get("parties", frozenset())
        for i, mapping in enumerate(self.mqtt.mappings):
            if "{" not in mapping.component and mapping.component not in parties:
                raise ValueError(
                    f"mqtt.mappings[{i}] {mapping.topic!r}: component {mapping.component!r} "
                    "is not declared"
                )
        return self


class _InputsSection(BaseModel):
    """Puts ``inputs`` in front of every error location, so the loader finds their lines."""

    inputs: MqttInputSpec


def mqtt_input_spec(spec: SystemSpec) -> MqttInputSpec | None:
    """The spec's MQTT input, validated; a ValidationError locates each problem in the spec."""
    if spec.inputs is None:
        return None
    parties = frozenset(spec.agent_ids) | {c.id for c in spec.components}
    section = _InputsSection.model_validate(
        {"inputs": spec.inputs.model_dump()}, context={"parties": parties}
    )
    return section.inputs


@dataclass
class SinkStats:
    committed: int = 0
    refused: int = 0
    messages_committed: int = 0
    messages_refused: int = 0
    restarts: int = 0


class _PipelineSink:
    """One bridge run's sink: its samples go through the ingest pipeline like any producer's,
    in the run's scope (the session it started). Samples the pipeline refuses (a templated
    component that is not declared, a value that is not finite) are dead-lettered and acked:
    retrying cannot make them valid."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        scope: IngestScope,
        session_id: str,
        dead_letters: DeadLetterStore,
        stats: SinkStats,
    ) -> None:
        self._pipeline = pipeline
        self._scope = scope
        self._session_id = session_id
        self._dead_letters = dead_letters
        self._stats = stats

    async def __call__(self, batch: TelemetryBatch) -> None:
        if batch.session_id != self._session_id:
            raise ValueError(
                f"this sink stores session {self._session_id!r}, not {batch.session_id!r}"
            )
        admission = await self._pipeline.consume([batch], self._scope)
        for refusal in admission.refused:
            if refusal.row is None:  # the whole batch: the run's session is not known
                raise refusal.error
            sample = sample_of(batch.session_id, batch.rows[refusal.row])
            payload = sample.model_dump_json().encode()
            self._dead_letters.add("poirotd", str(refusal.error), payload)
        self._stats.refused += len(admission.refused)
        # Copies of stored samples (a redelivery) are counted in poirot_ingest_duplicates_total,
        # conflicts in poirot_ingest_conflicts_total.
        left_out = admission.duplicates() + admission.conflicts()
        self._stats.committed += len(batch.rows) - len(admission.refused) - left_out


class _MessageSink:
    """One bridge run's agent messages, through the pipeline in the run's scope: a session the
    store does not have is started first, a message without an index is numbered by the daemon,
    and a message the pipeline refuses is dead-lettered and acked."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        scope: IngestScope,
        sessions: ImplicitSessions,
        dead_letters: DeadLetterStore,
        stats: SinkStats,
    ) -> None:
        self._pipeline = pipeline
        self._scope = scope
        self._sessions = sessions
        self._dead_letters = dead_letters
        self._stats = stats

    async def __call__(self, batch: list[ReceivedMessage]) -> None:
        indexes = self._pipeline.indexes
        await indexes.learn(
            (r.message.session_id for r in batch if not r.numbered),
            [(r.message.session_id, r.message.index) for r in batch if r.numbered],
        )
        items: list[CommitItem] = []
        sources: list[ReceivedMessage | None] = []
        handled: set[str] = set()
        for received in batch:
            message = received.message
            if start := self._sessions.start(handled, message.session_id, message.sent_at):
                items.append(start)
                sources.append(None)
            if not received.numbered:
                message = message.model_copy(update={"index": indexes.take(message.session_id)})
            else:  # its producer's own index: number past it
                indexes.observe(message.session_id, message.index)
            items.append(message)
            sources.append(received)
        keys = [None if source is None else source.key for source in sources]
        admission = await self._pipeline.consume(items, self._scope, skip_invalid=True, keys=keys)
        refused = 0
        for refusal in admission.refused:
            source = sources[refusal.index]
            if source is None:  # a session start: its messages are refused with it
                continue
            self._dead_letters.add("poirotd", str(refusal.error), source.payload)
            refused += 1
        self._stats.messages_refused += refused
        left_out = admission.duplicates() + admission.conflicts()
        self._stats.messages_committed += len(batch) - refused - left_out


class MqttInput:
    """Runs from ``start()`` until ``stop()``; its counters are on the given registry."""

    def __init__(
        self,
        config: MqttInputSpec,
        system: str,
        pipeline: IngestPipeline,
        registry: CollectorRegistry,
    ) -> None:
        self._config = config
        self._system = system
        self._pipeline = pipeline
        self._sessions = pipeline.implicit_sessions("mqtt")
        self._bridge_config = BridgeConfig(
            session_id=config.session_id,
            # The bridge's link to poirotd: only the system name matters in-process.
            poirotd=PoirotdConfig(system=system),
            mqtt=config.mqtt,
            pipeline=config.pipeline,
            dead_letter=config.dead_letter,
        )
        self._dead_letters = DeadLetterStore(
            config.dead_letter, log_interval_s=config.pipeline.log_interval_s
        )
        self.stats = SinkStats()
        self._bridge: Bridge | None = None
        # Counts of bridges that have stopped; read by the scrape thread, hence the lock.
        self._retired: Counter[str] = Counter()
        self._retired_failures: Counter[str] = Counter()
        self._retired_refusals: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        registry.register(_MqttCollector(self))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mqtt-input")

    async def drain(self) -> None:
        """Cancels the bridge: what it has not acked stays with the broker for the next run."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def stop(self, grace: float) -> None:
        await self.drain()
        self._dead_letters.close()

    def totals(self) -> dict[str, int]:
        """Every counter since start, summed over restarts (Prometheus counters never drop)."""
        with self._lock:
            counts = self._retired.copy()
            if self._bridge is not None:
                counts.update(_bridge_counts(self._bridge))
        counts.update(asdict(self.stats))
        counts.update(asdict(self._dead_letters.stats))
        return dict(counts)

    def failures(self) -> dict[str, int]:
        """Failed and lost connections since start by reason, every reason present."""
        with self._lock:
            counts = self._retired_failures.copy()
            if self._bridge is not None and self._bridge.mqtt is not None:
                counts.update(self._bridge.mqtt.failures)
        return {reason: counts[reason] for reason in REASONS}

    def route_refusals(self) -> dict[str, int]:
        """Agent-message payloads refused by their route since start, by field, every field
        present."""
        with self._lock:
            counts = self._retired_refusals.copy()
            if self._bridge is not None and self._bridge.messages is not None:
                counts.update(self._bridge.messages.route_refusals)
        return {field: counts[field] for field in PINNABLE}

    async def _run(self) -> None:
        backoff = Backoff(self._config.mqtt.broker.backoff)
        while True:
            session = Session(
                session_id=self._config.session_id,
                system=self._system,
                started_at=datetime.now(UTC),
                labels={"input": "mqtt"},
            )
            committed_before = self.stats.committed + self.stats.messages_committed
            try:
                scope = self._pipeline.scope()
                admission = await self._pipeline.consume([session], scope)
                if admission.refused:
                    raise admission.refused[0].error
                sink = _PipelineSink(
                    self._pipeline, scope, session.session_id, self._dead_letters, self.stats
                )
                messages = _MessageSink(
                    self._pipeline, scope, self._sessions, self._dead_letters, self.stats
                )
                bridge = Bridge(self._bridge_config, sink, self._dead_letters, messages)
                with self._lock:
                    self._bridge = bridge
                await bridge.run()
            except Exception as exc:
                self.stats.restarts += 1
                log.error("mqtt input failed; restarting", error=repr(exc))
            finally:
                self._retire()
            if self.stats.committed + self.stats.messages_committed > committed_before:
                backoff.reset()
            await backoff.sleep()

    def _retire(self) -> None:
        with self._lock:
            if self._bridge is not None:
                self._retired.update(_bridge_counts(self._bridge))
                if self._bridge.mqtt is not None:
                    self._retired_failures.update(self._bridge.mqtt.failures)
                if self._bridge.messages is not None:
                    self._retired_refusals.update(self._bridge.messages.route_refusals)
                self._bridge = None


def _bridge_counts(bridge: Bridge) -> dict[str, int]:
    """The MQTT pipelines' and clients' counters (the dead letters outlive bridges); the
    agent-message topics' as messages_*, but for their client's, summed with telemetry's."""
    stats = bridge.stats()
    counts = Counter({**stats.get("input.mqtt", {}), **stats.get("mqtt", {})})
    for key, value in stats.get("input.mqtt_messages", {}).items():
        counts[f"messages_{key}"] += value
    counts.update(stats.get("mqtt_messages", {}))
    return dict(counts)


class _MqttCollector(Collector):
    """Reads the input's counters at scrape time: hwbridge keeps plain ints, and the daemon's
    Metrics is not the place for an optional input's families."""

    def __init__(self, mqtt_input: MqttInput) -> None:
        self._input = mqtt_input

    def collect(self) -> Iterable[CounterMetricFamily]:
        totals = self._input.totals()
        for name, key, documentation in _COUNTERS:
            yield CounterMetricFamily(name, documentation, value=totals.get(key, 0))
        failures = CounterMetricFamily(*_FAILURES, labels=["reason"])
        for reason, count in self._input.failures().items():
            failures.add_metric([reason], count)
        yield failures
        refusals = CounterMetricFamily(*_ROUTE_REFUSALS, labels=["field"])
        for field, count in self._input.route_refusals().items():
            refusals.add_metric([field], count)
        yield refusals

    def describe(self) -> Iterable[CounterMetricFamily]:
        """Lets the registry refuse a second input registering the same names."""
        return self.collect()
