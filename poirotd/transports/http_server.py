"""The server of the HTTP transports (/metrics, OTLP/HTTP): an aiohttp application on the daemon's
event loop, held to the same bounds on both transports against clients that hold a connection
without finishing their requests.

- A whole-request deadline: a connection has `request_seconds` to deliver each request (for the
  first, its TLS handshake too), headers and body, counted from its opening or from its previous
  answer; past it the connection is aborted. aiohttp bounds neither the headers nor the body in
  time, and a timeout per read lets a client that sends a byte every few seconds hold a
  connection for ever. A connection idle that long after an answer is closed quietly.
- Connections open at once, per peer (its IP address) and in all, counted from the accept, so
  that handshakes never finished count too: one over either bound is answered 503 with
  Retry-After (over TLS, closed before the handshake) before aiohttp reads anything of it.

The bounds are kept by a protocol wrapped around each of aiohttp's (`_Connection`), the one
place that sees a connection open, receive and close: no thread, no timer per read. It does the
TLS handshake itself (`start_tls`), as asyncio's server would hide the connection from it until
the handshake is over. Each refusal is counted in
`poirot_http_connections_refused_total{transport,reason}` and logged.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from asyncio import sslproto
from dataclasses import dataclass

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from poirotd.config import Settings
from poirotd.errors import TransportBindError
from poirotd.model import TransportName
from poirotd.observability.metrics import HTTP_REFUSALS, Metrics
from poirotd.transports.security.tls import ServerTls

log = structlog.get_logger(__name__)

TOO_MANY_CONNECTIONS, TOO_MANY_PEER_CONNECTIONS, REQUEST_DEADLINE = HTTP_REFUSALS
_RETRY_AFTER_SECONDS = 1

# asyncio gives each TLS connection a read buffer of `max_size` (256 KiB), allocated and zeroed
# when it opens (CPython issue 109534): 400 held connections cost 100 MiB. A socket read rarely
# brings more than 64 KiB, and a TLS record is at most 16 KiB, so a smaller one costs nothing.
# The attribute is asyncio's, so this holds for every asyncio TLS connection of the process
# (only these transports: gRPC and the LLM client have their own TLS).
sslproto.SSLProtocol.max_size = 32 * 1024


@dataclass(frozen=True)
class HttpLimits:
    request_seconds: float
    max_connections: int
    max_connections_per_peer: int

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(
            settings.http_request_seconds,
            settings.http_max_connections,
            settings.http_max_connections_per_peer,
        )


class HttpServer:
    """`app` served on host:port (over TLS when `tls` is given) within `limits`; what one
    transport needs of a server: start, the bound port, stop."""

    def __init__(
        self,
        app: web.Application,
        transport: TransportName,
        metrics: Metrics,
        limits: HttpLimits,
        *,
        host: str,
        port: int,
        tls: ServerTls | None = None,
        auto_decompress: bool = True,
    ) -> None:
        self._transport = transport
        self._connections = _Connections(transport, metrics, limits)
        app.middlewares.append(self._connections.answering)
        self._app = app
        self._host = host
        self.port = port
        self._tls = tls
        self._auto_decompress = auto_decompress
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        runner = web.AppRunner(
            self._app,
            access_log=None,
            # aiohttp's own idle timer is left to fire after the deadline, which ends idle
            # connections itself.
            keepalive_timeout=2 * self._connections.limits.request_seconds,
            auto_decompress=self._auto_decompress,
        )
        await runner.setup()
        handlers = runner.server
        assert handlers is not None, "set up above"
        connections = self._connections
        context = None if self._tls is None else self._tls.asyncio_context()
        try:
            listener = await asyncio.get_running_loop().create_server(
                lambda: _Connection(connections, handlers(), context), self._host, self.port
            )
        except OSError as exc:
            await runner.cleanup()
            setting = f"POIROTD_{self._transport.upper()}"
            raise TransportBindError(
                f"cannot listen for {self._transport} on {self._host}:{self.port} "
                f"({setting}_HOST, {setting}_PORT): {os.strerror(exc.errno) if exc.errno else exc}"
            ) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._listener = runner, listener
        self.port = listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stops listening, aborts the handshakes under way, then ends the connections aiohttp
        serves (requests being answered first, within its shutdown timeout; the deadline still
        aborts a stalled one)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await self._connections.abort_handshakes()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class _Connections:
    """One transport's open connections, per peer and in all, and its refusals."""

    def __init__(self, transport: TransportName, metrics: Metrics, limits: HttpLimits) -> None:
        self.limits = limits
        self.handshakes: set[asyncio.Task[None]] = set()
        self._transport = transport
        self._metrics = metrics
        self._by_handler: dict[web.RequestHandler, _Connection] = {}
        self._per_peer: dict[str, int] = {}
        self._open = metrics.http_connections.labels(transport)

    def admit(self, connection: _Connection, peer: str) -> str | None:
        """None when `peer` may open one more connection (then counted as open); else the
        refusal's message (the refusal counted and logged)."""
        limits, held = self.limits, self._per_peer.get(peer, 0)
        if len(self._by_handler) >= limits.max_connections:
            return self.refused(
                peer,
                TOO_MANY_CONNECTIONS,
                f"{len(self._by_handler)} connections are open; the limit is "
                f"POIROTD_HTTP_MAX_CONNECTIONS={limits.max_connections}",
            )
        if held >= limits.max_connections_per_peer:
            return self.refused(
                peer,
                TOO_MANY_PEER_CONNECTIONS,
                f"{peer} has {held} connections open; the limit is "
                f"POIROTD_HTTP_MAX_CONNECTIONS_PER_PEER={limits.max_connections_per_peer}",
            )
        self._per_peer[peer] = held + 1
        self._by_handler[connection.handler] = connection
        self._open.inc()
        return None

    def release(self, connection: _Connection, peer: str) -> None:
        del self._by_handler[connection.handler]
        self._open.dec()
        left = self._per_peer.pop(peer) - 1
        if left:
            self._per_peer[peer] = left

    def refused(self, peer: str, reason: str, detail: str) -> str:
        self._metrics.http_connections_refused.labels(self._transport, reason).inc()
        log.warning(
            "connection refused", transport=self._transport, peer=peer, reason=reason, detail=detail
        )
        return detail

    def handshake_failed(self, peer: str, error: BaseException) -> None:
        """No or a wrong client certificate, a client gone, or the deadline: logged quietly
        (the deadline's abort is counted where it happens)."""
        log.info("TLS handshake failed", transport=self._transport, peer=peer, error=str(error))

    async def abort_handshakes(self) -> None:
        for connection in list(self._by_handler.values()):
            connection.abort_handshake()
        if self.handshakes:
            await asyncio.wait(self.handshakes)

    @web.middleware
    async def answering(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Tells the request's connection that its headers are in and its handler runs, and,
        when the handler returns, that the next request's time begins."""
        connection = self._by_handler.get(request.protocol)
        if connection is None:  # pragma: no cover - every admitted handler is registered
            return await handler(request)
        connection.request = request
        try:
            return await handler(request)
        finally:
            connection.answered(request)


class _Connection(asyncio.Protocol):
    """One accepted connection: admitted or refused, shaken hands with over TLS, handed to
    aiohttp's handler, and aborted when a request of it is not whole within the deadline."""

    def __init__(
        self, connections: _Connections, handler: web.RequestHandler, tls: ssl.SSLContext | None
    ) -> None:
        self.handler = handler
        self.request: web.Request | None = None  # the one whose handler runs
        self._connections = connections
        self._tls = tls
        self._socket: asyncio.Transport | None = None  # the accepted one, while admitted and open
        self._transport: asyncio.Transport | None = None  # the handler's (over TLS, the TLS one)
        self._peer = ""
        self._deadline: asyncio.TimerHandle | None = None
        self._answers = 0
        self._received = False  # a request begun since the connection opened or was answered
        self._early = bytearray()  # what TLS decrypted before the handshake's end reached us

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport), "a stream server's"
        address = transport.get_extra_info("peername")
        peer = str(address[0]) if isinstance(address, tuple) and address else "unknown"
        refusal = self._connections.admit(self, peer)
        if refusal is not None:
            if self._tls is None:
                _answer_503(transport, refusal)
            else:
                transport.close()
            return
        self._socket, self._peer = transport, peer
        self._arm()
        if self._tls is None:
            self._hand_over(transport)
            return
        task = asyncio.get_running_loop().create_task(self._handshake(transport, self._tls))
        self._connections.handshakes.add(task)
        task.add_done_callback(self._connections.handshakes.discard)

    async def _handshake(self, accepted: asyncio.Transport, context: ssl.SSLContext) -> None:
        seconds = self._connections.limits.request_seconds
        try:
            transport = await asyncio.get_running_loop().start_tls(
                accepted,
                self,
                context,
                server_side=True,
                # The deadline ends a handshake first; asyncio's own timer is left as a backstop.
                ssl_handshake_timeout=2 * seconds,
                ssl_shutdown_timeout=seconds,
            )
        except OSError as exc:  # ssl.SSLError, ConnectionError
            self._connections.handshake_failed(self._peer, exc)
            transport = None
        if transport is None:  # failed, or aborted (then start_tls returns None)
            self.connection_lost(None)  # asyncio does not say so for a handshake cut short
        elif self._socket is not None:
            self._hand_over(transport)

    def _hand_over(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.handler.connection_made(transport)
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self.handler.data_received(early)

    def data_received(self, data: bytes) -> None:
        if self._socket is None:
            return  # refused: being closed
        self._received = True
        if self._deadline is None:  # the next request arrives while one is answered
            self._arm()
        if self._transport is None:
            self._early += data
        else:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        if self._transport is not None:
            self.handler.eof_received()

    def pause_writing(self) -> None:
        if self._transport is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._socket is None:
            return
        self._socket = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._connections.release(self, self._peer)
        if self._transport is not None:
            self.handler.connection_lost(exc)

    def abort_handshake(self) -> None:
        if self._socket is not None and self._transport is None:
            self._socket.abort()

    def answered(self, request: web.Request) -> None:
        """The handler returned: the next request (or the idle keep-alive) has the deadline,
        and a body still coming counts as a request not yet whole."""
        self.request = None
        self._answers += 1
        self._received = not request.content.is_eof()
        if self._socket is not None:
            self._arm()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._connections.limits.request_seconds, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        accepted, transport, request = self._socket, self._transport, self.request
        if accepted is None:  # pragma: no cover - the timer is cancelled when it closes
            return
        if request is not None and request.content.is_eof():
            return  # the whole request is in: its answer is the handler's to give
        if transport is not None and request is None and not self._received and self._answers:
            transport.close()  # idle after an answer: keep-alive ends
            return
        seconds = self._connections.limits.request_seconds
        self._connections.refused(
            self._peer,
            REQUEST_DEADLINE,
            f"no whole request within {seconds:g} s (POIROTD_HTTP_REQUEST_SECONDS)",
        )
        accepted.abort()


def _answer_503(transport: asyncio.Transport, message: str) -> None:
    """The refusal in plain HTTP/1.1, written before the client's request is read (as servers
    do for 503 and 408), then the connection closed."""
    body = f"{message}\n".encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Retry-After: {_RETRY_AFTER_SECONDS}\r\n"
        "Connection: close\r\n\r\n"
    )
    transport.write(head.encode() + body)
    transport.close()
