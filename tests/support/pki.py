"""Certificates made for each test (trustme, and cryptography for what trustme does not issue:
SPIFFE IDs, email SANs, a chosen common name), an access file, and a daemon locked with them on
loopback."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from poirotd.client.wire import DaemonTls, PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import fill
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.security.access import token_hash
from tests.support.daemon import in_process_daemon

SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "clinic", "description": "Two agents plan therapy."},
        "agents": [
            {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose."},
            {"id": "chief", "name": "Chief", "system_prompt": "You choose the plan."},
        ],
        "components": [
            {
                "id": "exo",
                "name": "Exoskeleton",
                "type": "hardware",
                "description": "Error signature: odd readings. Normal behaviour: sane ones.",
            }
        ],
        "protocol": {"max_invocations": 1},
    }
)
SERVER_NAME = "poirotd.clinic.test"


def _answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
    return json.dumps(fill(schema)) if schema is not None else "Nothing unusual."


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def issue(ca: trustme.CA, *names: str, expired: bool = False) -> Pem:
    """A certificate for `names` (DNS names) signed by `ca`; `expired` ended yesterday."""
    now = datetime.now(UTC)
    window: dict[str, Any] = (
        {"not_before": now - timedelta(days=2), "not_after": now - timedelta(days=1)}
        if expired
        else {}
    )
    leaf = ca.issue_cert(*names, **window)
    return Pem(b"".join(p.bytes() for p in leaf.cert_chain_pems), leaf.private_key_pem.bytes())


def issue_spiffe(ca: trustme.CA, spiffe_id: str) -> Pem:
    """A workload certificate whose only SAN is a SPIFFE ID (a URI), as SPIRE issues them."""
    return issue_names(ca, [x509.UniformResourceIdentifier(spiffe_id)])


def issue_names(
    ca: trustme.CA, sans: Sequence[x509.GeneralName], common_name: str | None = None
) -> Pem:
    """A client certificate `ca` signed with exactly these SANs (any type) and, when given, a
    subject common name: what trustme does not issue."""
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(hours=1))
    )
    if sans:  # RFC 5280: critical when the subject is empty
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=not subject)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def replace_file(path: Path, data: bytes) -> None:
    """Atomically, as cert-manager's secret volumes and careful editors do."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass
class Pki:
    """One test's certificates: the server's CA and the clients' CA (one, as usual), the
    server's files, and the access file."""

    folder: Path
    ca: trustme.CA
    cert_file: Path
    key_file: Path
    ca_file: Path
    auth_file: Path

    @classmethod
    def create(cls, folder: Path) -> Pki:
        folder.mkdir(parents=True)
        ca = trustme.CA()
        server = issue(ca, SERVER_NAME, "127.0.0.1")
        pki = cls(
            folder,
            ca,
            folder / "server.pem",
            folder / "server.key",
            folder / "ca.pem",
            folder / "access.yaml",
        )
        pki.cert_file.write_bytes(server.cert)
        pki.key_file.write_bytes(server.key)
        pki.ca_file.write_bytes(ca.cert_pem.bytes())
        pki.write_access({}, {})
        return pki

    def write_access(
        self,
        tokens: dict[str, tuple[str, list[str]]],
        certificates: dict[str, tuple[str, list[str]]],
    ) -> None:
        """tokens: the token itself -> (name, roles); only its hash is written."""
        document = {
            "tokens": {token_hash(t): {"name": n, "roles": r} for t, (n, r) in tokens.items()},
            "certificates": {c: {"name": n, "roles": r} for c, (n, r) in certificates.items()},
        }
        replace_file(self.auth_file, json.dumps(document).encode())

    def client_tls(self, pem: Pem | None = None, ca: trustme.CA | None = None) -> DaemonTls:
        trusted = (ca or self.ca).cert_pem.bytes()
        return DaemonTls(trusted, pem.cert if pem else None, pem.key if pem else None, SERVER_NAME)


@asynccontextmanager
async def locked_daemon(tmp_path: Path, pki: Pki, **settings: Any) -> AsyncIterator[Daemon]:
    """A daemon with TLS, and what `settings` add (client CA, access file)."""
    async with in_process_daemon(
        tmp_path,
        SPEC,
        ScriptedBackend(_answer),
        tls_cert_file=pki.cert_file,
        tls_key_file=pki.key_file,
        **settings,
    ) as daemon:
        yield daemon


def client(daemon: Daemon, tls: DaemonTls | None = None, token: str | None = None) -> PoirotClient:
    return PoirotClient(f"127.0.0.1:{daemon.grpc_port}", tls=tls, token=token)
