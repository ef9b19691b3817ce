"""The page in a real headless Chromium (Debian's, driven by Selenium through its chromedriver)
against a real daemon on loopback. The agents' answers come from the scripted backend (the
orchestration's timing and the votes' words are the test's to set); everything the browser
sees is the daemon's own page, API and event stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from poirotd.daemon import Daemon
from poirotd.devtools.answers import fill, schema_answer
from poirotd.devtools.process import free_port
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from tests.support.page import (
    AUDITOR,
    OPERATOR,
    READER,
    SESSION,
    chromium,
    open_investigation,
    page_daemon,
    until_succeeded,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

XSS_SCRIPT = "<script>window.__xss = 1</script>"
XSS_IMG = '<img src=x onerror="window.__xss = 2">'
LINES = [
    ("doctor", "chief", f"Gait assessment done. {XSS_SCRIPT}"),
    ("chief", "physio", f"Plan 2, twenty minutes. {XSS_IMG}"),
    ("physio", "chief", "Agreed."),
]
WAIT_SECONDS = 20


def is_vote(schema: dict[str, Any] | None) -> bool:
    """A Phase III turn (which may vote) or a vote request."""
    return schema is not None and ("anyOf" in schema or "location" in schema.get("properties", {}))


def voting_backend(gate: asyncio.Event | None = None) -> ScriptedBackend:
    """Schema answers whose votes justify themselves with markup, each vote held until `gate`."""

    async def answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        if not is_vote(schema):
            return schema_answer(messages, schema)
        if gate is not None:
            await gate.wait()
        assert schema is not None
        value = fill(schema, prefer="vote")
        value["justification"] = f"The plan was wrong {XSS_IMG} {XSS_SCRIPT}"
        return json.dumps(value)

    return ScriptedBackend(answer)


def base(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.page_port}"


def wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS).until(condition)


def errors(driver: Any) -> list[dict[str, Any]]:
    """What the page logged at error level (a failed load, a CSP violation, a script error)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def count(driver: Any, selector: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll({selector!r}).length"))


def sign_in(driver: Any, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait(driver, lambda d: "/login" in d.current_url)
    driver.find_element(By.NAME, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    wait(driver, lambda d: "/login" not in d.current_url)


async def test_list_and_investigation_pages_load_without_console_errors(tmp_path: Path) -> None:
    async with page_daemon(tmp_path, voting_backend()) as (daemon, client):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)

        def browse() -> None:
            from selenium.webdriver.common.by import By

            with chromium() as driver:
                driver.get(base(daemon) + "/investigations")
                link = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#rows a"))[0]
                assert link.get_attribute("title") == inv.investigation_id
                wait(driver, lambda d: d.find_element(By.ID, "live").text == "live")
                assert errors(driver) == []
                link.click()
                wait(driver, lambda d: count(d, ".vote-card") == 3)
                wait(driver, lambda d: d.find_element(By.ID, "live").text == "live")
                assert count(driver, "#attribution svg rect") == 4
                assert count(driver, "#projection svg polygon") == 1  # the consensus
                assert count(driver, "#telemetry svg polyline") == 1
                assert count(driver, "#telemetry svg line.level") == 1  # the rule's 70 °C
                assert count(driver, "#telemetry svg line.fired") == 1
                assert errors(driver) == []

        await asyncio.to_thread(browse)
        # Another method's findings, drawn from what it recorded: ECHO's consensus first.
        echo = (await client.trigger(SESSION, "second opinion", method="echo")).investigation_id
        await until_succeeded(client, echo)

        def findings() -> None:
            from selenium.webdriver.common.by import By

            with chromium() as driver:
                driver.get(f"{base(daemon)}/investigations/{echo}")
                wait(driver, lambda d: count(d, "#findings h3") == 1)
                assert driver.find_element(By.CSS_SELECTOR, "#findings h3").text == "consensus"
                assert count(driver, "#findings details") >= 2  # panel, context, analyses
                assert errors(driver) == []

        await asyncio.to_thread(findings)


async def test_a_vote_cast_during_the_visit_appears_without_a_reload(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with page_daemon(tmp_path, voting_backend(gate)) as (daemon, client):
        inv = await open_investigation(client, LINES)
        with chromium() as driver:

            def open_page() -> None:
                from selenium.webdriver.common.by import By

                driver.get(f"{base(daemon)}/investigations/{inv.investigation_id}")
                wait(driver, lambda d: d.find_element(By.ID, "live").text == "live")
                assert count(driver, ".vote-card") == 0
                driver.execute_script("window.__same_page = true")

            await asyncio.to_thread(open_page)
            gate.set()

            def votes_arrive() -> None:
                wait(driver, lambda d: count(d, ".vote-card") == 3)
                wait(driver, lambda d: count(d, "#attribution svg rect") == 4)
                assert driver.execute_script("return window.__same_page") is True
                navigations = "return performance.getEntriesByType('navigation').length"
                assert driver.execute_script(navigations) == 1
                assert errors(driver) == []

            await asyncio.to_thread(votes_arrive)


async def test_a_reader_does_not_see_the_exchanges_and_an_auditor_does(tmp_path: Path) -> None:
    async with page_daemon(tmp_path, voting_backend(), locked=True) as (daemon, client):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)
        url = f"{base(daemon)}/investigations/{inv.investigation_id}"

        def look() -> None:
            from selenium.webdriver.common.by import By

            with chromium() as driver:
                sign_in(driver, url, READER)
                wait(driver, lambda d: count(d, ".vote-card") == 3)
                assert not driver.find_element(By.ID, "threads-card").is_displayed()
                assert count(driver, ".timeline li.message") == 0
                assert "auditors only" in driver.find_element(By.ID, "timeline").text
                assert "rita" in driver.find_element(By.ID, "who").text
                driver.find_element(By.CSS_SELECTOR, "#logout button").click()
                wait(driver, lambda d: "/login" in d.current_url)
                sign_in(driver, url, AUDITOR)
                wait(driver, lambda d: count(d, ".vote-card") == 3)
                assert driver.find_element(By.ID, "threads-card").is_displayed()
                assert count(driver, ".thread") == 3
                assert count(driver, ".timeline li.message") == len(LINES)
                assert errors(driver) == []

        await asyncio.to_thread(look)


# Every control a person operates, as the page draws it (hidden ones excluded).
_CONTROLS = """
return [...document.querySelectorAll('a[href], button, input, select, textarea, summary')]
  .filter((e) => e.type !== 'hidden' && e.getClientRects().length > 0);
"""
_FOCUSED = "return arguments[0].indexOf(document.activeElement)"


def tab_through(driver: Any) -> tuple[int, set[int]]:
    """Presses Tab through the page once around; returns how many controls it has and which
    of them took the focus."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    controls = driver.execute_script(_CONTROLS)
    reached: set[int] = set()
    for _ in range(len(controls) + 5):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        reached.add(int(driver.execute_script(_FOCUSED, controls)))
    reached.discard(-1)
    return len(controls), reached


async def test_keyboard_navigation_reaches_every_control(tmp_path: Path) -> None:
    async with page_daemon(tmp_path, voting_backend(), locked=True, page_confirm=True) as (
        daemon,
        client,
    ):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)

        def navigate() -> None:
            from selenium.webdriver.common.by import By

            with chromium() as driver:
                sign_in(driver, f"{base(daemon)}/investigations", OPERATOR)
                wait(driver, lambda d: count(d, "#rows a") == 1)
                controls, reached = tab_through(driver)
                assert controls >= 9  # skip link, brand, sign out, 4 filters, 2 buttons, a row
                assert reached == set(range(controls))
                driver.get(f"{base(daemon)}/investigations/{inv.investigation_id}")
                wait(driver, lambda d: count(d, ".confirm-form input[type=checkbox]") == 4)
                assert driver.find_element(By.ID, "confirm-card").is_displayed()
                controls, reached = tab_through(driver)
                assert controls >= 10
                assert reached == set(range(controls))
                assert errors(driver) == []

        await asyncio.to_thread(navigate)


async def test_agent_text_with_markup_renders_as_text(tmp_path: Path) -> None:
    async with page_daemon(tmp_path, voting_backend()) as (daemon, client):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)

        def look() -> None:
            from selenium.webdriver.common.by import By

            with chromium() as driver:
                driver.get(f"{base(daemon)}/investigations/{inv.investigation_id}")
                wait(driver, lambda d: count(d, ".vote-card") == 3)
                wait(driver, lambda d: count(d, ".timeline li.message") == 3)
                assert driver.execute_script("return window.__xss") is None
                assert count(driver, "#main img") == 0
                assert count(driver, "#main script") == 0
                timeline = driver.find_element(By.ID, "timeline").text
                assert XSS_SCRIPT in timeline and XSS_IMG in timeline
                justification = driver.find_element(By.CSS_SELECTOR, ".justification").text
                assert justification == f"The plan was wrong {XSS_IMG} {XSS_SCRIPT}"
                assert errors(driver) == []

        await asyncio.to_thread(look)


@pytest.fixture
async def other_site() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A site on another origin (localhost, another port) that serves `pages[path]`."""
    pages: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path], content_type="text/html")

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://localhost:{port}", pages
    finally:
        await runner.cleanup()


async def test_a_cross_site_post_is_refused(
    tmp_path: Path, other_site: tuple[str, dict[str, str]]
) -> None:
    """Another site's page posts a confirmation (a form whose text/plain body is JSON) to a
    page that takes confirmations and needs no credentials: refused, nothing confirmed."""
    site, pages = other_site
    async with page_daemon(tmp_path, voting_backend(), page_confirm=True) as (daemon, client):
        inv = await open_investigation(client, LINES)
        await until_succeeded(client, inv.investigation_id)
        action = f"{base(daemon)}/api/investigations/{inv.investigation_id}/confirm"
        pages["/attack"] = (
            f'<form method="post" action="{action}" enctype="text/plain">'
            '<input name=\'{"region_ids": ["exo"], "note": "\' value=\'x"}\'></form>'
            "<script>document.forms[0].submit()</script>"
        )

        def attack() -> str:
            with chromium() as driver:
                driver.get(f"{site}/attack")
                wait(driver, lambda d: d.current_url.startswith(action))
                return str(driver.find_element("tag name", "body").text)

        answer = await asyncio.to_thread(attack)
        assert "does not come from the page itself" in answer
        refused = daemon.metrics.registry.get_sample_value(
            "poirot_page_requests_refused_total", {"reason": "cross_site"}
        )
        assert refused == 1
        assert not (await client.get(inv.investigation_id)).HasField("confirmed")
