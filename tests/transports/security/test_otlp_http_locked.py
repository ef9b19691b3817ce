"""OTLP/HTTP locked like the other transports: TLS from the daemon's certificate (followed on
rotation), the `ingest` role under an access file, and no unlocked bind beyond loopback."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trustme

from poirotd.config import Settings
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, live_export
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.security.exposure import InsecureBindError, check_exposure
from tests.support.daemon import in_process_daemon
from tests.support.pki import SERVER_NAME, Pki, issue, replace_file

PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture
async def locked(tmp_path: Path) -> AsyncIterator[tuple[Daemon, Pki]]:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access(
        {"bridge-token": ("otel-collector", ["ingest"]), "reader-token": ("grafana", ["reader"])},
        {},
    )
    async with in_process_daemon(
        tmp_path,
        SPEC,
        ScriptedBackend(schema_answer),
        tls_cert_file=pki.cert_file,
        tls_key_file=pki.key_file,
        auth_file=pki.auth_file,
        otlp_http_port=free_port(),
    ) as daemon:
        yield daemon, pki


async def post(
    daemon: Daemon, ca: trustme.CA, token: str | None, conversation: str
) -> httpx.Response:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    context.check_hostname = False  # the certificate names SERVER_NAME; we dial 127.0.0.1
    headers = PROTOBUF | ({"Authorization": f"Bearer {token}"} if token else {})
    async with httpx.AsyncClient(verify=context, timeout=10) as http:
        return await http.post(
            f"https://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces",
            content=live_export(conversation).SerializeToString(),
            headers=headers,
        )


def denials(daemon: Daemon, reason: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_auth_denials_total", {"rpc": "POST /v1/traces", "reason": reason}
    )
    return value or 0.0


async def test_an_export_needs_the_ingest_role(locked: tuple[Daemon, Pki]) -> None:
    daemon, pki = locked
    assert (await post(daemon, pki.ca, "bridge-token", "conv-ok")).status_code == 200
    anonymous = await post(daemon, pki.ca, None, "conv-anon")
    assert anonymous.status_code == 401 and "Bearer" in anonymous.headers["WWW-Authenticate"]
    reader = await post(daemon, pki.ca, "reader-token", "conv-reader")
    assert reader.status_code == 403 and "needs the role 'ingest'" in reader.text
    assert denials(daemon, "no_credentials") == 1 and denials(daemon, "missing_role") == 1
    store = daemon._store
    assert store is not None
    assert await store.get_session("conv-ok") is not None
    assert await store.get_session("conv-anon") is None
    assert await store.get_session("conv-reader") is None


async def test_plain_http_is_not_served_and_a_renewed_certificate_is(
    locked: tuple[Daemon, Pki],
) -> None:
    daemon, pki = locked
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=5) as http:
            await http.post(
                f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces",
                content=live_export().SerializeToString(),
                headers=PROTOBUF | {"Authorization": "Bearer bridge-token"},
            )
    renewed_ca = trustme.CA()
    renewed = issue(renewed_ca, SERVER_NAME)
    replace_file(pki.key_file, renewed.key)
    replace_file(pki.cert_file, renewed.cert)
    assert (await post(daemon, renewed_ca, "bridge-token", "conv-renewed")).status_code == 200
    with pytest.raises(httpx.ConnectError):
        await post(daemon, pki.ca, "bridge-token", "conv-old-ca")


def test_an_unlocked_otlp_port_beyond_loopback_is_refused() -> None:
    with pytest.raises(InsecureBindError, match=r"POIROTD_OTLP_HTTP_HOST=0\.0\.0\.0"):
        check_exposure(Settings(otlp_http_port=4318, otlp_http_host="0.0.0.0"))
    # Off, its host does not matter.
    assert check_exposure(Settings(otlp_http_host="0.0.0.0")) == ()


async def test_a_logs_export_needs_the_ingest_role_too(locked: tuple[Daemon, Pki]) -> None:
    """POST /v1/logs is its own call under the access policy, with the traces' role."""
    from tests.support.otlp_log_runs import LOG_RUNS, recorded_logs

    daemon, pki = locked
    context = ssl.create_default_context()
    pki.ca.configure_trust(context)
    context.check_hostname = False
    body = recorded_logs(LOG_RUNS["genai"])[1].SerializeToString()
    url = f"https://127.0.0.1:{daemon.settings.otlp_http_port}/v1/logs"
    async with httpx.AsyncClient(verify=context, timeout=10) as http:
        answers = {
            token: await http.post(
                url,
                content=body,
                headers=PROTOBUF | ({"Authorization": f"Bearer {token}"} if token else {}),
            )
            for token in ("bridge-token", "reader-token", None)
        }
    assert answers["bridge-token"].status_code == 200
    assert answers[None].status_code == 401
    assert answers["reader-token"].status_code == 403
    assert "needs the role 'ingest'" in answers["reader-token"].text
    value = daemon.metrics.registry.get_sample_value(
        "poirot_auth_denials_total", {"rpc": "POST /v1/logs", "reason": "missing_role"}
    )
    assert value == 1
    assert daemon.metrics.otlp_waiting_log_records._value.get() > 0  # the ingest's records only
