"""Why a connection to the MQTT broker failed: one of a few reasons (a metric label) and a detail
a person can act on (the log line).

aiomqtt reports most failures as ``MqttError("Operation timed out")``: a broker that ends the TLS
session before CONNACK (a missing or untrusted client certificate under `require_certificate
true`) is only visible in paho-mqtt's log of the socket error, which ``socket_error`` carries in.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode

from poirotd.client.secrets import SecretError
from poirotd.client.tls import ClientTLSError

# Every reason, in the order the metric lists them.
REASONS = (
    # The client's own settings: a TLS file or the password cannot be read.
    "config",
    # No TCP connection (refused, no route, unknown host).
    "unreachable",
    # No CONNACK within the broker's timeout_s.
    "timeout",
    # The broker's certificate is not signed by tls.ca_file, has expired or does not name host.
    "tls_server_unverified",
    # Any other TLS failure, e.g. the broker refused the client certificate or its absence.
    "tls_handshake",
    # CONNACK: bad user name or password, or not authorised.
    "not_authorized",
    # CONNACK: any other refusal (protocol version, client id, server unavailable), or another
    # error before the connection was up.
    "refused",
    # A connection that was up (subscribed) ended.
    "lost",
)

# CONNACK codes of MQTT 3.1.1 (4, 5) and 5 (0x86, 0x87) for credentials the broker refuses.
_NOT_AUTHORIZED = {4, 5, 0x86, 0x87}


@dataclass(frozen=True)
class ConnectionFailure:
    reason: str
    detail: str


def classify(exc: BaseException, socket_error: str | None) -> ConnectionFailure:
    """The failure of a connection attempt that raised ``exc`` before it was up."""
    if isinstance(exc, ClientTLSError | SecretError):
        return ConnectionFailure("config", str(exc))
    if isinstance(exc, MqttConnectError):
        rc = exc.rc
        code = rc.value if isinstance(rc, ReasonCode) else rc
        reason = "not_authorized" if code in _NOT_AUTHORIZED else "refused"
        return ConnectionFailure(reason, f"the broker refused the connection: {rc}")
    # aiomqtt raises MqttError(str(cause)) from None: the cause stays in __context__.
    cause = exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return ConnectionFailure(
            "tls_server_unverified",
            f"the broker's certificate was not accepted: {cause.verify_message}",
        )
    if isinstance(cause, ssl.SSLError):
        return ConnectionFailure("tls_handshake", f"TLS failed: {cause.reason or cause}")
    if isinstance(cause, OSError) and not isinstance(cause, TimeoutError):
        return ConnectionFailure("unreachable", str(exc))
    if socket_error is not None and "[SSL" in socket_error:
        return ConnectionFailure(
            "tls_handshake",
            f"the broker ended the TLS session ({socket_error}); does it require a client "
            "certificate that tls.cert_file does not give, or one from another CA?",
        )
    detail = str(exc) if socket_error is None else f"{exc} (socket: {socket_error})"
    return ConnectionFailure("timeout" if isinstance(cause, TimeoutError) else "refused", detail)
