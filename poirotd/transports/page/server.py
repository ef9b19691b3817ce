"""The operator's page: the investigations list and each investigation (timeline, hazard window,
attribution, radial projection, votes, interrogation threads, findings), live by server-sent
events from the event bus. Served by the daemon on its own port (POIROTD_PAGE_PORT) through the
HTTP transports' server (`transports.http_server`: deadlines, connection caps, TLS), every asset
included: no CDN, nothing fetched from elsewhere, so it works on an air-gapped site.

The HTML is a fixed shell with no data in it; its script asks the JSON API below and puts every
value into the page as text (never as markup), under a Content-Security-Policy that runs only
the daemon's own script. Roles: see `access` (reader, auditor, operator) and `views`.

    GET  /investigations                 the list (filters: state, method, session, component)
    GET  /investigations/latest?...      303 to the newest investigation the filters match
    GET  /investigations/{id}            one investigation
    GET  /login, POST /login, POST /logout
    GET  /api/investigations[/{id}]      the JSON the pages draw
    GET  /api/events?investigation=&after=   server-sent events (ids resume: Last-Event-ID)
    POST /api/investigations/{id}/confirm    an operator's confirmation (POIROTD_PAGE_CONFIRM)
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from poirotd.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServiceError,
)
from poirotd.ingest.session_reads import SessionReads
from poirotd.investigations.service import InvestigationService
from poirotd.model import InvestigationEvent, InvestigationState
from poirotd.observability.metrics import Metrics
from poirotd.transports.http_server import HttpLimits, HttpServer
from poirotd.transports.page import views
from poirotd.transports.page.access import COOKIE, PageAccess, PageRefusedError
from poirotd.transports.security.tls import ServerTls

log = structlog.get_logger(__name__)

# Only the daemon's own script and style; data only from its own API; no frames, no plugins,
# forms post only to itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin keeps the Origin header on the page's own posts (no-referrer would blank it).
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_ASSETS = {
    "page.js": "text/javascript",
    "page.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
_PAGE_SIZE = 50
_MAX_PAGE_SIZE = 200
# The session's messages the timeline shows at most (the first ones: the incident's lead-up).
_TIMELINE_MESSAGES = 500
# A stream sends a comment this often when nothing happens, so proxies keep it open and a
# browser notices a dead connection.
_KEEPALIVE_SECONDS = 15.0
# Events a stream holds for a browser that reads slowly; past it the stream waits (no loss).
_STREAM_BUFFER = 64
_STATUS: dict[type[ServiceError], int] = {
    InvalidArgument: 400,
    NotFound: 404,
    FailedPrecondition: 409,
}


class PageHttp:
    """The page's transport; its lifecycle is the daemon's (transports.lifecycle)."""

    def __init__(
        self,
        investigations: InvestigationService,
        sessions: SessionReads,
        metrics: Metrics,
        limits: HttpLimits,
        access: PageAccess,
        *,
        host: str,
        port: int,
        tls: ServerTls | None = None,
    ) -> None:
        self._service = investigations
        self._sessions = sessions
        self._metrics = metrics
        self._access = access
        self._closing = asyncio.Event()
        self._assets = {
            name: resources.files("poirotd.transports.page").joinpath("assets", name).read_bytes()
            for name in (*_ASSETS, "list.html", "investigation.html", "login.html")
        }
        app = web.Application(middlewares=[self._guard])
        r = app.router
        r.add_get("/", self._home)
        r.add_get("/investigations", self._shell("list.html"))
        r.add_get("/investigations/latest", self._latest)
        r.add_get("/investigations/{id}", self._shell("investigation.html"))
        r.add_get("/login", self._login_form)
        r.add_post("/login", self._sign_in)
        r.add_post("/logout", self._sign_out)
        r.add_get("/assets/{name}", self._asset)
        r.add_get("/api/investigations", self._list)
        r.add_get("/api/investigations/{id}", self._detail)
        r.add_post("/api/investigations/{id}/confirm", self._confirm)
        r.add_get("/api/events", self._events)
        self._server = HttpServer(app, "page", metrics, limits, host=host, port=port, tls=tls)

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self) -> None:
        await self._server.start()

    async def drain(self) -> None:
        """Ends the event streams (a browser reconnects to another replica, or after the
        restart, from the last event it saw); pages and API calls are still answered."""
        self._closing.set()

    async def stop(self, grace: float) -> None:
        self._closing.set()
        await self._server.stop()

    # ------------------------------------------------------------------ every request

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The Host check, the security headers on every answer, refusals as answers."""
        if not self._access.known_host(request):
            response: web.StreamResponse = self._refuse(
                "unknown_host", 421, "this page is served under its own host name only"
            )
        else:
            try:
                response = await handler(request)
            except PageRefusedError as refused:
                response = refused.response
            except web.HTTPException as exc:  # redirects, 404: aiohttp answers them
                _secure(exc)
                raise
        if not response.prepared:
            _secure(response)
        return response

    def _refuse(self, reason: str, status: int, text: str) -> web.Response:
        self._metrics.page_refusals.labels(reason).inc()
        log.warning("page request refused", reason=reason, detail=text)
        return web.Response(status=status, text=f"{text}\n")

    def _post_from_page(self, request: web.Request) -> None:
        if not self._access.same_origin(request):
            raise PageRefusedError(
                self._refuse(
                    "cross_site", 403, "refused: this post does not come from the page itself"
                )
            )

    # ------------------------------------------------------------------ pages and assets

    async def _home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/investigations")

    def _shell(self, name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def shell(request: web.Request) -> web.StreamResponse:
            if not self._access.has_credentials(request):
                raise web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
            return web.Response(body=self._assets[name], content_type="text/html")

        return shell

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _ASSETS:
            raise web.HTTPNotFound()
        response = web.Response(body=self._assets[name], content_type=_ASSETS[name])
        response.headers["Cache-Control"] = "no-cache"
        return response

    async def _latest(self, request: web.Request) -> web.StreamResponse:
        """A deep link for alerts and dashboards, which know a component or a session but no
        investigation id: the newest investigation the filters match, else the filtered list."""
        self._access.viewer(request)
        found, _ = await self._find(request, limit=1)
        if found:
            raise web.HTTPSeeOther(f"/investigations/{found[0]['investigation_id']}")
        raise web.HTTPSeeOther("/investigations?" + urlencode(dict(request.query)))

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        if not self._access.asks_credentials:
            raise web.HTTPSeeOther("/investigations")
        page = self._assets["login.html"].decode()
        failed = "error" in request.query
        page = page.replace("{{next}}", html.escape(_local_path(request.query.get("next", ""))))
        page = page.replace(
            "{{message}}",
            "That token is not known, or it may not read investigations." if failed else "",
        )
        return web.Response(text=page, content_type="text/html")

    async def _sign_in(self, request: web.Request) -> web.StreamResponse:
        self._post_from_page(request)
        form = await request.post()
        token, target = str(form.get("token", "")).strip(), _local_path(str(form.get("next", "")))
        if not self._access.asks_credentials:
            raise web.HTTPSeeOther(target)
        identity = self._access.sign_in(token, request.remote or "")
        if identity is None:
            raise web.HTTPSeeOther("/login?" + urlencode({"next": target, "error": "1"}))
        log.info("page sign-in", identity=identity.name)
        response = web.HTTPSeeOther(target)
        self._access.set_cookie(response, token)
        raise response

    async def _sign_out(self, request: web.Request) -> web.StreamResponse:
        self._post_from_page(request)
        response = web.HTTPSeeOther("/login" if self._access.asks_credentials else "/")
        response.del_cookie(COOKIE, path="/")
        raise response

    # ------------------------------------------------------------------ the API

    async def _list(self, request: web.Request) -> web.StreamResponse:
        viewer = self._access.viewer(request)
        found, token = await self._find(request, limit=_page_size(request))
        return _json(
            {
                "viewer": viewer.json(),
                "system": self._service.spec.system.name,
                "investigations": found,
                "next_page_token": token,
                "last_event_id": await self._service.latest_event_id(),
            }
        )

    async def _find(
        self, request: web.Request, *, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        q = request.query
        state = q.get("state") or None
        if state is not None and state not in InvestigationState.__members__.values():
            raise PageRefusedError(
                self._refuse("bad_request", 400, f"unknown state {state[:40]!r}")
            )
        component = q.get("component", "")
        try:
            found, token = await self._service.list(
                session_id=q.get("session") or None,
                state=InvestigationState(state) if state else None,
                page_size=limit if not component else _MAX_PAGE_SIZE,
                page_token=q.get("page_token") or None,
                method=q.get("method") or None,
            )
        except ServiceError as error:
            raise PageRefusedError(self._error("page.list", error)) from None
        if component:
            found = [i for i in found if views.blames(i, component)][:limit]
        return [views.summary(i) for i in found], token

    async def _detail(self, request: web.Request) -> web.StreamResponse:
        viewer = self._access.viewer(request)
        investigation_id = request.match_info["id"]
        try:
            inv = await self._service.get(investigation_id)
            events = await self._service.history(investigation_id)
            exchanges = (
                await self._service.exchanges(investigation_id) if viewer.exchanges else None
            )
        except ServiceError as error:
            raise PageRefusedError(self._error("page.get", error)) from None
        messages = None
        if viewer.exchanges:
            messages, _ = await self._sessions.messages(
                inv.session_id, from_index=0, limit=_TIMELINE_MESSAGES
            )
        rules = self._service.spec.rules
        rule = next((r for r in rules if inv.trigger and r.name == inv.trigger.rule), None)
        readings: list[Any] = []
        if inv.trigger is not None:
            signal = views.signal_of(inv.trigger, rule)
            if signal is not None:
                since, until = views.window_of(inv.trigger, rule)
                readings = await self._sessions.series(inv.session_id, *signal, since, until)
        body = views.detail(
            inv, events, rule=rule, readings=readings, messages=messages, exchanges=exchanges
        )
        return _json({"viewer": viewer.json(), **body})

    async def _confirm(self, request: web.Request) -> web.StreamResponse:
        self._post_from_page(request)
        self._access.viewer(request, "POST /page/confirm")
        if not self._access.confirm:
            raise PageRefusedError(
                self._refuse(
                    "read_only", 403, "this page is read-only (POIROTD_PAGE_CONFIRM is off)"
                )
            )
        try:
            body = await request.json()
            regions = [str(r) for r in body["region_ids"]]
            note, supersede = str(body.get("note", "")), bool(body.get("supersede", False))
        except (ValueError, KeyError, TypeError):
            raise PageRefusedError(
                self._refuse(
                    "bad_request", 400, "expected JSON {region_ids: [...], note, supersede}"
                )
            ) from None
        try:
            record, changed = await self._service.confirm_outcome(
                request.match_info["id"], regions, note, supersede=supersede
            )
        except ServiceError as error:
            raise PageRefusedError(self._error("page.confirm", error)) from None
        assert record.confirmed is not None, "confirm_outcome returns the confirmed record"
        return _json(
            {"confirmed": record.confirmed.model_dump(mode="json"), "newly_confirmed": changed}
        )

    def _error(self, call: str, error: ServiceError) -> web.Response:
        status = next((s for kind, s in _STATUS.items() if isinstance(error, kind)), 503)
        self._metrics.requests_rejected.labels(call, error.reason).inc()
        return web.Response(status=status, text=f"{error}\n")

    # ------------------------------------------------------------------ server-sent events

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Stored events after `after` (or Last-Event-ID, as a reconnecting EventSource sends
        it), then live ones, until the browser goes or the daemon drains."""
        self._access.viewer(request)
        investigation_id = request.query.get("investigation") or None
        try:
            after = int(request.headers.get("Last-Event-ID") or request.query.get("after") or 0)
        except ValueError:
            raise PageRefusedError(
                self._refuse("bad_request", 400, "after must be an event id")
            ) from None
        try:
            if investigation_id is not None:
                await self._service.get(investigation_id)
        except ServiceError as error:
            raise PageRefusedError(self._error("page.events", error)) from None
        response = web.StreamResponse(
            headers={
                **SECURITY_HEADERS,
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        buffer: asyncio.Queue[InvestigationEvent] = asyncio.Queue(_STREAM_BUFFER)
        feed = asyncio.create_task(self._feed(buffer, after, investigation_id))
        closing = asyncio.create_task(self._closing.wait())
        self._metrics.page_streams.inc()
        try:
            while not closing.done():
                got = asyncio.create_task(buffer.get())
                done, _ = await asyncio.wait(
                    {got, closing}, timeout=_KEEPALIVE_SECONDS, return_when="FIRST_COMPLETED"
                )
                if got not in done:
                    got.cancel()
                    if not closing.done():
                        await response.write(b": keep-alive\n\n")
                    continue
                event = got.result()
                data = json.dumps(views.event_json(event), separators=(",", ":"))
                await response.write(
                    f"id: {event.event_id}\nevent: investigation\ndata: {data}\n\n".encode()
                )
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the browser went (or the server stops): nothing to finish
        finally:
            self._metrics.page_streams.dec()
            for task in (feed, closing):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feed
        return response

    async def _feed(
        self,
        buffer: asyncio.Queue[InvestigationEvent],
        after: int,
        investigation_id: str | None,
    ) -> None:
        try:
            async for event in self._service.events(
                after_event_id=after, investigation_id=investigation_id
            ):
                await buffer.put(event)
        except ServiceError as error:
            log.info("page event stream ended", error=str(error))


def _secure(response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("Cache-Control", "no-store")


def _json(body: dict[str, Any]) -> web.Response:
    return web.json_response(body, dumps=lambda b: json.dumps(b, separators=(",", ":")))


def _page_size(request: web.Request) -> int:
    try:
        size = int(request.query.get("page_size", _PAGE_SIZE))
    except ValueError:
        return _PAGE_SIZE
    return max(1, min(size, _MAX_PAGE_SIZE))


def _local_path(target: str) -> str:
    """`target` when it is a path on this page (after sign-in, a browser goes nowhere else);
    else the list."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/investigations"
