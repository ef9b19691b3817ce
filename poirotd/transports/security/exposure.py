"""Safe by default: a port bound beyond loopback must have TLS and authentication, or the daemon
refuses to start, unless POIROTD_ALLOW_INSECURE_BIND says the operator means it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from poirotd.config import Settings
from poirotd.errors import StartupError

_TLS = "TLS (POIROTD_TLS_CERT_FILE and POIROTD_TLS_KEY_FILE)"
_AUTH = "authentication (POIROTD_AUTH_FILE or POIROTD_TLS_CLIENT_CA_FILE)"


class InsecureBindError(StartupError, ValueError):
    """A port would be reachable from the network unlocked; the message names the settings."""


@dataclass(frozen=True)
class Exposure:
    """One port as configured: the `port` label of poirot_insecure_bind, its host setting."""

    port: str
    host_setting: str
    host: str
    tls: bool
    auth: bool

    @property
    def insecure(self) -> bool:
        return not is_loopback(self.host) and not (self.tls and self.auth)

    def problem(self) -> str:
        missing = " and ".join(
            what for what, present in ((_TLS, self.tls), (_AUTH, self.auth)) if not present
        )
        return (
            f"{self.host_setting}={self.host or '(all interfaces)'} is not a loopback address, "
            f"and the {self.port} port would serve it without {missing}"
        )


def exposures(settings: Settings) -> tuple[Exposure, ...]:
    tls = settings.tls_cert_file is not None
    auth = settings.auth_file is not None or settings.tls_client_ca_file is not None
    transports = [
        Exposure("grpc", "POIROTD_GRPC_HOST", settings.grpc_host, tls, auth),
        Exposure("metrics", "POIROTD_METRICS_HOST", settings.metrics_host, tls, auth),
    ]
    if settings.otlp_http_port:
        transports.append(
            Exposure("otlp_http", "POIROTD_OTLP_HTTP_HOST", settings.otlp_http_host, tls, auth)
        )
    if settings.page_port:
        transports.append(Exposure("page", "POIROTD_PAGE_HOST", settings.page_host, tls, auth))
    return tuple(transports)


def check_exposure(settings: Settings) -> tuple[Exposure, ...]:
    """The ports served insecurely under the opt-out (empty when all are locked or on
    loopback); raises InsecureBindError without the opt-out."""
    insecure = tuple(e for e in exposures(settings) if e.insecure)
    if insecure and not settings.allow_insecure_bind:
        problems = "; ".join(e.problem() for e in insecure)
        raise InsecureBindError(
            f"refusing to start: {problems}. Configure them, bind 127.0.0.1, or set "
            "POIROTD_ALLOW_INSECURE_BIND=true to serve it unlocked anyway"
        )
    return insecure


def is_loopback(host: str) -> bool:
    """Only addresses that are loopback whatever the resolver says: names other than
    `localhost` may resolve anywhere, and "" or 0.0.0.0 is every interface."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
