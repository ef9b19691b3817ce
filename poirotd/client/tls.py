"""TLS for the connections poirotd and hwbridge open: to an MQTT broker, to an LLM server.

One model and one way to build its ``ssl.SSLContext``, so every client verifies servers alike:
the server's certificate must chain to ``ca_file`` (or the system's trust store) and name the
host connected to. Neither check can be turned off here; a server reached by an address its
certificate does not name needs a certificate that does (a SAN), not a weaker client.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class ClientTLSError(ValueError):
    """The context cannot be built (a file missing or unreadable, a key that does not match its
    certificate); the message names the setting and the file."""


class ClientTLS(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # PEM file of the CA certificate(s) the server's certificate must chain to (an internal CA);
    # unset: the system's trust store.
    ca_file: Path | None = None
    # A client certificate (PEM, chain allowed) and its unencrypted key, for servers that require
    # one (Mosquitto `require_certificate true`, an mTLS proxy in front of vLLM).
    cert_file: Path | None = None
    key_file: Path | None = None
    # Oldest protocol version accepted. 1.2 with OpenSSL's default ciphers is safe; 1.3 if every
    # server speaks it.
    min_version: Literal["1.2", "1.3"] = "1.2"
    # OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are not affected); unset: Python's defaults
    # (forward secrecy and AEAD only).
    ciphers: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ClientTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.ciphers is not None:
            try:
                ssl.create_default_context().set_ciphers(self.ciphers)
            except ssl.SSLError:
                raise ValueError(f"ciphers {self.ciphers!r} selects no cipher") from None
        return self

    def context(self) -> ssl.SSLContext:
        """A new context from the files as they are now (a rotated file is read again)."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ClientTLSError(f"tls.ca_file {self.ca_file}: {_why(exc)}") from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                files = f"{self.cert_file} / {self.key_file}"
                raise ClientTLSError(f"tls.cert_file / tls.key_file {files}: {_why(exc)}") from None
        context.minimum_version = _VERSIONS[self.min_version]
        if self.ciphers is not None:
            context.set_ciphers(self.ciphers)
        return context


def _why(exc: OSError | ssl.SSLError) -> str:
    """OpenSSL's reason (``KEY_VALUES_MISMATCH``...) or the OS's (``No such file...``)."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.reason} ({exc.library or 'ssl'})"
    return exc.strerror or str(exc)
