"""Who looks at the page, and whether a request comes from the page itself.

A browser shows the same credentials as any client: a client certificate (mTLS), or a bearer
token. A person types their token once into the sign-in form; the page keeps it in a cookie
the browser sends back and no script can read (HttpOnly, SameSite=Strict, Secure over HTTPS),
and each request is checked against the access file as it is then, so a token taken out of the
file stops working at once. An `Authorization: Bearer` header works too (curl, a proxy).

Cross-site requests: a post (sign-in, confirmation) must come from the page's own origin: its
Origin header must name the host the request was sent to (or POIROTD_PAGE_EXTERNAL_URL), and a
browser's Sec-Fetch-Site must not say cross-site. With the SameSite=Strict cookie, which a
browser never sends along with another site's request, that makes two locks. Without an access
policy (loopback, no credentials), a request whose Host is not a loopback name nor the external
URL's is refused, so that a site whose name resolves to 127.0.0.1 (DNS rebinding) cannot read
the page from a browser on the same machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from poirotd.transports.page.views import Viewer
from poirotd.transports.security.access import AccessControl, AccessDeniedError, Identity
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.http import CHALLENGE, client_certificate
from poirotd.transports.security.roles import REQUIRED, Role

COOKIE = "poirotd_page"
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class PageRefusedError(Exception):
    """A request the page does not serve: the answer to give."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


@dataclass(frozen=True)
class PageAccess:
    """The access policy (None: no credentials asked, every viewer may do everything the page
    allows) and where refusals are recorded; `confirm`: the page takes confirmations."""

    access: AccessControl | None
    denials: DenialRecorder | None
    confirm: bool
    tls: bool
    external_url: str

    @property
    def asks_credentials(self) -> bool:
        return self.access is not None

    def has_credentials(self, request: web.Request) -> bool:
        """Whether the request carries any credentials (else a page sends them to sign in)."""
        return (
            self.access is None
            or "Authorization" in request.headers
            or bool(request.cookies.get(COOKIE))
            or _peercert(request) is not None
        )

    def identity(self, request: web.Request) -> Identity:
        """Who the request's credentials name; raises AccessDeniedError when it carries none or
        the access file does not know them."""
        if self.access is None:
            return Identity("anyone (no access policy)", frozenset(Role), "token")
        authorization = request.headers.get("Authorization")
        cookie = request.cookies.get(COOKIE)
        if authorization is None and cookie:
            authorization = f"Bearer {cookie}"
        return self.access.policy().identify(authorization, client_certificate(_peercert(request)))

    def viewer(self, request: web.Request, call: str = "GET /page") -> Viewer:
        """The viewer a data request is made for, once it holds `call`'s role; raises
        PageRefusedError (401 or 403, recorded like every transport's refusals) otherwise."""
        try:
            identity = self.identity(request)
            identity.require(_role(call), call)
        except AccessDeniedError as denied:
            if self.denials is not None:
                self.denials.record(denied, transport="page", call=call, peer=request.remote or "")
            if denied.reason.authenticated:
                raise PageRefusedError(web.Response(status=403, text=f"{denied}\n")) from None
            raise PageRefusedError(
                web.Response(status=401, text=f"{denied}\n", headers=CHALLENGE)
            ) from None
        return Viewer(
            name=identity.name,
            exchanges=_role("GET /page/exchanges") in identity.roles,
            confirm=self.confirm and _role("POST /page/confirm") in identity.roles,
            signed_in=self.access is not None
            and bool(request.cookies.get(COOKIE))
            and "Authorization" not in request.headers,
        )

    def sign_in(self, token: str, peer: str) -> Identity | None:
        """Who a token typed into the sign-in form names, when it may read the page; else None,
        the refusal recorded like a request's."""
        assert self.access is not None, "the form is shown only under an access policy"
        try:
            identity = self.access.policy().identify(f"Bearer {token}", None)
            identity.require(_role("GET /page"), "GET /page")
        except AccessDeniedError as denied:
            if self.denials is not None:
                self.denials.record(denied, transport="page", call="GET /page", peer=peer)
            return None
        return identity

    def known_host(self, request: web.Request) -> bool:
        """Whether the request's Host may be served (always, under an access policy)."""
        if self.access is not None:
            return True
        host = (urlsplit(f"//{request.host}").hostname or "").lower()
        external = (urlsplit(self.external_url).hostname or "").lower()
        return host in _LOOPBACK_HOSTS or (bool(external) and host == external)

    def same_origin(self, request: web.Request) -> bool:
        """Whether a post comes from the page itself (see the module's docstring)."""
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            return False
        origin = request.headers.get("Origin")
        if origin is None or origin == "null":
            return False
        own = f"{'https' if self.tls else 'http'}://{request.host}"
        allowed = {own.lower()}
        if self.external_url:
            allowed.add(self.external_url.rstrip("/").lower())
        return origin.rstrip("/").lower() in allowed

    def set_cookie(self, response: web.StreamResponse, token: str) -> None:
        """The sign-in cookie: script-proof, never sent by another site's request, and only
        over HTTPS when the page is served (or reached) over it. It lasts the browser session."""
        secure = self.tls or self.external_url.startswith("https://")
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="Strict", secure=secure or None, path="/"
        )


def _role(call: str) -> Role:
    requirement = REQUIRED[call]
    assert requirement is not None, f"{call} is never open"
    return requirement.role


def _peercert(request: web.Request) -> dict[str, object] | None:
    transport = request.transport
    return None if transport is None else transport.get_extra_info("peercert")
