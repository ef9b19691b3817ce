"""The pytest fixtures the tests share, registered by tests/conftest.py.

`daemon` is one in-process daemon per test. A module (or folder) that needs another variant
overrides the fixture it is built from, not `daemon` itself: `daemon_spec` (the clinic),
`daemon_backend` (the scripted schema answers; None builds the spec's own backend) or
`daemon_settings` (Settings fields beyond the loopback ports and the store in tmp_path).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from poirotd.api.client import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.llm.base import LLMBackend
from poirotd.llm.scripted import ScriptedBackend
from tests.support.answers import schema_answer
from tests.support.daemon import client_of, in_process_daemon
from tests.support.mosquitto import Mosquitto
from tests.support.spec import CLINIC


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the `mosquitto` binary is not installed (Debian package `mosquitto`)")
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return CLINIC


@pytest.fixture
def daemon_backend() -> LLMBackend | None:
    return ScriptedBackend(schema_answer)


@pytest.fixture
def daemon_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
async def daemon(
    tmp_path: Path,
    daemon_spec: SystemSpec,
    daemon_backend: LLMBackend | None,
    daemon_settings: dict[str, Any],
) -> AsyncIterator[Daemon]:
    async with in_process_daemon(tmp_path, daemon_spec, daemon_backend, **daemon_settings) as d:
        yield d


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[PoirotClient]:
    async with client_of(daemon) as c:
        yield c
