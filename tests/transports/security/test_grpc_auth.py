"""TLS, client certificates, tokens and roles on the gRPC port, over real TLS on loopback with
certificates made in each test."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog
import trustme
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import DaemonTls, open_channel
from poirotd.daemon import Daemon
from poirotd.store.audit import verify
from poirotd.transports.grpc.server import SERVICES
from poirotd.transports.security.roles import REQUIRED
from tests.support.pki import (
    Pki,
    client,
    issue,
    issue_names,
    issue_spiffe,
    locked_daemon,
    replace_file,
)

READER, OPERATOR, AUDITOR, INGEST = "reader-token", "operator-token", "auditor-token", "ingest-1"
CONTROL = "control.clinic.test"
BRIDGE = "spiffe://clinic.test/ns/mas/sa/bridge"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access(
        {
            READER: ("dashboard", ["reader"]),
            OPERATOR: ("control", ["operator", "reader"]),
            AUDITOR: ("auditor", ["auditor"]),
            INGEST: ("agents", ["ingest"]),
        },
        {CONTROL: ("control-software", ["operator"]), BRIDGE: ("bridge", ["ingest"])},
    )
    return pki


@pytest.fixture
async def token_daemon(tmp_path: Path, pki: Pki) -> AsyncIterator[Daemon]:
    """TLS and tokens, no client certificates."""
    async with locked_daemon(tmp_path, pki, auth_file=pki.auth_file) as daemon:
        yield daemon


@pytest.fixture
async def mtls_daemon(tmp_path: Path, pki: Pki) -> AsyncIterator[Daemon]:
    async with locked_daemon(
        tmp_path, pki, auth_file=pki.auth_file, tls_client_ca_file=pki.ca_file
    ) as daemon:
        yield daemon


def denials(daemon: Daemon, rpc: str, reason: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_auth_denials_total", {"rpc": rpc, "reason": reason}
    )
    return value or 0.0


def chained_denials(daemon: Daemon) -> list[str]:
    with sqlite3.connect(daemon.settings.db_path) as db:
        return [r for (r,) in db.execute("SELECT record FROM access_denials ORDER BY id")]


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def start(session_id: str) -> list[pb.IngestRequest]:
    return [pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system="clinic"))]


async def test_tokens_authenticate_and_roles_decide_each_rpc(
    token_daemon: Daemon, pki: Pki
) -> None:
    tls = pki.client_tls()
    async with client(token_daemon, tls) as anonymous:
        error = await refused(anonymous.reputation())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in error.details()

    async with client(token_daemon, tls, token="not-a-known-token") as wrong:
        error = await refused(wrong.reputation())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "the bearer token is not known"

    async with client(token_daemon, tls, token=READER) as reader:
        assert (await reader.reputation()).betas  # a reader reads
        error = await refused(reader.trigger("s1", "suspicious"))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'dashboard' may not call Investigations.Trigger" in error.details()
        assert "needs the role 'operator'" in error.details() and READER not in error.details()
        error = await refused(reader.send(start("s1")))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "'ingest'" in error.details()

    async with client(token_daemon, tls, token=INGEST) as agents:
        assert await agents.send(start("s1")) == 1
        error = await refused(agents.reputation())
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "'reader'" in error.details()

    assert denials(token_daemon, "Investigations.GetReputation", "no_credentials") == 1
    assert denials(token_daemon, "Investigations.GetReputation", "unknown_token") == 1
    assert denials(token_daemon, "Investigations.Trigger", "missing_role") == 1
    assert denials(token_daemon, "Ingest.Stream", "missing_role") == 1
    assert denials(token_daemon, "Investigations.GetReputation", "missing_role") == 1


async def test_a_reader_cannot_see_prompts_and_answers_an_auditor_can(
    token_daemon: Daemon, pki: Pki
) -> None:
    tls = pki.client_tls()
    async with client(token_daemon, tls, token=INGEST) as agents:
        await agents.send(start("s1"))
    async with client(token_daemon, tls, token=OPERATOR) as control:
        queued = await control.trigger("s1", "check")
        _ = [event async for event in control.watch(queued.investigation_id)]
    full = pb.GetInvestigationRequest(
        investigation_id=queued.investigation_id, include_exchanges=True
    )

    async with client(token_daemon, tls, token=READER) as reader:
        brief = await reader.get(queued.investigation_id)
        assert brief.state == pb.INVESTIGATION_STATE_SUCCEEDED and not brief.exchanges
        error = await refused(reader.investigations.Get(full))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "needs the role 'auditor'" in error.details()

    async with client(token_daemon, tls, token=AUDITOR) as auditor:
        record = await auditor.investigations.Get(full)
        assert record.exchanges and record.exchanges[0].messages
        assert (await auditor.get(queued.investigation_id)).investigation_id  # includes reader


async def test_each_denial_is_chained_without_the_secret(token_daemon: Daemon, pki: Pki) -> None:
    async with client(token_daemon, pki.client_tls(), token="guessed-secret") as wrong:
        await refused(wrong.reputation())
    async with client(token_daemon, pki.client_tls(), token=READER) as reader:
        await refused(reader.trigger("s1", "x"))
    assert token_daemon._denials is not None
    await token_daemon._denials.flush()

    records = chained_denials(token_daemon)
    assert len(records) == 2
    assert '"reason":"unknown_token"' in records[0] and '"transport":"grpc"' in records[0]
    assert '"identity":"dashboard"' in records[1] and '"role":"operator"' in records[1]
    assert (
        '"call":"Investigations.Trigger"' in records[1] and '"peer":"ipv4:127.0.0.1' in records[1]
    )
    assert not any("guessed-secret" in r or READER in r for r in records)
    report = verify(token_daemon.settings.db_path)
    assert report.ok, report.summary()


async def test_client_certificates_are_required_and_checked(mtls_daemon: Daemon, pki: Pki) -> None:
    good = issue(pki.ca, CONTROL)
    async with client(mtls_daemon, pki.client_tls(good)) as control:
        error = await refused(control.reputation())  # an operator only: roles still apply
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # Refused in the TLS handshake, before any RPC: the client sees UNAVAILABLE.
    other_ca = trustme.CA()
    cases = {
        "no client certificate": pki.client_tls(),
        "a certificate of another CA": pki.client_tls(issue(other_ca, CONTROL)),
        "an expired certificate": pki.client_tls(issue(pki.ca, CONTROL, expired=True)),
    }
    for case, tls in cases.items():
        async with client(mtls_daemon, tls) as stranger:
            error = await refused(stranger.reputation())
        assert error.code() == grpc.StatusCode.UNAVAILABLE, case
    # The daemon serves on: the certificate it knows still gets through.
    async with client(mtls_daemon, pki.client_tls(good)) as control:
        error = await refused(control.trigger("unknown-session", "x"))
        assert error.code() == grpc.StatusCode.NOT_FOUND  # past authentication and roles


async def test_certificate_names_and_spiffe_ids_map_to_roles(mtls_daemon: Daemon, pki: Pki) -> None:
    bridge = pki.client_tls(issue_spiffe(pki.ca, BRIDGE))
    async with client(mtls_daemon, bridge) as ingest:
        assert await ingest.send(start("s1")) == 1
        error = await refused(ingest.trigger("s1", "x"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'bridge' may not call Investigations.Trigger" in error.details()

    unknown = pki.client_tls(issue(pki.ca, "someone.clinic.test"))
    async with client(mtls_daemon, unknown) as stranger:
        error = await refused(stranger.reputation())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "certificate's names are not in the access file" in error.details()
    # A token is taken over the certificate's own name.
    async with client(mtls_daemon, unknown, token=READER) as reader:
        assert (await reader.reputation()).betas


async def test_a_certificate_is_known_by_its_uri_and_dns_sans_typed_never_by_cn_or_email(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    """Issue 29: the CA signs a laptop's DNS name; the certificate's CN, or an email SAN, spells
    the bridge's SPIFFE ID (or the control software's DNS name): it is neither of them."""
    laptop = x509.DNSName("intern-laptop.example")
    impostors = {
        "CN spelling the SPIFFE ID": issue_names(pki.ca, [laptop], common_name=BRIDGE),
        "email SAN spelling it": issue_names(pki.ca, [laptop, x509.RFC822Name(BRIDGE)]),
        "CN alone spelling the DNS name": issue_names(pki.ca, [], common_name=CONTROL),
    }
    for case, pem in impostors.items():
        async with client(mtls_daemon, pki.client_tls(pem)) as impostor:
            error = await refused(impostor.send(start(f"s-{len(case)}")))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, case
        assert "names are not in the access file" in error.details(), case
    assert denials(mtls_daemon, "Ingest.Stream", "unknown_certificate") == len(impostors)
    # The same name as a URI SAN is the bridge; as a DNS SAN, beside the laptop's, the control.
    genuine = issue_names(pki.ca, [laptop, x509.UniformResourceIdentifier(BRIDGE)])
    async with client(mtls_daemon, pki.client_tls(genuine)) as bridge:
        assert await bridge.send(start("s1")) == 1
    control = issue_names(pki.ca, [laptop, x509.DNSName(CONTROL)], common_name=BRIDGE)
    async with client(mtls_daemon, pki.client_tls(control)) as operator:
        error = await refused(operator.send(start("s2")))
    assert "'control-software' may not call Ingest.Stream" in error.details()


async def test_a_client_ca_alone_lets_every_certificate_it_signed_call_everything(
    tmp_path: Path, pki: Pki
) -> None:
    anyone_tls = pki.client_tls(issue(pki.ca, "anyone.clinic.test"))
    async with (
        locked_daemon(tmp_path, pki, tls_client_ca_file=pki.ca_file) as daemon,
        client(daemon, anyone_tls) as anyone,
    ):
        assert await anyone.send(start("s1")) == 1
        assert (await anyone.trigger("s1", "x")).investigation_id


async def test_health_and_reflection_stay_open_and_reflection_can_be_switched_off(
    tmp_path: Path, pki: Pki
) -> None:
    target = "127.0.0.1:{}"
    for reflection in (True, False):
        folder = tmp_path / f"reflection-{reflection}"
        folder.mkdir()
        async with (
            locked_daemon(
                folder, pki, auth_file=pki.auth_file, grpc_reflection=reflection
            ) as daemon,
            open_channel(target.format(daemon.grpc_port), tls=pki.client_tls()) as ch,
        ):
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                iter([request])
            )
            if reflection:
                names = {
                    s.name
                    for r in [r async for r in call]
                    for s in r.list_services_response.service
                }
                assert set(SERVICES) <= names
            else:
                error = await refused(call.read())
                assert error.code() == grpc.StatusCode.UNIMPLEMENTED


def test_every_rpc_of_our_services_has_a_role() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods <= set(REQUIRED)
    assert all(REQUIRED[m] is not None for m in methods)


async def test_a_renewed_server_certificate_is_served_without_a_restart(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    control = issue(pki.ca, CONTROL)
    async with client(mtls_daemon, pki.client_tls(control), token=READER) as before:
        assert (await before.reputation()).betas
        renewed_ca = trustme.CA()
        renewed = issue(renewed_ca, "poirotd.clinic.test")
        replace_file(pki.key_file, renewed.key)
        replace_file(pki.cert_file, renewed.cert)
        # A connection already open keeps its session.
        assert (await before.reputation()).betas
    new_trust = DaemonTls(
        renewed_ca.cert_pem.bytes(), control.cert, control.key, "poirotd.clinic.test"
    )
    async with client(mtls_daemon, new_trust, token=READER) as after:
        assert (await after.reputation()).betas
    async with client(mtls_daemon, pki.client_tls(control), token=READER) as old_trust:
        error = await refused(old_trust.reputation())
    assert error.code() == grpc.StatusCode.UNAVAILABLE  # the old certificate is gone


async def test_a_half_written_rotation_keeps_the_old_certificate_until_it_completes(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    control = issue(pki.ca, CONTROL)
    renewed_ca = trustme.CA()
    renewed = issue(renewed_ca, "poirotd.clinic.test")
    replace_file(pki.cert_file, renewed.cert)  # the key is not there yet: they do not match
    async with client(mtls_daemon, pki.client_tls(control), token=READER) as still_old:
        assert (await still_old.reputation()).betas
    replace_file(pki.key_file, renewed.key)
    trust = DaemonTls(renewed_ca.cert_pem.bytes(), control.cert, control.key, "poirotd.clinic.test")
    async with client(mtls_daemon, trust, token=READER) as renewed_client:
        assert (await renewed_client.reputation()).betas


async def test_the_access_file_is_reloaded_when_it_changes(token_daemon: Daemon, pki: Pki) -> None:
    tls = pki.client_tls()
    async with client(token_daemon, tls, token="new-token") as newcomer:
        assert (await refused(newcomer.reputation())).code() == grpc.StatusCode.UNAUTHENTICATED
    pki.write_access({"new-token": ("newcomer", ["reader"])}, {})
    await asyncio.sleep(1.1)  # the file's stat is looked at once a second at most
    async with client(token_daemon, tls, token="new-token") as newcomer:
        assert (await newcomer.reputation()).betas
    async with client(token_daemon, tls, token=READER) as removed:
        assert (await refused(removed.reputation())).code() == grpc.StatusCode.UNAUTHENTICATED

    replace_file(pki.auth_file, b"tokens: {not-a-hash: {name: x, roles: [reader]}}\n")
    await asyncio.sleep(1.1)
    async with client(token_daemon, tls, token="new-token") as newcomer:
        assert (await newcomer.reputation()).betas  # a broken file leaves the last good one
    registry = token_daemon.metrics.registry
    assert registry.get_sample_value("poirot_auth_file_reloads_total", {"outcome": "ok"}) == 1
    assert registry.get_sample_value("poirot_auth_file_reloads_total", {"outcome": "error"}) == 1


async def test_a_deleted_access_file_fails_closed_until_it_is_back(
    token_daemon: Daemon, pki: Pki
) -> None:
    """Deleting the access file revokes everyone (it kept the last good policy, silently): each
    call is refused with the reason, the log says so once, the gauge reads 0 and the reload
    counter counts it; the file put back admits again."""
    tls, registry = pki.client_tls(), token_daemon.metrics.registry
    saved = pki.auth_file.read_bytes()
    pki.auth_file.unlink()
    await asyncio.sleep(1.1)  # the file's stat is looked at once a second at most
    with structlog.testing.capture_logs() as logs:
        assert registry.get_sample_value("poirot_auth_file_loaded") == 0  # a scrape notices
        for token in (READER, OPERATOR, None):
            async with client(token_daemon, tls, token=token) as anyone:
                error = await refused(anyone.reputation())
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "access file is missing" in error.details()
    assert [line["event"] for line in logs if line["log_level"] == "error"] == [
        "access file is missing; every authenticated call is refused until it is back"
    ]
    assert denials(token_daemon, "Investigations.GetReputation", "access_file_missing") == 3
    assert registry.get_sample_value("poirot_auth_file_reloads_total", {"outcome": "missing"}) == 1

    replace_file(pki.auth_file, saved)
    await asyncio.sleep(1.1)
    async with client(token_daemon, tls, token=READER) as reader:
        assert (await reader.reputation()).betas
    assert registry.get_sample_value("poirot_auth_file_loaded") == 1
