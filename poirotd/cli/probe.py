"""``python -m poirotd.cli.probe [HOST:PORT] [--service NAME]``: exit 0 when the daemon's gRPC
health says SERVING (for the whole daemon, or the named service).

The whole daemon ("") is ready while its store answers: the readiness probe. A liveness probe
asks ``--service poirotd.live``, SERVING until the daemon drains: a store or model outage is not
cured by restarting the daemon, and one that cannot open its store at start exits.

For container health checks. Kubernetes' native gRPC probe and Docker's healthcheck speak
plaintext only, so once the gRPC port has TLS (and requires client certificates) a probe must
run inside the container with the daemon's own files: its certificate and key as the client's,
and the client CA as the CA the server's certificate chains to (cert-manager's ``ca.crt``; set
``POIROTD_PROBE_CA_FILE`` when there is no client CA). The certificate must name the host probed
(``localhost`` by default). Health is open to any client
the TLS layer admits, so no token is needed. Without ``POIROTD_TLS_CERT_FILE`` it probes in
plaintext, as the daemon then serves.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_TIMEOUT_SECONDS = 3.0


def _credentials(environ: Mapping[str, str]) -> grpc.ChannelCredentials | None:
    cert, key = environ.get("POIROTD_TLS_CERT_FILE"), environ.get("POIROTD_TLS_KEY_FILE")
    if not cert or not key:
        return None
    ca = environ.get("POIROTD_PROBE_CA_FILE") or environ.get("POIROTD_TLS_CLIENT_CA_FILE")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes() if ca else None,
        private_key=Path(key).read_bytes(),
        certificate_chain=Path(cert).read_bytes(),
    )


def probe(target: str, environ: Mapping[str, str] = os.environ, service: str = "") -> str | None:
    """None when SERVING, else why not."""
    try:
        credentials = _credentials(environ)
    except OSError as exc:
        return f"cannot read a TLS file: {exc}"
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        reply = stub.Check(request, timeout=_TIMEOUT_SECONDS)
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        channel.close()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return None


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    service = ""
    if "--service" in args:
        at = args.index("--service")
        service = args[at + 1] if at + 1 < len(args) else ""
        del args[at : at + 2]
    port = os.environ.get("POIROTD_GRPC_PORT", "50051")
    target = args[0] if args else f"localhost:{port}"
    problem = probe(target, service=service)
    if problem is not None:
        print(f"poirotd at {target} is not serving: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
