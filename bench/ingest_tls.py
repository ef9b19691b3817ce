"""What locking the transports costs ingest (issue #21): bench.ingest's durable gRPC ingest and the
MQTT input's one-reading rate, each with TLS and credentials against the same without them.

    .venv/bin/python -m bench.ingest_tls            # about 3 minutes
    .venv/bin/python -m bench.ingest_tls --quick    # under a minute

Locked gRPC: the daemon serves TLS with a client CA (mTLS) and an access file; bench.agents
presents a client certificate and a bearer token that has the ingest role. Locked MQTT: the
broker's one listener is TLS with `require_certificate true`, `allow_anonymous false` and a
password file; the input and the publisher both present a client certificate and a password.
Certificates are made for the run (trustme). The plain and locked sides alternate round by
round, the order reversed every other round, as in bench.ingest. The results replace this
mode's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from bench import ingest, report
from bench.ingest import MqttCredentials, Plan, Rate, median
from bench.sections.ingest_tls import NAME, section
from poirotd.devtools.broker import mosquitto
from poirotd.observability import logs
from poirotd.observability.gc_tuning import tune_for_daemon
from poirotd.transports.security.access import new_token, token_hash

USER = "poirotd-input"


@dataclass(frozen=True)
class Locks:
    """The run's certificates, the daemon's access file and the broker's password file, and how
    each side presents them."""

    daemon: dict[str, Any]  # Settings fields
    agents: tuple[object, ...]  # bench.agents options
    broker_conf: str  # Mosquitto listener lines
    mqtt: MqttCredentials


def _pem(folder: Path, name: str, blob: trustme.Blob) -> Path:
    path = folder / name
    blob.write_to_path(str(path))
    return path


def make_locks(folder: Path) -> Locks:
    """One CA signs the daemon's, the broker's and the clients' certificates."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_file = _pem(folder, "ca.pem", ca.cert_pem)
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("bench-client")
    server_cert = _pem(folder, "server.pem", server.cert_chain_pems[0])
    server_key = _pem(folder, "server.key", server.private_key_pem)
    client_cert = _pem(folder, "client.pem", client.cert_chain_pems[0])
    client_key = _pem(folder, "client.key", client.private_key_pem)
    token = new_token()
    (folder / "token").write_text(token)
    access = {"tokens": {token_hash(token): {"name": "bench-agents", "roles": ["ingest"]}}}
    (folder / "access.json").write_text(json.dumps(access))
    password = new_token()
    (folder / "mqtt-password").write_text(password)
    passwords = folder / "mosquitto-passwords"
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(passwords), USER, password],
        check=True,
        capture_output=True,
    )
    client_files = ("--ca-file", ca_file, "--cert-file", client_cert, "--key-file", client_key)
    return Locks(
        daemon={
            "tls_cert_file": server_cert,
            "tls_key_file": server_key,
            "tls_client_ca_file": ca_file,
            "auth_file": folder / "access.json",
        },
        agents=(*client_files, "--token-file", folder / "token"),
        broker_conf=(
            f"cafile {ca_file}\ncertfile {server_cert}\nkeyfile {server_key}\n"
            "require_certificate true\nallow_anonymous false\n"
            f"password_file {passwords}\n"
        ),
        mqtt=MqttCredentials(
            broker={
                "username": USER,
                "password": {"file": str(folder / "mqtt-password")},
                "tls": {
                    "ca_file": str(ca_file),
                    "cert_file": str(client_cert),
                    "key_file": str(client_key),
                },
            },
            publisher_args=(
                *client_files,
                *("--username", USER, "--password-file", folder / "mqtt-password"),
            ),
        ),
    )


def plan(mode: str) -> Plan:
    """bench.ingest's two measurements in their own sizes: each side a few seconds long in the
    full run (a side of a second moves by a quarter with the machine's other tenants), or a
    smoke size for the test (every path once, figures meaningless)."""
    if mode == "smoke":
        return Plan("smoke", 1, 500, 0.0, 2, 200, 0.0, ())
    if mode == "quick":
        return Plan("quick", 3, 30_000, 0.0, 4, 15_000, 0.0, ())
    return Plan("full", 7, 100_000, 0.0, 4, 50_000, 0.0, ())


@dataclass
class Pair:
    """Rates of the plain and the locked side, round by round."""

    plain: list[Rate]
    locked: list[Rate]

    def summary(self) -> dict[str, Any]:
        return {
            "plain": median([x.per_second for x in self.plain]),
            "locked": median([x.per_second for x in self.locked]),
            "ratios": [
                lk.per_second / pl.per_second
                for pl, lk in zip(self.plain, self.locked, strict=True)
            ],
            "plain_us": median([_cpu_us(x) for x in self.plain]),
            "locked_us": median([_cpu_us(x) for x in self.locked]),
            "plain_cpu": median([x.meter.cpu_share for x in self.plain]),
            "locked_cpu": median([x.meter.cpu_share for x in self.locked]),
            "plain_client_cpu": median([x.generator_cpu for x in self.plain]),
            "locked_client_cpu": median([x.generator_cpu for x in self.locked]),
        }


def _cpu_us(rate: Rate) -> float:
    """This process's CPU (the daemon's) per message, in µs."""
    return 1e6 * rate.meter.cpu_share / rate.per_second


Side = Callable[[Path], Awaitable[Rate]]


async def alternating(rounds: int, folder: Path, plain: Side, locked: Side) -> Pair:
    """Each round measures both sides, each in a folder of its own; odd rounds locked first."""
    pair = Pair([], [])
    for r in range(rounds):
        sides = [("plain", plain, pair.plain), ("locked", locked, pair.locked)]
        for name, measure, rates in sides if r % 2 == 0 else sides[::-1]:
            where = folder / f"{r}-{name}"
            where.mkdir(parents=True)
            rates.append(await measure(where))
    return pair


async def run(p: Plan, folder: Path) -> dict[str, Any]:
    locks = make_locks(folder / "pki")

    async def grpc_plain(where: Path) -> Rate:
        return await ingest.grpc_ingest(p, where)

    async def grpc_locked(where: Path) -> Rate:
        return await ingest.grpc_ingest(p, where, locks.daemon, locks.agents)

    async def mqtt_plain(where: Path) -> Rate:
        with mosquitto() as port:
            return await ingest.daemon_input(port, p.mqtt_messages, where, ingest.SAMPLE)

    async def mqtt_locked(where: Path) -> Rate:
        with mosquitto(locks.broker_conf) as port:
            return await ingest.daemon_input(
                port, p.mqtt_messages, where, ingest.SAMPLE, locks.mqtt
            )

    print("[bench] grpc", flush=True)
    grpc = await alternating(p.rounds, folder / "grpc", grpc_plain, grpc_locked)
    print("[bench] mqtt", flush=True)
    mqtt = await alternating(p.rounds, folder / "mqtt", mqtt_plain, mqtt_locked)
    return {"grpc": grpc.summary(), "mqtt": mqtt.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 shorter rounds")
    report.add_no_write(parser)
    args = parser.parse_args()
    logs.configure("warning", "json")
    tune_for_daemon()  # as bench.ingest: the daemon's collector setting, both sides alike
    p = plan("quick" if args.quick else "full")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-tls-") as tmp:
        results = asyncio.run(ingest.until_signalled(run(p, Path(tmp))))
    report.publish(f"{NAME} {p.mode}", section(p, results), write=not args.no_write)


if __name__ == "__main__":
    main()
