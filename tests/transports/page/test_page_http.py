"""The page over HTTP, without a browser: what each role is sent, the sign-in cookie, the refusal
of cross-site posts and foreign Host names, the security headers, the event stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from poirotd.config.settings import Settings
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.page.server import CSP
from poirotd.transports.security.exposure import InsecureBindError, check_exposure
from tests.support.answers import gated
from tests.support.page import (
    AUDITOR,
    OPERATOR,
    PAGE_CLINIC,
    READER,
    open_investigation,
    page_daemon,
    until_succeeded,
)
from tests.support.pki import Pem, Pki, issue, locked_daemon

LINES = [
    ("doctor", "chief", "Gait assessment done."),
    ("chief", "physio", "Plan 2, twenty minutes."),
    ("physio", "chief", "Agreed."),
]


def page_url(daemon: Daemon, path: str) -> str:
    return f"http://127.0.0.1:{daemon.page_port}{path}"


def refusals(daemon: Daemon, reason: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_page_requests_refused_total", {"reason": reason}
    )
    return value or 0.0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@contextlib.asynccontextmanager
async def finished_investigation(
    tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[Daemon, str]]:
    """A page daemon whose rule opened an investigation of LINES, which succeeded."""
    async with page_daemon(tmp_path, ScriptedBackend(schema_answer), **settings) as (d, client):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)
        yield d, inv.investigation_id


async def get_json(
    http: aiohttp.ClientSession, url: str, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(url, headers=headers) as response:
        body = await response.text()
        return response.status, json.loads(body) if response.status == 200 else body


async def test_a_reader_is_sent_no_exchange_nor_message_and_an_auditor_is(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with finished_investigation(tmp_path, locked=True) as (daemon, investigation_id):
        url = page_url(daemon, f"/api/investigations/{investigation_id}")
        status, reader = await get_json(http, url, READER)
        assert status == 200
        assert reader["threads"] is None
        assert not [i for i in reader["timeline"] if i["kind"] in ("message", "tool")]
        assert reader["votes"] and reader["attribution"] is not None
        status, auditor = await get_json(http, url, AUDITOR)
        assert status == 200
        assert auditor["threads"], "an auditor sees the interrogation"
        texts = [i["text"] for i in auditor["timeline"] if i["kind"] == "message"]
        assert texts == [line[2] for line in LINES]
        assert (await get_json(http, url))[0] == 401
        assert (await get_json(http, url, "not-a-token"))[0] == 401


async def test_sign_in_sets_a_script_proof_same_site_cookie_and_keeps_redirects_local(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with page_daemon(tmp_path, ScriptedBackend(schema_answer), locked=True) as (daemon, _):
        origin = page_url(daemon, "")
        async with http.get(page_url(daemon, "/investigations"), allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"].startswith("/login?next=")
        form = {"token": READER, "next": "//evil.example/x"}
        async with http.post(
            page_url(daemon, "/login"), data=form, headers={"Origin": origin}, allow_redirects=False
        ) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/investigations"
            cookie = r.headers["Set-Cookie"]
        assert cookie.startswith(f"poirotd_page={READER};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP on loopback: a Secure cookie would be dropped
        headers = {"Cookie": f"poirotd_page={READER}"}
        async with http.get(page_url(daemon, "/api/investigations"), headers=headers) as r:
            assert r.status == 200
            assert (await r.json())["viewer"] == {
                "name": "rita",
                "exchanges": False,
                "confirm": False,
                "signed_in": True,
            }
        bad = {"token": "guess", "next": "/investigations"}
        async with http.post(
            page_url(daemon, "/login"), data=bad, headers={"Origin": origin}, allow_redirects=False
        ) as r:
            assert "error=1" in r.headers["Location"] and "Set-Cookie" not in r.headers
        denied = daemon.metrics.registry.get_sample_value(
            "poirot_auth_denials_total", {"rpc": "GET /page", "reason": "unknown_token"}
        )
        assert denied == 1


async def test_a_cross_site_post_is_refused_and_counted(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with finished_investigation(tmp_path, locked=True, page_confirm=True) as (
        daemon,
        investigation_id,
    ):
        url = page_url(daemon, f"/api/investigations/{investigation_id}/confirm")
        body = {"region_ids": ["exo"], "note": "seen on the bench"}
        cookie = {"Cookie": f"poirotd_page={OPERATOR}"}
        for foreign in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {},  # no Origin at all
            {"Origin": page_url(daemon, ""), "Sec-Fetch-Site": "cross-site"},
        ):
            async with http.post(url, json=body, headers=cookie | foreign) as r:
                assert r.status == 403, foreign
        assert refusals(daemon, "cross_site") == 4
        _, record = await get_json(
            http, page_url(daemon, f"/api/investigations/{investigation_id}"), OPERATOR
        )
        assert record["confirmed"] is None
        same = cookie | {"Origin": page_url(daemon, "")}
        async with http.post(url, json=body, headers=same) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["confirmed"]["region_ids"] == ["exo"]
        async with http.post(
            url,
            json=body,
            headers={"Origin": page_url(daemon, "")} | {"Cookie": f"poirotd_page={READER}"},
        ) as r:
            assert r.status == 403  # a reader may not confirm


async def test_the_page_is_read_only_unless_told(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with finished_investigation(tmp_path) as (daemon, investigation_id):
        url = page_url(daemon, f"/api/investigations/{investigation_id}/confirm")
        async with http.post(
            url, json={"region_ids": ["exo"]}, headers={"Origin": page_url(daemon, "")}
        ) as r:
            assert r.status == 403
            assert "read-only" in await r.text()
        assert refusals(daemon, "read_only") == 1
        _, body = await get_json(http, page_url(daemon, f"/api/investigations/{investigation_id}"))
        assert body["viewer"]["confirm"] is False


async def test_without_credentials_only_loopback_host_names_are_served(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A name that resolves to 127.0.0.1 (DNS rebinding) cannot read an unlocked page."""
    async with page_daemon(
        tmp_path, ScriptedBackend(schema_answer), page_external_url="https://poirotd.example"
    ) as (daemon, _):
        url = page_url(daemon, "/api/investigations")
        async with http.get(url, headers={"Host": "attacker.example"}) as r:
            assert r.status == 421
        for host in ("localhost", f"127.0.0.1:{daemon.page_port}", "poirotd.example"):
            async with http.get(url, headers={"Host": host}) as r:
                assert r.status == 200, host
        assert refusals(daemon, "unknown_host") == 1
        info = daemon.metrics.registry.get_sample_value(
            "poirot_page_info", {"url": "https://poirotd.example"}
        )
        assert info == 1


async def test_every_answer_carries_the_security_headers(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with page_daemon(tmp_path, ScriptedBackend(schema_answer)) as (daemon, _):
        for path in (
            "/investigations",
            "/investigations/x",
            "/assets/page.js",
            "/api/investigations",
            "/api/investigations/nope",
            "/nothing",
        ):
            async with http.get(page_url(daemon, path)) as r:
                assert r.headers["Content-Security-Policy"] == CSP, path
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert r.headers["X-Frame-Options"] == "DENY"
        assert "script-src 'self';" in CSP and "unsafe" not in CSP
        async with http.get(page_url(daemon, "/assets/page.js")) as r:
            assert r.status == 200 and r.content_type == "text/javascript"
            assert "innerHTML" not in await r.text()


async def test_events_stream_as_they_are_stored(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    gate = asyncio.Event()
    async with page_daemon(tmp_path, gated(gate)) as (daemon, client):
        inv = await open_investigation(client, LINES)
        url = page_url(daemon, f"/api/events?investigation={inv.investigation_id}&after=0")
        async with http.get(url) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            seen: list[dict[str, Any]] = []
            gate.set()
            async with asyncio.timeout(20):
                async for line in r.content:
                    if line.startswith(b"data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["event"] == "attribution_ready":
                            break
        kinds = [e["event"] for e in seen]
        assert kinds[0] == "started" and kinds.count("vote_cast") == 3
        assert [e["event_id"] for e in seen] == sorted(e["event_id"] for e in seen)


def test_an_exposed_page_needs_tls_and_credentials() -> None:
    with pytest.raises(InsecureBindError, match="POIROTD_PAGE_HOST"):
        check_exposure(Settings(page_port=8080, page_host="0.0.0.0"))
    assert check_exposure(Settings(page_port=0, page_host="0.0.0.0")) == ()


def fetch_over_tls(
    daemon: Daemon, pki: Pki, path: str, pem: Pem | None = None, form: bytes | None = None
) -> tuple[int, dict[str, str], str]:
    """GET (or POST `form`) the page over HTTPS, with a client certificate when given (not
    following redirects)."""
    context = ssl.create_default_context()
    pki.ca.configure_trust(context)
    context.check_hostname = False  # the certificate names SERVER_NAME; we dial 127.0.0.1
    if pem is not None:
        folder = Path(daemon.settings.db_path).parent
        cert, key = folder / "browser.pem", folder / "browser.key"
        cert.write_bytes(pem.cert)
        key.write_bytes(pem.key)
        context.load_cert_chain(cert, key)
    origin = f"https://127.0.0.1:{daemon.page_port}"
    request = urllib.request.Request(origin + path, data=form, headers={"Origin": origin})

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), Stay)
    try:
        with opener.open(request, timeout=5) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


async def test_over_tls_a_client_certificate_is_a_viewer_and_the_cookie_is_secure(
    tmp_path: Path,
) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access(
        {READER: ("rita", ["reader"])},
        {"dns:auditor.clinic.test": ("aldo", ["auditor"])},
    )
    async with locked_daemon(
        tmp_path,
        pki,
        auth_file=pki.auth_file,
        tls_client_ca_file=pki.ca_file,
        page_port=free_port(),
    ) as daemon:
        auditor = issue(pki.ca, "auditor.clinic.test")
        status, _, body = await asyncio.to_thread(
            fetch_over_tls, daemon, pki, "/api/investigations", auditor
        )
        assert status == 200
        assert json.loads(body)["viewer"] == {
            "name": "aldo",
            "exchanges": True,
            "confirm": False,
            "signed_in": False,
        }
        stranger = issue(pki.ca, "stranger.clinic.test")
        status, _, _ = await asyncio.to_thread(
            fetch_over_tls, daemon, pki, "/api/investigations", stranger
        )
        assert status == 401
        form = f"token={READER}&next=/investigations".encode()
        status, headers, _ = await asyncio.to_thread(
            fetch_over_tls, daemon, pki, "/login", stranger, form
        )
        assert status == 303
        assert "Secure" in headers["Set-Cookie"] and "HttpOnly" in headers["Set-Cookie"]


async def test_a_browser_still_following_does_not_hold_the_daemon_at_stop(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    settings = Settings(
        db_path=tmp_path / "poirotd.db", grpc_port=0, metrics_port=0, page_port=free_port()
    )
    daemon = Daemon(settings, PAGE_CLINIC, backend=ScriptedBackend(schema_answer))
    await daemon.start()
    response = await http.get(page_url(daemon, "/api/events?after=0"))
    assert response.status == 200
    assert daemon.metrics.registry.get_sample_value("poirot_page_event_streams") == 1
    loop = asyncio.get_running_loop()
    started = loop.time()
    await daemon.stop()
    assert loop.time() - started < 5  # aiohttp waits up to 60 s for a handler still running
    assert await response.content.read() == b""  # the stream ended
    assert daemon.metrics.registry.get_sample_value("poirot_page_event_streams") == 0
    response.release()


async def test_the_deep_link_lands_on_the_newest_investigation_blaming_a_component(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """What alerts and dashboard panels link to: they know a component, not an id."""
    async with finished_investigation(tmp_path) as (daemon, investigation_id):
        link = "/investigations/latest?component=doctor&state=succeeded"
        async with http.get(page_url(daemon, link), allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == f"/investigations/{investigation_id}"
        nobody = "/investigations/latest?component=exo&state=succeeded"
        async with http.get(page_url(daemon, nobody), allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/investigations?component=exo&state=succeeded"
        _, listed = await get_json(http, page_url(daemon, "/api/investigations?component=exo"))
        assert listed["investigations"] == []
        _, listed = await get_json(http, page_url(daemon, "/api/investigations?state=bogus"))
        assert "unknown state" in listed
        assert refusals(daemon, "bad_request") == 1
