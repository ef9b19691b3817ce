"""The pytest fixtures the tests share, registered by tests/conftest.py.

`daemon` is one in-process daemon per test. A module (or folder) that needs another variant
overrides the fixture it is built from, not `daemon` itself: `daemon_spec` (the clinic),
`daemon_backend` (the scripted schema answers; None builds the spec's own backend) or
`daemon_settings` (Settings fields beyond the loopback ports and the store in tmp_path).

`postgres` is one real PostgreSQL server for the whole test session (started on first use,
poirotd/devtools/postgres.py; skipped where Debian's `postgresql` is not installed); `postgres_url`
a new empty database on it for one test. `store_db` is one store database per test, on SQLite
and then on PostgreSQL (the test runs once for each): a test of the store port takes it, opens
the store with `await store_db.open()` and looks inside with `store_db.query(...)`.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.llm.base import LLMBackend
from poirotd.llm.scripted import ScriptedBackend
from tests.support.daemon import client_of, in_process_daemon
from tests.support.disk import mounted_small_disk
from tests.support.mosquitto import Mosquitto
from tests.support.stores import PostgresDb, SqliteDb, StoreDb


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the `mosquitto` binary is not installed (Debian package `mosquitto`)")
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bin_dir = server_binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian package `postgresql`)")
    server = PostgresServer(bin_dir, fsync=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> Iterator[str]:
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 8 MiB of the test's own, to fill (tests/support/disk.py)."""
    with mounted_small_disk(tmp_path / "disk") as folder:
        yield folder


@pytest.fixture(params=["sqlite", "postgres"])
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> StoreDb:
    if request.param == "sqlite":
        return SqliteDb(tmp_path / "poirotd.db")
    return PostgresDb(request.getfixturevalue("postgres_url"))


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
