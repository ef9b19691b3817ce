"""Prometheus' scrape endpoint, /metrics over HTTP or HTTPS: prometheus-client's WSGI app on a
threading server of our own.

Our own server rather than `start_http_server(certfile=...)`: that one does the TLS handshake in
its accept loop, so one client that connects and sends nothing stops every scrape. Here each
connection is wrapped with the current TLS context (replaced certificate files are loaded by
then, as on the gRPC port) and shakes hands in its own thread, with a deadline. With an access
policy, a scrape needs the `metrics` role (a bearer token, or a client certificate's name).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app

from poirotd.transports.security.access import AccessControl
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.http import HttpAccess, HttpRefusal, certificate_names
from poirotd.transports.security.tls import ServerTls

log = structlog.get_logger(__name__)

_CALL = "GET /metrics"
_CERTIFICATE_NAMES = "poirotd.certificate_names"
# How long a connection may take for its handshake and each read of its request.
_CONNECTION_TIMEOUT_SECONDS = 10.0


class MetricsHttp:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str,
        port: int,
        tls: ServerTls | None = None,
        access: AccessControl | None = None,
        denials: DenialRecorder | None = None,
    ) -> None:
        self._app: WSGIApplication = make_wsgi_app(registry)
        if access is not None and denials is not None:
            self._app = _guarded(self._app, HttpAccess(access, denials, "metrics", _CALL))
        self._host = host
        self.port = port
        self._tls = tls
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        family = socket.getaddrinfo(
            self._host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0][0]
        server_class: type[_Server] = type("_BoundServer", (_Server,), {"address_family": family})
        server = make_server(self._host, self.port, self._app, server_class, _Handler)
        server.tls = self._tls
        self._server = server
        self.port = server.server_port
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-http")
        self._thread.daemon = True
        self._thread.start()

    async def drain(self) -> None:
        """Keeps serving: a last scrape during the drain sees the final counts."""

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ServerTls | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        if self.tls is not None:
            material = self.tls.refresh() or self.tls.material
            connection = material.context.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake (no or a wrong client certificate) or a client gone: logged
        quietly, not printed as a traceback."""
        log.info("metrics connection failed", peer=str(client_address[0]), exc_info=True)


class _Handler(WSGIRequestHandler):
    timeout = _CONNECTION_TIMEOUT_SECONDS

    def setup(self) -> None:
        super().setup()  # applies the timeout
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def get_environ(self) -> WSGIEnvironment:
        environ = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            environ[_CERTIFICATE_NAMES] = certificate_names(self.connection.getpeercert())
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one every few seconds)."""


def _guarded(app: WSGIApplication, door: HttpAccess) -> WSGIApplication:
    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        admitted = door.admit(
            environ.get("HTTP_AUTHORIZATION"),
            environ.get(_CERTIFICATE_NAMES, []),
            str(environ.get("REMOTE_ADDR", "")),
        )
        if not isinstance(admitted, HttpRefusal):
            return app(environ, start_response)
        status = "403 Forbidden" if admitted.status == 403 else "401 Unauthorized"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *admitted.headers])
        return [f"{admitted.message}\n".encode()]

    return guarded
