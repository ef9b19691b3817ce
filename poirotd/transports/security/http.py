"""The access check of the HTTP transports (/metrics, OTLP/HTTP), the same policy and answers as the
gRPC interceptor's: 401 with a Bearer challenge for no or unknown credentials, 403 naming the
missing role, each refusal counted, logged and chained by the `DenialRecorder`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from poirotd.model import TransportName
from poirotd.transports.security.access import (
    AccessControl,
    AccessDeniedError,
    ClientCertificate,
    Identity,
)
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.roles import REQUIRED

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="poirotd"'}


@dataclass(frozen=True)
class HttpAccess:
    """Who may call `call` (a key of `security.roles.REQUIRED`) on one HTTP transport."""

    access: AccessControl
    denials: DenialRecorder
    transport: TransportName
    call: str

    def admit(self, request: web.Request) -> Identity | web.Response:
        """Who the caller is when it may; else the answer to give (the refusal already
        recorded)."""
        requirement = REQUIRED[self.call]
        assert requirement is not None, f"{self.call} is never open under an access policy"
        transport = request.transport
        peercert = None if transport is None else transport.get_extra_info("peercert")
        try:
            identity = self.access.policy().identify(
                request.headers.get("Authorization"), client_certificate(peercert)
            )
            identity.require(requirement.role, self.call)
        except AccessDeniedError as denied:
            self.denials.record(
                denied, transport=self.transport, call=self.call, peer=request.remote or ""
            )
            if denied.reason.authenticated:
                return web.Response(status=403, text=f"{denied}\n")
            return web.Response(status=401, text=f"{denied}\n", headers=CHALLENGE)
        return identity


def client_certificate(certificate: dict[str, Any] | None) -> ClientCertificate | None:
    """A verified peer certificate (`getpeercert()`) as the access check reads it, the same as
    the gRPC port does: its URI and DNS SANs by type; None when the client sent none."""
    if not certificate:
        return None
    sans = certificate.get("subjectAltName", ())
    return ClientCertificate.of(
        (value for kind, value in sans if kind == "URI"),
        (value for kind, value in sans if kind == "DNS"),
    )
