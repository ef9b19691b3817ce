"""`python -m poirotd.cli.probe`, the health check of the container deployments, against a real
gRPC health service over mutual TLS (certificates made in the test, the files laid out as a
cert-manager Secret is: tls.crt, tls.key, ca.crt): SERVING passes; NOT_SERVING, a certificate of
another CA and a plaintext probe of a TLS port fail, saying why."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from poirotd.devtools.process import free_port


def secret(folder: Path, ca: trustme.CA, cert: trustme.LeafCert) -> dict[str, str]:
    """A cert-manager style Secret on disk, as the POIROTD_TLS_* settings name it."""
    folder.mkdir(parents=True)
    cert.cert_chain_pems[0].write_to_path(str(folder / "tls.crt"))
    cert.private_key_pem.write_to_path(str(folder / "tls.key"))
    ca.cert_pem.write_to_path(str(folder / "ca.crt"))
    return {
        "POIROTD_TLS_CERT_FILE": str(folder / "tls.crt"),
        "POIROTD_TLS_KEY_FILE": str(folder / "tls.key"),
        "POIROTD_TLS_CLIENT_CA_FILE": str(folder / "ca.crt"),
    }


@dataclass
class HealthServer:
    port: int
    servicer: health.aio.HealthServicer
    env: dict[str, str]


@pytest.fixture
async def mtls_health(tmp_path: Path) -> AsyncIterator[HealthServer]:
    """A gRPC server with the health service only, requiring client certificates of its CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    env = secret(tmp_path / "poirotd-tls", ca, cert)
    credentials = grpc.ssl_server_credentials(
        [(cert.private_key_pem.bytes(), cert.cert_chain_pems[0].bytes())],
        root_certificates=ca.cert_pem.bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    yield HealthServer(port, servicer, env)
    await server.stop(None)


async def run_probe(port: int, env: dict[str, str], *args: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POIROTD_")}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "poirotd.cli.probe", f"localhost:{port}", *args),
        env=clean | env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_the_probe_passes_over_mutual_tls_with_the_daemons_own_files(
    mtls_health: HealthServer,
) -> None:
    assert await run_probe(mtls_health.port, mtls_health.env) == (0, "")


async def test_the_probe_fails_when_the_daemon_is_not_serving(mtls_health: HealthServer) -> None:
    await mtls_health.servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    code, err = await run_probe(mtls_health.port, mtls_health.env)
    assert code == 1 and "is not serving: NOT_SERVING" in err


async def test_the_probe_asks_the_service_it_is_told(mtls_health: HealthServer) -> None:
    await mtls_health.servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await mtls_health.servicer.set("poirotd.live", health_pb2.HealthCheckResponse.SERVING)
    live = await run_probe(mtls_health.port, mtls_health.env, "--service", "poirotd.live")
    assert live == (0, "")
    code, err = await run_probe(mtls_health.port, mtls_health.env)
    assert code == 1 and "is not serving: NOT_SERVING" in err


async def test_the_probe_fails_with_another_cas_certificate_or_none(
    mtls_health: HealthServer, tmp_path: Path
) -> None:
    other = trustme.CA()
    stranger = secret(tmp_path / "other", other, other.issue_cert("localhost"))
    code, err = await run_probe(mtls_health.port, stranger)
    assert code == 1 and "UNAVAILABLE" in err
    code, err = await run_probe(mtls_health.port, {})
    assert code == 1 and "UNAVAILABLE" in err


async def test_an_unreadable_tls_file_is_named(mtls_health: HealthServer) -> None:
    env = mtls_health.env | {"POIROTD_TLS_KEY_FILE": "/nonexistent/tls.key"}
    code, err = await run_probe(mtls_health.port, env)
    assert code == 1 and "/nonexistent/tls.key" in err
