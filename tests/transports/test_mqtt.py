"""The daemon's in-process MQTT input against a real Mosquitto: simulated D2W gait with the
Sensor-X calibration fault is stored, trips a rule that opens an investigation, bad payloads are
dead-lettered and counted, and a failed commit loses nothing."""

from __future__ import annotations

import asyncio
import math
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE, STDOUT

import pytest
import yaml
from prometheus_client import generate_latest

from hwbridge.config import DeadLetterConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.config.loader import SpecError, load_spec_text
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.model import DEFAULT_MAX_ABS_VALUE, HazardEvent, Session, TelemetryBatch
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore
from poirotd.transports.mqtt import SinkStats, _PipelineSink, mqtt_input_spec
from tests.support.gait import (
    SAMPLES,
    SESSION,
    counter,
    fail_first_commit_of,
    publish_gait,
    query,
    spec,
    stored_samples,
)
from tests.support.mosquitto import Mosquitto
from tests.support.waiting import eventually

DISTINCT_SAMPLES = (
    "SELECT count(*) FROM (SELECT DISTINCT component, signal, value, measured_at"
    " FROM telemetry_samples)"
)
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture
def daemon_spec(mosquitto: Mosquitto) -> SystemSpec:
    return spec(mosquitto)


@pytest.fixture
async def mqtt_connected(daemon: Daemon) -> None:
    """Waits until the daemon's MQTT input has connected to the broker."""
    async with asyncio.timeout(10):
        await eventually(lambda: counter(daemon, "connects") >= 1)


@pytest.mark.usefixtures("mqtt_connected")
async def test_sensor_x_gait_is_stored_and_opens_an_investigation(
    daemon: Daemon, mosquitto: Mosquitto
) -> None:
    malformed = [
        ("d2w/p7/joints", b"\x00\x01\x02"),  # not a whole number of frames
        ("d2w/p7/vitals", b"{not json"),
        ("lab/ghost/raw", b"1.5"),  # decodes, but `ghost` is not a component of the clinic
    ]
    await publish_gait(mosquitto, malformed)
    async with asyncio.timeout(30):
        await eventually(lambda: stored_samples(daemon) == SAMPLES)
        await eventually(
            lambda: counter(daemon, "messages_acked") == counter(daemon, "messages_received")
        )
        await eventually(
            lambda: query(daemon, "SELECT state FROM investigations") == [("succeeded",)]
        )

    (session, trigger, reason) = query(
        daemon,
        "SELECT session_id, json_extract(record, '$.trigger.rule'),"
        " json_extract(record, '$.reason') FROM investigations",
    )[0]
    assert session == SESSION and trigger == "proprioception_implausible"
    assert "proprioception_score" in reason
    # Sensor-X: a proprioception score of 6/8 reported as 2/8.
    assert query(
        daemon,
        "SELECT value FROM telemetry_samples WHERE signal = 'proprioception_score'",
    ) == [(2.0,)]
    assert query(daemon, "SELECT json_extract(record, '$.labels.input') FROM sessions") == [
        ("mqtt",)
    ]

    assert counter(daemon, "messages_undecodable") == 2
    assert counter(daemon, "samples_refused") == 1
    assert counter(daemon, "dead_letters") == 3
    assert counter(daemon, "samples_committed") == SAMPLES
    # Batches of readings are counted by the sample, as gRPC's samples are.
    ingested = daemon.metrics.registry.get_sample_value(
        "poirot_ingest_items_total", {"kind": "telemetry"}
    )
    assert ingested == SAMPLES
    assert counter(daemon, "samples_decoded") == SAMPLES + 1
    assert counter(daemon, "messages_dropped") == counter(daemon, "input_restarts") == 0
    exposition = generate_latest(daemon.metrics.registry)
    assert b"poirot_mqtt_messages_acked_total " in exposition
    if shutil.which("promtool") is not None:
        lint = await asyncio.create_subprocess_exec(
            "promtool", "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
        )
        problems, _ = await lint.communicate(exposition)
        assert b"poirot_mqtt" not in problems, problems


@pytest.mark.usefixtures("mqtt_connected")
async def test_a_reading_dated_outside_the_allowed_times_is_dead_lettered(
    daemon: Daemon, mosquitto: Mosquitto
) -> None:
    """Found by fuzzing: this message was stored, fired the rule, and from then on every List
    and Get of its investigation answered UNKNOWN (date value out of range), across restarts."""
    inputs = mqtt_input_spec(spec(mosquitto))
    assert inputs is not None
    broker = inputs.mqtt.broker.model_copy(update={"client_id": "fuzzer"})
    ancient = b'{"ts": "0001-01-01T00:00:00+01:00", "proprioception_score": 2}'
    async with MqttPublisher(broker) as publisher:
        await publisher.publish("d2w/p7/vitals", ancient)
        await publisher.publish("d2w/p7/vitals", b'{"ts": 1767603600, "heart_rate": 71}')
    async with asyncio.timeout(10):
        await eventually(lambda: counter(daemon, "messages_acked") == 2)
    assert counter(daemon, "samples_refused") == counter(daemon, "dead_letters") == 1
    assert query(daemon, "SELECT signal FROM telemetry_samples") == [("heart_rate",)]
    assert query(daemon, "SELECT count(*) FROM investigations") == [(0,)]


@pytest.mark.usefixtures("mqtt_connected")
async def test_a_failed_commit_restarts_the_input_and_the_broker_redelivers(
    daemon: Daemon, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_first_commit_of(TelemetryBatch, monkeypatch)
    await publish_gait(mosquitto)
    async with asyncio.timeout(30):
        await eventually(lambda: query(daemon, DISTINCT_SAMPLES) == [(SAMPLES,)])
    assert counter(daemon, "input_restarts") == 1 and counter(daemon, "connects") == 2
    # At least once: batches committed after the failed one were redelivered too.
    assert stored_samples(daemon) >= SAMPLES


def test_a_mapping_to_an_undeclared_component_is_refused_with_the_spec(
    mosquitto: Mosquitto,
) -> None:
    data = spec(mosquitto).model_dump(mode="json")
    data["inputs"]["mqtt"]["mappings"][0]["component"] = "treadmill"
    text = yaml.safe_dump(data, sort_keys=False)
    with pytest.raises(SpecError, match=r":\d+: inputs: .*component 'treadmill' is not declared"):
        load_spec_text(text, checks=[mqtt_input_spec])


class _NoInvestigations:
    async def open(self, events: Sequence[HazardEvent]) -> None:
        assert not events, "the spec has no rules"


async def test_the_sink_commits_what_passes_and_dead_letters_the_rest(tmp_path: Path) -> None:
    """A stream that passed the checks skips them for its later samples, except the value."""
    store = await SqliteStore.open(tmp_path / "sink.db")
    metrics = Metrics(CLINIC.system.name)
    pipeline = IngestPipeline(
        CLINIC,
        store,
        _NoInvestigations(),
        metrics,
        batch_max=512,
        signals_per_component=8,
        max_abs_value=DEFAULT_MAX_ABS_VALUE,
    )
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    stats = SinkStats()
    scope = pipeline.scope()
    await pipeline.consume(
        [Session(session_id="s1", system=CLINIC.system.name, started_at=T0)], scope
    )
    sink = _PipelineSink(pipeline, scope, "s1", dead_letters, stats)

    def batch(*readings: tuple[str, float]) -> TelemetryBatch:
        return TelemetryBatch("s1", [(c, "hr", value, T0) for c, value in readings])

    try:
        await sink(batch(("exo", 70.0), ("exo", math.inf), ("ghost", 1.0)))
        await sink(batch(("exo", math.nan), ("exo", 71.0), ("ghost", 2.0), ("exo", 1.797e308)))
        assert sorted(r.value for r in await store.newest_readings("s1")) == [70.0, 71.0]
    finally:
        await store.close()
    assert stats.committed == 2
    assert stats.refused == dead_letters.stats.stored == 5
    refused = metrics.registry.get_sample_value(
        "poirot_ingest_refused_total", {"kind": "telemetry", "reason": "value_out_of_range"}
    )
    assert refused == 1
