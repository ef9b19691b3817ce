"""MQTT over TLS with credentials, against a real Mosquitto TLS listener that requires a client
certificate and a password (`require_certificate true`, `allow_anonymous false`): the daemon's
input and the standalone bridge ingest and acknowledge; a wrong password, a missing or foreign
client certificate and an untrusted broker are each refused with a reason that says which, counted
in poirot_mqtt_connection_failures_total, and retried while the daemon serves on."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
import trustme
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hwbridge.config import BrokerConfig
from hwbridge.mqtt_failures import REASONS
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import BRIDGE_CLINIC
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from tests.support.bridge import bridge_config, hwbridge, stop, stored
from tests.support.daemon import in_process_daemon
from tests.support.gait import SAMPLES, counter, publish_gait, spec, stored_samples
from tests.support.mosquitto import Mosquitto
from tests.support.waiting import eventually

USER, PASSWORD = "poirotd", "correct horse battery staple"


@dataclass(frozen=True)
class Pki:
    """Files of a CA that signed the broker's and the client's certificates, and of a second,
    unrelated CA with a client certificate of its own."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path
    password: Path
    wrong_password: Path


def _write(folder: Path, name: str, blob: trustme.Blob) -> Path:
    path = folder / name
    blob.write_to_path(str(path))
    return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    folder = tmp_path / "pki"
    folder.mkdir()
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client, stranger = ca.issue_cert("poirotd-input"), other.issue_cert("poirotd-input")
    password = folder / "mqtt-password"
    password.write_text(PASSWORD + "\n")  # as `echo ... > file` leaves it
    wrong_password = folder / "wrong-password"
    wrong_password.write_text("Tr0ub4dor&3")
    return Pki(
        ca=_write(folder, "ca.crt", ca.cert_pem),
        server_cert=_write(folder, "server.crt", server.cert_chain_pems[0]),
        server_key=_write(folder, "server.key", server.private_key_pem),
        client_cert=_write(folder, "client.crt", client.cert_chain_pems[0]),
        client_key=_write(folder, "client.key", client.private_key_pem),
        other_ca=_write(folder, "other-ca.crt", other.cert_pem),
        other_client_cert=_write(folder, "other-client.crt", stranger.cert_chain_pems[0]),
        other_client_key=_write(folder, "other-client.key", stranger.private_key_pem),
        password=password,
        wrong_password=wrong_password,
    )


class TlsMosquitto(Mosquitto):
    """The tests' broker with its one listener on TLS: a client certificate from the test CA and
    a user from a password file made by mosquitto_passwd are both required."""

    def __init__(self, folder: Path, pki: Pki) -> None:
        super().__init__(folder)
        passwords = folder / "passwords"
        subprocess.run(
            ["mosquitto_passwd", "-c", "-b", str(passwords), USER, PASSWORD],
            check=True,
            capture_output=True,
        )
        with self.conf.open("a") as conf:
            # Listener options apply to the last `listener` line, the only one; the last
            # allow_anonymous wins.
            conf.write(
                f"cafile {pki.ca}\n"
                f"certfile {pki.server_cert}\n"
                f"keyfile {pki.server_key}\n"
                "require_certificate true\n"
                "allow_anonymous false\n"
                f"password_file {passwords}\n"
            )


@pytest.fixture
def tls_mosquitto(tmp_path: Path, pki: Pki) -> Iterator[TlsMosquitto]:
    for binary in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(binary) is None:
            pytest.skip(f"`{binary}` is not installed (Debian package `mosquitto`)")
    broker = TlsMosquitto(tmp_path / "mosquitto", pki)
    broker.start()
    yield broker
    broker.stop()


def secure(pki: Pki, **changes: Any) -> dict[str, Any]:
    """The broker settings that pass: TLS with the test CA and client certificate, password
    from its file. `changes` override (None removes a field)."""
    broker: dict[str, Any] = {
        "username": USER,
        "password": {"file": str(pki.password)},
        "tls": client_tls(pki.ca, pki.client_cert, pki.client_key),
    }
    broker.update(changes)
    return {k: v for k, v in broker.items() if v is not None}


def tls_spec(mosquitto: Mosquitto, broker: dict[str, Any]) -> SystemSpec:
    data = spec(mosquitto).model_dump(mode="json")
    # Room for a TLS handshake on a busy machine: a CONNACK later than this counts as timeout.
    data["inputs"]["mqtt"]["broker"].update(broker, timeout_s=2.0)
    return SystemSpec.model_validate(data)


@pytest.fixture
def publisher_broker(tls_mosquitto: TlsMosquitto, pki: Pki) -> BrokerConfig:
    """How the simulator connects: the same credentials, its own client id."""
    data = secure(pki, port=tls_mosquitto.port, client_id="simulator", timeout_s=5.0)
    return BrokerConfig.model_validate(data)


def failures(daemon: Daemon) -> dict[str, float]:
    registry = daemon.metrics.registry
    name = "poirot_mqtt_connection_failures_total"
    return {r: registry.get_sample_value(name, {"reason": r}) or 0.0 for r in REASONS}


async def serving(daemon: Daemon) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@contextlib.asynccontextmanager
async def daemon_reading(
    tmp_path: Path, mosquitto: Mosquitto, broker: dict[str, Any]
) -> AsyncIterator[Daemon]:
    spec_ = tls_spec(mosquitto, broker)
    async with in_process_daemon(tmp_path, spec_, ScriptedBackend(schema_answer)) as daemon:
        yield daemon


async def test_the_input_ingests_over_tls_with_a_client_certificate_and_a_password(
    tls_mosquitto: TlsMosquitto, pki: Pki, publisher_broker: BrokerConfig, tmp_path: Path
) -> None:
    async with daemon_reading(tmp_path, tls_mosquitto, secure(pki)) as daemon:
        async with asyncio.timeout(10):
            await eventually(lambda: counter(daemon, "connects") >= 1)
        await publish_gait(tls_mosquitto, broker=publisher_broker)
        async with asyncio.timeout(30):
            await eventually(lambda: stored_samples(daemon) == SAMPLES)
            # Each PUBACK was sent once its samples were committed.
            await eventually(
                lambda: counter(daemon, "messages_acked") == counter(daemon, "messages_received")
            )
        assert counter(daemon, "samples_committed") == SAMPLES
        # None refused (a timeout is only the machine being slow, and is retried).
        assert {r for r, n in failures(daemon).items() if n} <= {"timeout"}


def client_tls(ca: Path, cert: Path | None = None, key: Path | None = None) -> dict[str, Any]:
    return {"ca_file": str(ca), "cert_file": cert and str(cert), "key_file": key and str(key)}


# case: (the daemon's broker settings, the reason counted, what the log line says)
REFUSALS: dict[str, tuple[Callable[[Pki], dict[str, Any]], str, str]] = {
    "wrong_password": (
        lambda pki: secure(pki, password={"file": str(pki.wrong_password)}),
        "not_authorized",
        "Not authorized",
    ),
    "no_client_certificate": (
        lambda pki: secure(pki, tls=client_tls(pki.ca)),
        "tls_handshake",
        "certificate required",
    ),
    "client_certificate_of_another_ca": (
        lambda pki: secure(
            pki, tls=client_tls(pki.ca, pki.other_client_cert, pki.other_client_key)
        ),
        "tls_handshake",
        "unknown ca",
    ),
    "broker_certificate_from_an_untrusted_ca": (
        lambda pki: secure(pki, tls=client_tls(pki.other_ca, pki.client_cert, pki.client_key)),
        "tls_server_unverified",
        "the broker's certificate was not accepted",
    ),
    "password_file_missing": (
        lambda pki: secure(pki, password={"file": str(pki.password) + ".absent"}),
        "config",
        "cannot read secret file",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
async def test_a_refused_connection_is_logged_counted_and_retried_while_the_daemon_serves(
    case: str, tls_mosquitto: TlsMosquitto, pki: Pki, tmp_path: Path
) -> None:
    settings, reason, says = REFUSALS[case]
    with structlog.testing.capture_logs() as events:
        async with daemon_reading(tmp_path, tls_mosquitto, settings(pki)) as daemon:
            async with asyncio.timeout(15):
                await eventually(lambda: failures(daemon)[reason] >= 2)  # retried
            assert await serving(daemon)
            assert counter(daemon, "connects") == 0
            # Only this reason (and, on a busy machine, a CONNACK that came late).
            assert {r for r, n in failures(daemon).items() if n} - {"timeout"} == {reason}
    failed = [e for e in events if e["event"] == "mqtt connect failed"]
    refused = [e for e in failed if e["reason"] == reason]
    assert {e["reason"] for e in failed} - {"timeout"} == {reason}, failed
    assert says in refused[0]["error"], refused[0]
    assert refused[0]["log_level"] == "error"  # someone has to act; waiting will not help
    assert PASSWORD not in repr(events)


async def test_a_corrected_password_file_is_read_at_the_next_attempt(
    tls_mosquitto: TlsMosquitto, pki: Pki, publisher_broker: BrokerConfig, tmp_path: Path
) -> None:
    pki.password.write_text("an old password\n")
    async with daemon_reading(tmp_path, tls_mosquitto, secure(pki)) as daemon:
        async with asyncio.timeout(10):
            await eventually(lambda: failures(daemon)["not_authorized"] >= 1)
        pki.password.write_text(PASSWORD)  # rotated, no restart
        async with asyncio.timeout(10):
            await eventually(lambda: counter(daemon, "connects") >= 1)
        await publish_gait(tls_mosquitto, broker=publisher_broker)
        async with asyncio.timeout(30):
            await eventually(lambda: stored_samples(daemon) == SAMPLES)


@pytest.mark.slow
@pytest.mark.timeout(300)  # about 10 s: its own waits add up to 90 s
async def test_the_standalone_bridge_forwards_over_tls_once_its_password_is_right(
    tls_mosquitto: TlsMosquitto, pki: Pki, tmp_path: Path
) -> None:
    """`python -m hwbridge run` refuses a wrong password like the daemon does and keeps trying;
    with the right one it subscribes over TLS, and the simulator (its TLS options) publishes."""
    port, log, db = free_port(), tmp_path / "hwbridge.log", tmp_path / "poirotd.db"
    config = bridge_config(tmp_path, tls_mosquitto, port)
    data = yaml.safe_load(config.read_text())
    data["mqtt"]["broker"].update(secure(pki), backoff={"initial_s": 0.05, "max_s": 0.2})
    config.write_text(yaml.safe_dump(data))
    pki.password.write_text("an old password\n")

    backend = ScriptedBackend(lambda *_: "")
    async with in_process_daemon(tmp_path, BRIDGE_CLINIC, backend, grpc_port=port):
        bridge = await hwbridge("run", "--config", str(config), log=log)
        try:
            async with asyncio.timeout(20):
                await eventually(lambda: log.read_text().count('"not_authorized"') >= 2)
            pki.password.write_text(PASSWORD)
            async with asyncio.timeout(20):
                await eventually(lambda: "mqtt subscribed" in log.read_text())
            simulator = await hwbridge(
                *("simulate", "exo", "--broker", f"127.0.0.1:{tls_mosquitto.port}"),
                *("--patient", "p7", "--rate", "1500", "--duration", "1", "--seed", "4"),
                *("--fault", "proprioception_score:offset:magnitude=-4"),
                *("--username", USER, "--password-file", str(pki.password)),
                *("--ca-file", str(pki.ca), "--cert-file", str(pki.client_cert)),
                *("--key-file", str(pki.client_key)),
                log=log,
            )
            async with asyncio.timeout(20):
                assert await simulator.wait() == 0, log.read_text()
            async with asyncio.timeout(30):
                await eventually(lambda: stored(db) >= SAMPLES)
        finally:
            exit_code = await stop(bridge)
    assert exit_code == 0, log.read_text()
    assert stored(db) == SAMPLES
    assert PASSWORD not in log.read_text()
