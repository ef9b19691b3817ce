"""Prometheus' scrape endpoint, GET /metrics over HTTP or HTTPS: prometheus-client's aiohttp
handler on the daemon's event loop.

Served like OTLP/HTTP (`transports.http_server`): a client that connects and sends nothing, or
trickles its request, holds neither a thread nor the accept loop, and loses its connection at
the request deadline; connections are capped per peer and in all. TLS from the daemon's
certificate (a replaced one is served to new connections, as on the gRPC port); with an access
policy, a scrape needs the `metrics` role (a bearer token, or a client certificate's name).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from poirotd.observability.metrics import Metrics
from poirotd.transports.http_server import HttpLimits, HttpServer
from poirotd.transports.security.http import HttpAccess
from poirotd.transports.security.tls import ServerTls

PATH = "/metrics"


class MetricsHttp:
    """The metrics transport; its lifecycle is the daemon's (transports.lifecycle)."""

    def __init__(
        self,
        metrics: Metrics,
        limits: HttpLimits,
        *,
        host: str,
        port: int,
        tls: ServerTls | None = None,
        access: HttpAccess | None = None,
    ) -> None:
        self._scrape = make_aiohttp_handler(metrics.registry)
        self._access = access
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        self._server = HttpServer(app, "metrics", metrics, limits, host=host, port=port, tls=tls)

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self) -> None:
        await self._server.start()

    async def drain(self) -> None:
        """Keeps serving: a last scrape during the drain sees the final counts."""

    async def stop(self, grace: float) -> None:
        await self._server.stop()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if self._access is not None:
            admitted = self._access.admit(request)
            if isinstance(admitted, web.Response):
                return admitted
        return await self._scrape(request)
