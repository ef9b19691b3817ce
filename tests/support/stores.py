"""One store database as a test sees it, whichever adapter holds it: open the store on it, query
it and tamper with it the way someone with direct access would, name it to `poirotd audit`.

`store_db` (tests/support/fixtures.py) gives a `SqliteDb` and a `PostgresDb` in turn, so a test
written against `StoreDb` runs on both adapters. Queries use `?` placeholders on both.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol

import psycopg

from poirotd.model import LLMExchange, Phase
from poirotd.store import PostgresStore, SqliteStore, Store
from tests.support.store import T0, event, investigation, message, session


class StoreDb(Protocol):
    name: str
    # What `verify` and `export_investigation` take: a file path or a postgresql:// URL.
    target: str

    async def open(self, **options: Any) -> Store:
        """The store on this database; `options` go to the adapter's `open`."""

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]: ...

    def tamper(self, sql: str, *params: object) -> None:
        """Runs `sql` with write access to the database: the append-only guards go first."""

    def cli_args(self) -> list[str]:
        """How `poirotd audit` is told this database."""


class SqliteDb:
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target = str(path)

    async def open(self, **options: Any) -> Store:
        return await SqliteStore.open(self.path, **options)

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(self.path)) as conn:
            return conn.execute(sql, params).fetchall()

    def tamper(self, sql: str, *params: object) -> None:
        with closing(sqlite3.connect(self.path)) as conn, conn:
            conn.execute("DROP TRIGGER IF EXISTS audit_no_update")
            conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")
            conn.execute(sql, params)

    def cli_args(self) -> list[str]:
        return ["--db", self.target]


class PostgresDb:
    name = "postgres"

    def __init__(self, url: str) -> None:
        self.target = url

    async def open(self, **options: Any) -> Store:
        return await PostgresStore.open(self.target, where=self.target, **options)

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.target, autocommit=True) as conn:
            cursor = conn.execute(_pg(sql), params)
            return cursor.fetchall() if cursor.description else []

    async def aquery(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        """`query` without holding up the event loop: a daemon running in the test's process may
        hold the row lock the query waits for, and can only release it if the loop runs."""
        async with await psycopg.AsyncConnection.connect(self.target, autocommit=True) as conn:
            cursor = await conn.execute(_pg(sql), params)
            return await cursor.fetchall() if cursor.description else []

    def tamper(self, sql: str, *params: object) -> None:
        with psycopg.connect(self.target) as conn:
            conn.execute(b"DROP TRIGGER IF EXISTS audit_no_update ON audit")
            conn.execute(b"DROP TRIGGER IF EXISTS audit_no_delete ON audit")
            conn.execute(_pg(sql), params)

    def cli_args(self) -> list[str]:
        return ["--db-url", self.target]


def _pg(sql: str) -> bytes:
    return sql.replace("%", "%%").replace("?", "%s").encode()


def write_as_a_daemon(url: str, name: str, rounds: int) -> None:
    """What one daemon process writes over a shared database, as fast as it can: a session, then
    per round a batch of messages, an investigation, an event and an exchange (run in a process
    of its own by the concurrent writers test)."""
    asyncio.run(_write_as_a_daemon(url, name, rounds))


async def _write_as_a_daemon(url: str, name: str, rounds: int) -> None:
    store = await PostgresStore.open(url, where=url)
    try:
        await store.commit_ingest([session(name)])
        for n in range(rounds):
            await store.commit_ingest([message(n * 3 + i, sid=name) for i in range(3)])
            inv = investigation(f"{name}-{n}", sid=name)
            await store.save_investigation(inv)
            await store.append_event(event(inv.investigation_id))
            await store.record_exchange(
                inv.investigation_id,
                LLMExchange(
                    phase=Phase.VOTING, agent_id="planner", purpose="vote", messages=(), at=T0
                ),
            )
    finally:
        await store.close()
