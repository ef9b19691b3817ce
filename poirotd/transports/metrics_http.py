"""Prometheus' scrape endpoint, /metrics over HTTP, from prometheus-client's own server."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class MetricsHttp:
    def __init__(self, registry: CollectorRegistry, *, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self.port = port
        self._server: WSGIServer | None = None

    async def start(self) -> None:
        self._server, _ = start_http_server(self.port, self._host, registry=self._registry)
        self.port = self._server.server_port

    async def drain(self) -> None:
        """Keeps serving: a last scrape during the drain sees the final counts."""

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
