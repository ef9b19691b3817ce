"""The metrics port over HTTPS: client certificates, the `metrics` role, rotation, and a client
that connects and says nothing."""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from poirotd.daemon import Daemon
from tests.support.pki import (
    SERVER_NAME,
    Pem,
    Pki,
    issue,
    issue_names,
    locked_daemon,
    replace_file,
)

SCRAPER = "prometheus.monitoring.test"


def scrape(
    daemon: Daemon, trusted: trustme.CA, pem: Pem | None = None, token: str | None = None
) -> tuple[int, str]:
    """GET /metrics as Prometheus does (resolving the server name to loopback)."""
    context = ssl.create_default_context()
    trusted.configure_trust(context)
    if pem is not None:
        folder = Path(daemon.settings.db_path).parent
        cert, key = folder / "scraper.pem", folder / "scraper.key"
        cert.write_bytes(pem.cert)
        key.write_bytes(pem.key)
        context.load_cert_chain(cert, key)
    context.check_hostname = False  # the certificate names SERVER_NAME; we dial 127.0.0.1
    request = urllib.request.Request(f"https://127.0.0.1:{daemon.metrics_port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_scrapes_need_a_certificate_the_client_ca_signed(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    async with locked_daemon(tmp_path, pki, tls_client_ca_file=pki.ca_file) as daemon:
        status, body = await asyncio.to_thread(scrape, daemon, pki.ca, issue(pki.ca, SCRAPER))
        assert status == 200 and "poirot_build_info" in body
        for pem in (None, issue(trustme.CA(), SCRAPER), issue(pki.ca, SCRAPER, expired=True)):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                await asyncio.to_thread(scrape, daemon, pki.ca, pem)
        # Plain HTTP is not served either.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(
                urllib.request.urlopen, f"http://127.0.0.1:{daemon.metrics_port}/metrics", None, 5
            )


async def test_with_an_access_file_a_scrape_needs_the_metrics_role(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access(
        {"scrape-token": ("prometheus", ["metrics"]), "reader-token": ("dashboard", ["reader"])},
        {SCRAPER: ("prometheus-mtls", ["metrics"])},
    )
    async with locked_daemon(tmp_path, pki, auth_file=pki.auth_file) as daemon:
        assert (await asyncio.to_thread(scrape, daemon, pki.ca, None, "scrape-token"))[0] == 200
        status, body = await asyncio.to_thread(scrape, daemon, pki.ca)
        assert status == 401 and "no credentials" in body
        status, body = await asyncio.to_thread(scrape, daemon, pki.ca, None, "reader-token")
        assert status == 403 and "needs the role 'metrics'" in body
        status, body = await asyncio.to_thread(scrape, daemon, pki.ca, None, "stolen?")
        assert status == 401
        _, body = await asyncio.to_thread(scrape, daemon, pki.ca, None, "scrape-token")
    assert 'poirot_auth_denials_total{reason="missing_role",rpc="GET /metrics"} 1.0' in body
    assert 'poirot_auth_denials_total{reason="unknown_token",rpc="GET /metrics"} 1.0' in body


async def test_a_scrape_by_client_certificate_name(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({}, {SCRAPER: ("prometheus", ["metrics"])})
    async with locked_daemon(
        tmp_path, pki, auth_file=pki.auth_file, tls_client_ca_file=pki.ca_file
    ) as daemon:
        status, _ = await asyncio.to_thread(scrape, daemon, pki.ca, issue(pki.ca, SCRAPER))
        assert status == 200
        status, body = await asyncio.to_thread(scrape, daemon, pki.ca, issue(pki.ca, "x.test"))
        assert status == 401 and "not in the access file" in body


async def test_a_scraper_is_known_by_its_uri_san_never_by_cn_or_email(tmp_path: Path) -> None:
    """Issue 29, on an HTTP transport: a CN or an email SAN spelling the mapped SPIFFE ID is
    refused."""
    pki = Pki.create(tmp_path / "pki")
    scraper_id = "spiffe://poirotd.local/prometheus"
    pki.write_access({}, {scraper_id: ("prometheus", ["metrics"])})
    laptop = x509.DNSName("intern-laptop.example")
    async with locked_daemon(
        tmp_path, pki, auth_file=pki.auth_file, tls_client_ca_file=pki.ca_file
    ) as daemon:
        for impostor in (
            issue_names(pki.ca, [laptop], common_name=scraper_id),
            issue_names(pki.ca, [laptop, x509.RFC822Name(scraper_id)]),
        ):
            status, body = await asyncio.to_thread(scrape, daemon, pki.ca, impostor)
            assert status == 401 and "not in the access file" in body
        genuine = issue_names(pki.ca, [laptop, x509.UniformResourceIdentifier(scraper_id)])
        status, _ = await asyncio.to_thread(scrape, daemon, pki.ca, genuine)
        assert status == 200


async def test_a_silent_connection_does_not_stop_scrapes(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    async with locked_daemon(tmp_path, pki) as daemon:
        with socket.create_connection(("127.0.0.1", daemon.metrics_port)):
            await asyncio.sleep(0.2)  # the server has accepted it; it never shakes hands
            status, _ = await asyncio.to_thread(scrape, daemon, pki.ca)
        assert status == 200


async def test_a_renewed_certificate_is_served_on_the_metrics_port_without_a_restart(
    tmp_path: Path,
) -> None:
    pki = Pki.create(tmp_path / "pki")
    async with locked_daemon(tmp_path, pki) as daemon:
        assert (await asyncio.to_thread(scrape, daemon, pki.ca))[0] == 200
        renewed_ca = trustme.CA()
        renewed = issue(renewed_ca, SERVER_NAME)
        replace_file(pki.key_file, renewed.key)
        replace_file(pki.cert_file, renewed.cert)
        assert (await asyncio.to_thread(scrape, daemon, renewed_ca))[0] == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError)):
            await asyncio.to_thread(scrape, daemon, pki.ca)
