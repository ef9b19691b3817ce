"""The page under test: a clinic whose exoskeleton's overheating opens an investigation, a
daemon serving the page on a loopback port, and a real headless Chromium (Debian's `chromium`
and `chromium-driver`, driven by Selenium through /usr/bin/chromedriver: nothing downloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import clinic
from poirotd.devtools.ingest_requests import OVERHEAT
from poirotd.devtools.process import free_port
from poirotd.llm.base import LLMBackend
from poirotd.transports.security.access import token_hash
from tests.support.daemon import in_process_daemon
from tests.support.waiting import eventually

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The flags that run Chromium here: headless, no sandbox (root in a container), no GPU, and none
# of its own network traffic (updates, sync, QUIC probes).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
# The clinic with a rule on its exoskeleton's motor temperature: `heating` readings fire it.
PAGE_CLINIC = clinic(rules=[OVERHEAT])
SESSION = "ward-3"


def at(t0: datetime, seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(t0 + timedelta(seconds=seconds))
    return stamp


def conversation(
    t0: datetime,
    lines: Sequence[tuple[str, str, str]],
    session_id: str = SESSION,
    system: str = "clinic",
) -> list[pb.IngestRequest]:
    """The session's start and its messages (sender, recipient, content), a second apart."""
    requests = [
        pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system=system))
    ]
    for index, (sender, recipient, content) in enumerate(lines):
        requests.append(
            pb.IngestRequest(
                agent_message=pb.AgentMessage(
                    session_id=session_id,
                    index=index,
                    kind=pb.MESSAGE_KIND_AGENT,
                    sender=sender,
                    recipient=recipient,
                    content=content,
                    sent_at=at(t0, index),
                )
            )
        )
    return requests


def heating(t0: datetime, start: float, session_id: str = SESSION) -> list[pb.IngestRequest]:
    """Motor temperature readings from `start` s after t0, one every half second, that climb
    past OVERHEAT's 70 °C (the last ones fire it)."""
    values = [52.0 + 0.4 * i + (0.8 if i % 3 == 0 else 0.0) for i in range(40)]
    values += [69.0, 71.5, 74.0, 76.2]
    return [
        pb.IngestRequest(
            telemetry=pb.TelemetrySample(
                session_id=session_id,
                component="exo",
                signal="motor_temp_c",
                value=value,
                measured_at=at(t0, start + 0.5 * i),
            )
        )
        for i, value in enumerate(values)
    ]


async def open_investigation(
    client: PoirotClient, lines: Sequence[tuple[str, str, str]]
) -> pb.Investigation:
    """Streams the conversation and the heating; returns the investigation the rule opened."""
    t0 = datetime.now(UTC) - timedelta(minutes=2)
    await client.send([*conversation(t0, lines), *heating(t0, len(lines) + 2)])

    async def opened() -> bool:
        return bool((await client.list_investigations(session_id=SESSION)).investigations)

    async with asyncio.timeout(20):
        await eventually(opened)
    return (await client.list_investigations(session_id=SESSION)).investigations[0]


# Tokens the locked page daemon's access file grants, by the role they hold.
READER, AUDITOR, OPERATOR = "reader-token-0123456789", "auditor-token-0123456789", "op-token-0123"
_FEEDER = "feeder-token-0123456789"
ACCESS = {
    READER: ("rita", ["reader"]),
    AUDITOR: ("aldo", ["auditor"]),
    OPERATOR: ("olga", ["operator", "reader"]),
    _FEEDER: ("feeder", ["ingest", "reader"]),
}


async def until_succeeded(client: PoirotClient, investigation_id: str) -> None:
    async def done() -> bool:
        state = (await client.get(investigation_id)).state
        return bool(state == pb.INVESTIGATION_STATE_SUCCEEDED)

    async with asyncio.timeout(20):
        await eventually(done)


@contextlib.asynccontextmanager
async def page_daemon(
    tmp_path: Path,
    backend: LLMBackend,
    spec: SystemSpec = PAGE_CLINIC,
    *,
    locked: bool = False,
    **settings: Any,
) -> AsyncIterator[tuple[Daemon, PoirotClient]]:
    """A daemon serving the page on a free loopback port, and a gRPC client of it that may
    ingest and read. `locked`: with an access file granting ACCESS's tokens."""
    if locked:
        access = tmp_path / "access.yaml"
        grants = {token_hash(t): {"name": n, "roles": r} for t, (n, r) in ACCESS.items()}
        access.write_text(yaml.safe_dump({"tokens": grants}))
        settings["auth_file"] = access
    async with (
        in_process_daemon(tmp_path, spec, backend, page_port=free_port(), **settings) as daemon,
        PoirotClient(f"127.0.0.1:{daemon.grpc_port}", token=_FEEDER if locked else None) as client,
    ):
        yield daemon, client


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium with a fresh profile, its console log readable
    (`driver.get_log("browser")`); skips where Debian's chromium is not installed."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip(
            "Debian's `chromium` and `chromium-driver` are not installed (make installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="poirotd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
