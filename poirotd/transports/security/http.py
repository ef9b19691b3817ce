"""The access check of the HTTP doors (/metrics, OTLP/HTTP), the same policy and answers as the
gRPC interceptor's: 401 with a Bearer challenge for no or unknown credentials, 403 naming the
missing role, each refusal counted, logged and chained by the `DenialRecorder`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poirotd.model import Door
from poirotd.transports.security.access import AccessControl, Denied, Identity
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.roles import REQUIRED

CHALLENGE = ("WWW-Authenticate", 'Bearer realm="poirotd"')


@dataclass(frozen=True)
class HttpRefusal:
    status: int
    message: str

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [CHALLENGE] if self.status == 401 else []


@dataclass(frozen=True)
class HttpAccess:
    """Who may call `call` (a key of `security.roles.REQUIRED`) on one HTTP door."""

    access: AccessControl
    denials: DenialRecorder
    door: Door
    call: str

    def admit(
        self, authorization: str | None, certificate_names: list[str], peer: str
    ) -> Identity | HttpRefusal:
        """Who the caller is when it may; else the answer to give (the refusal already
        recorded)."""
        requirement = REQUIRED[self.call]
        assert requirement is not None, f"{self.call} is never open under an access policy"
        try:
            identity = self.access.policy().identify(authorization, certificate_names)
            identity.require(requirement.role, self.call)
        except Denied as denied:
            self.denials.record(denied, door=self.door, call=self.call, peer=peer)
            return HttpRefusal(403 if denied.reason.authenticated else 401, str(denied))
        return identity


def certificate_names(certificate: dict[str, Any] | None) -> list[str]:
    """A peer certificate's SANs in order, then its common name, as the gRPC port sees them."""
    if not certificate:
        return []
    names = [value for _, value in certificate.get("subjectAltName", ())]
    for rdn in certificate.get("subject", ()):
        names += [value for key, value in rdn if key == "commonName"]
    return names
