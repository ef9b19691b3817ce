"""The edge box's locks, on real parts: make-certs.sh's certificates and passwords, compose's
Mosquitto configuration run by a real Mosquitto (its container paths mapped to the files through
compose's mounts), poirotd's MQTT input settings from edge/system.yaml connecting to it, the
access file naming certificates the script issues, and compose and systemd serving TLS."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import structlog
import yaml
from cryptography import x509

from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config.loader import load_spec
from poirotd.devtools.broker import wait_listening
from poirotd.devtools.process import free_port, stop_process
from tests.support.deploy import EDGE, require_tool

ROLES = {"ingest", "reader", "operator", "auditor", "metrics"}


def _compose_service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = yaml.safe_load((EDGE / "compose.yaml").read_text())["services"][name]
    return service


def host_path(service: str, inside: str, secrets: Path) -> Path:
    """Where a path inside a compose service's container is on the host, through its bind
    mounts; ./secrets is the folder make-certs.sh filled."""
    for volume in _compose_service(service)["volumes"]:
        source, target = str(volume).split(":")[:2]
        if source.startswith(".") and (inside == target or inside.startswith(target + "/")):
            base = (
                secrets / source.removeprefix("./secrets/")
                if source.startswith("./secrets/")
                else EDGE / source
            )
            return base / inside.removeprefix(target).lstrip("/")
    raise AssertionError(f"{inside} is not in a bind mount of {service}")


def _uri_names(certificate: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.UniformResourceIdentifier))


class EdgeMosquitto:
    """compose's mosquitto.conf on free loopback ports, with the files its mounts point at."""

    def __init__(self, folder: Path, secrets: Path) -> None:
        self.tls_port, self.health_port = free_port(), free_port()
        lines = []
        for line in (EDGE / "mosquitto.conf").read_text().splitlines():
            words = line.split()
            if words[:2] == ["listener", "8883"]:
                line = f"listener {self.tls_port} 127.0.0.1"
            elif words[:2] == ["listener", "1883"]:
                line = f"listener {self.health_port} 127.0.0.1"
            elif words[:1] == ["persistence_location"]:
                line = f"persistence_location {folder}/"
            elif len(words) == 2 and words[1].startswith("/mosquitto/"):
                line = f"{words[0]} {host_path('mosquitto', words[1], secrets)}"
            lines.append(line)
        lines.append(f"user {getpass.getuser()}")
        self.conf = folder / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        # Its log goes to a file, not a pipe nobody reads (which leaked its descriptor, and
        # would stall the broker once full).
        self.log = (folder / "mosquitto.log").open("wb")
        self.process = subprocess.Popen(
            ["mosquitto", "-c", str(self.conf)], stdout=self.log, stderr=subprocess.STDOUT
        )
        for port in (self.tls_port, self.health_port):
            wait_listening(self.process, port)

    def stop(self) -> None:
        stop_process(self.process)
        self.log.close()


@pytest.fixture
def edge_mosquitto(tmp_path: Path, edge_secrets: Path) -> Iterator[EdgeMosquitto]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the `mosquitto` binary is not installed (Debian package `mosquitto`)")
    broker = EdgeMosquitto(tmp_path, edge_secrets)
    yield broker
    broker.stop()


def poirotd_broker(secrets: Path, port: int, **changes: Any) -> BrokerConfig:
    """edge/system.yaml's broker settings, its files mapped through compose's poirotd mounts;
    `localhost` instead of the compose name `mosquitto` (the certificate has both)."""
    spec = load_spec(EDGE / "system.yaml")
    assert spec.inputs is not None
    broker = dict(spec.inputs.mqtt["broker"])
    broker["password"] = {"file": host_path("poirotd", broker["password"]["file"], secrets)}
    broker["tls"] = {
        key: str(host_path("poirotd", value, secrets)) for key, value in broker["tls"].items()
    }
    broker |= {"host": "localhost", "port": port, "timeout_s": 1.0}
    broker["backoff"] = {"initial_s": 0.05, "max_s": 0.2}
    return BrokerConfig.model_validate(broker | changes)


async def published(broker: BrokerConfig, give_up: float = 15.0) -> list[str]:
    """Reasons of the failed connections while publishing one message (empty: it went through
    at once); gives up after `give_up` seconds."""
    with structlog.testing.capture_logs() as events:
        try:
            async with asyncio.timeout(give_up), MqttPublisher(broker) as publisher:
                await publisher.publish("d2w/p1/vitals", b'{"heart_rate": 71}')
        except TimeoutError:
            pass
    return [e["reason"] for e in events if e["event"] == "mqtt connect failed"]


async def test_the_edge_broker_admits_poirotd_and_the_exoskeleton_and_nobody_else(
    edge_mosquitto: EdgeMosquitto, edge_secrets: Path
) -> None:
    port = edge_mosquitto.tls_port
    assert await published(poirotd_broker(edge_secrets, port)) == []
    exo = edge_secrets / "exo"
    exo_broker = poirotd_broker(
        edge_secrets,
        port,
        username="exo",
        password={"file": str(exo / "mqtt-password")},
        tls={
            k: str(exo / f)
            for k, f in (("ca_file", "ca.crt"), ("cert_file", "tls.crt"), ("key_file", "tls.key"))
        },
    )
    assert await published(exo_broker) == []

    no_password = poirotd_broker(edge_secrets, port, username=None, password=None)
    assert set(await published(no_password, give_up=3)) == {"not_authorized"}
    no_certificate = poirotd_broker(edge_secrets, port, tls={"ca_file": str(exo / "ca.crt")})
    assert set(await published(no_certificate, give_up=3)) == {"tls_handshake"}
    plaintext = poirotd_broker(edge_secrets, port, tls=None)
    assert set(await published(plaintext, give_up=3)) == {"timeout"}


def test_the_mosquitto_healthcheck_passes_on_the_loopback_listener(
    edge_mosquitto: EdgeMosquitto,
) -> None:
    mosquitto_sub = require_tool("mosquitto_sub")
    test = _compose_service("mosquitto")["healthcheck"]["test"]
    assert test[:2] == ["CMD", "mosquitto_sub"]
    command = [mosquitto_sub, *(arg.replace("$$", "$") for arg in test[2:])]
    port = ["-p", str(edge_mosquitto.health_port)]
    assert subprocess.run(command + port, capture_output=True, timeout=10).returncode == 0


async def test_the_anonymous_loopback_listener_reads_sys_and_nothing_else(
    edge_mosquitto: EdgeMosquitto, edge_secrets: Path
) -> None:
    """What the healthcheck's listener allows (its ACL): $SYS, read only. Telemetry published
    over TLS does not reach an anonymous subscriber."""
    received: list[str] = []
    async with aiomqtt.Client("127.0.0.1", edge_mosquitto.health_port, timeout=15) as client:
        await client.subscribe([("$SYS/broker/uptime", 0), ("d2w/#", 0)])
        assert await published(poirotd_broker(edge_secrets, edge_mosquitto.tls_port)) == []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                async for message in client.messages:
                    received.append(message.topic.value)
    assert set(received) == {"$SYS/broker/uptime"}


def test_compose_poirotd_serves_tls_with_the_files_make_certs_makes(edge_secrets: Path) -> None:
    poirotd = _compose_service("poirotd")
    env = poirotd["environment"]
    assert "POIROTD_ALLOW_INSECURE_BIND" not in env
    for setting in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE", "AUTH_FILE"):
        path = host_path("poirotd", env[f"POIROTD_{setting}"], edge_secrets)
        assert path.is_file(), setting
    assert env["POIROTD_GRPC_REFLECTION"] == "false"
    # The image's own defaults point at the same files.
    assert env["POIROTD_TLS_CERT_FILE"] == "/run/secrets/poirotd/tls/tls.crt"
    server = x509.load_pem_x509_certificate(
        host_path("poirotd", env["POIROTD_TLS_CERT_FILE"], edge_secrets).read_bytes()
    )
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # Prometheus' server_name, the probe's localhost.
    assert {"poirotd", "localhost"} <= set(names.get_values_for_type(x509.DNSName))
    prometheus = yaml.safe_load((EDGE / "prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "poirotd"]
    assert job["scheme"] == "https" and job["tls_config"]["server_name"] == "poirotd"


def test_the_edge_access_file_names_certificates_the_script_issues(edge_secrets: Path) -> None:
    access = yaml.safe_load((EDGE / "access" / "access.yaml").read_text())
    issued = {
        name: _uri_names(edge_secrets / name / "tls.crt")
        for name in ("mas", "prometheus", "control")
    }
    assert set(access["certificates"]) == set().union(*issued.values())
    for grant in access["certificates"].values():
        assert set(grant["roles"]) <= ROLES
    roles = {grant["name"]: set(grant["roles"]) for grant in access["certificates"].values()}
    assert roles == {
        "mas": {"ingest"},
        "prometheus": {"metrics"},
        "control": {"operator", "reader"},
    }
    assert access["tokens"] == {}


def test_make_certs_keeps_its_ca_and_passwords_and_renews_the_rest(edge_secrets: Path) -> None:
    """Run again (a rotation): same CA and passwords, new leaf keys, files for their owner."""
    before = {p: p.read_bytes() for p in edge_secrets.rglob("*") if p.is_file()}
    subprocess.run(
        ["bash", str(EDGE / "make-certs.sh"), str(edge_secrets)], check=True, capture_output=True
    )
    kept = ["ca/ca.crt", "ca/ca.key", "poirotd/mqtt-password", "exo/mqtt-password"]
    for name in kept:
        assert (edge_secrets / name).read_bytes() == before[edge_secrets / name], name
    assert (edge_secrets / "poirotd/tls/tls.key").read_bytes() != before[
        edge_secrets / "poirotd/tls/tls.key"
    ]
    for path in (p for p in edge_secrets.rglob("*") if p.is_file()):
        assert path.stat().st_mode & 0o077 == 0, path


def test_the_systemd_unit_serves_tls_and_authentication() -> None:
    text = (EDGE / "poirotd.service").read_text()
    settings = dict(
        line.removeprefix("Environment=").split("=", 1)
        for line in text.splitlines()
        if line.startswith("Environment=")
    )
    for setting in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE", "AUTH_FILE"):
        assert settings[f"POIROTD_{setting}"].startswith("/etc/poirotd/"), setting
    assert "POIROTD_ALLOW_INSECURE_BIND" not in text


def test_the_edge_spec_passes_the_daemons_own_checks() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "poirotd", "check-config", str(EDGE / "system.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
