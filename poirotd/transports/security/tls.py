"""The server's TLS material from PEM files, re-read when the files are replaced.

Every transport uses it: gRPC takes the PEM bytes (grpc's certificate-config fetcher asks for
them on every new connection), the metrics server an `ssl.SSLContext` it wraps each new
connection with, OTLP/HTTP's asyncio server a context that does the same (`asyncio_context`).
A load is only taken when the certificate and key match and the files did not change while they
were read, so a rotation caught half-written is simply tried again on the next connection.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from poirotd.errors import StartupError
from poirotd.transports.security.files import Stamp, stamp

log = structlog.get_logger(__name__)


class TlsError(StartupError, ValueError):
    """The TLS files cannot be used (missing, not PEM, a key that is not the certificate's)."""


@dataclass(frozen=True)
class TlsMaterial:
    cert_chain: bytes
    key: bytes
    # When set, clients must present a certificate this CA signed.
    client_ca: bytes | None
    # The same material for Python's ssl module (the metrics server).
    context: ssl.SSLContext


class ServerTls:
    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self._paths = (cert_file, key_file, *((client_ca_file,) if client_ca_file else ()))
        self._lock = threading.Lock()
        loaded = self._load()
        if loaded is None:
            raise TlsError(f"the TLS files changed while they were read: {self._names()}")
        self._material, self._stamp = loaded
        self._failed: Stamp | None = None  # files that could not be loaded, logged once

    @property
    def requires_client_certificate(self) -> bool:
        return len(self._paths) == 3

    @property
    def material(self) -> TlsMaterial:
        with self._lock:
            return self._material

    def asyncio_context(self) -> ssl.SSLContext:
        """A context for an asyncio server (OTLP/HTTP) that hands each new connection to the
        current material, so a replaced certificate is served without a restart there too."""
        context = _CurrentContext(ssl.PROTOCOL_TLS_SERVER)
        context.tls = self
        return context

    def refresh(self) -> TlsMaterial | None:
        """The new material when the files were replaced since the last load and the new ones
        load; None when nothing changed or the new files cannot be used yet (logged; the
        material in use stays)."""
        with self._lock:
            now = stamp(self._paths)
            if now in (self._stamp, self._failed):
                return None
            try:
                loaded = self._load()
            except TlsError as exc:
                self._failed = now
                log.error("TLS files changed but cannot be loaded; keeping the old", error=str(exc))
                return None
            if loaded is None:
                return None
            self._material, self._stamp = loaded
            log.info("TLS certificate reloaded", files=self._names())
            return self._material

    def _load(self) -> tuple[TlsMaterial, Stamp] | None:
        before = stamp(self._paths)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        cert, key, *ca = self._paths
        try:
            context.load_cert_chain(cert, key)
            if ca:
                context.load_verify_locations(cafile=ca[0])
                context.verify_mode = ssl.CERT_REQUIRED
            pems = [path.read_bytes() for path in self._paths]
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load TLS files {self._names()}: {exc}") from exc
        if stamp(self._paths) != before:
            return None
        material = TlsMaterial(pems[0], pems[1], pems[2] if ca else None, context)
        return material, before

    def _names(self) -> str:
        return ", ".join(str(path) for path in self._paths)


class _CurrentContext(ssl.SSLContext):
    """asyncio wraps every accepted connection with `wrap_bio`: this one asks `ServerTls` for
    its material first (a file check, as the gRPC fetcher does) and wraps with that."""

    tls: ServerTls

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        material = self.tls.refresh() or self.tls.material
        return material.context.wrap_bio(
            incoming,
            outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session,
        )
