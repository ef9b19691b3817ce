"""What only the PostgreSQL store has, on a real server: migrations, several daemons writing one
database (one chain, sessions seen across them), and `poirotd audit` given a URL."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from poirotd.cli.main import app
from poirotd.devtools.postgres import PostgresServer
from poirotd.model import SessionEnd
from poirotd.store import PostgresStore, UnknownSessionError
from poirotd.store.audit import AuditError, verify
from poirotd.store.faults import StoreUnreachable
from poirotd.store.pg_schema import CHAIN_LOCK, MIGRATIONS, SCHEMA_VERSION, NewerSchemaError
from tests.support.store import T0, investigation, message, queue, session
from tests.support.stores import PostgresDb, write_as_a_daemon
from tests.support.waiting import eventually


def migrations(url: str) -> list[tuple[int, str]]:
    return PostgresDb(url).query("SELECT version, description FROM schema_migrations")


async def test_a_new_database_is_migrated_once(postgres_url: str) -> None:
    await (await PostgresStore.open(postgres_url, where="db")).close()
    await (await PostgresStore.open(postgres_url, where="db")).close()
    assert migrations(postgres_url) == [(m.version, m.description) for m in MIGRATIONS]
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


async def test_daemons_starting_together_migrate_it_once(postgres_url: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(postgres_url, where="db") for _ in range(4)))
    for store in stores:
        await store.close()
    assert [version for version, _ in migrations(postgres_url)] == [m.version for m in MIGRATIONS]


async def test_refuses_a_database_from_a_newer_schema(postgres_url: str) -> None:
    await (await PostgresStore.open(postgres_url, where="db")).close()
    PostgresDb(postgres_url).query(
        "INSERT INTO schema_migrations (version, description) VALUES (99, 'future')"
    )
    with pytest.raises(NewerSchemaError, match="the db has schema version 99; this poirotd"):
        await PostgresStore.open(postgres_url, where="the db")
    audits = f"schema version 99; this poirotd audits version {SCHEMA_VERSION}"
    with pytest.raises(AuditError, match=audits):
        verify(postgres_url)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_concurrent_writer_processes_keep_one_chain(postgres_url: str) -> None:
    """Three daemon processes write one database at once: the chain stays one total order
    (verify), nothing is lost, and event ids commit in the order they are assigned."""
    writers, rounds = 3, 25
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=write_as_a_daemon, args=(postgres_url, f"w{n}", rounds))
        for n in range(writers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(100)
        assert process.exitcode == 0
    report = verify(postgres_url)
    assert report.ok, report.summary()
    # Per writer: its session, then per round a message block, an investigation, an event and
    # an exchange.
    assert report.entries == writers * (1 + 4 * rounds)
    db = PostgresDb(postgres_url)
    events = [
        int(ref) for (ref,) in db.query("SELECT ref FROM audit WHERE kind = 'event' ORDER BY seq")
    ]
    assert events == sorted(events) == list(range(1, writers * rounds + 1))
    # The writers' transactions interleaved: the chain is not three runs one after the other.
    kinds = [
        ref.split("-")[0]
        for (ref,) in db.query("SELECT ref FROM audit WHERE kind = 'investigation' ORDER BY seq")
    ]
    switches = sum(a != b for a, b in itertools.pairwise(kinds))
    assert switches > writers - 1


async def test_a_session_started_through_another_daemon_is_accepted(postgres_url: str) -> None:
    first = await PostgresStore.open(postgres_url, where="db")
    second = await PostgresStore.open(postgres_url, where="db")
    try:
        await first.commit_ingest([session("s1")])
        assert not second.has_session("s1")  # memory: it has not seen it
        await second.commit_ingest([message(0)])  # looked up in the commit's transaction
        assert second.has_session("s1")
        await first.commit_ingest([session("s2")])
        assert await second.find_session("s2") and second.has_session("s2")
        assert not await second.find_session("ghost")
        with pytest.raises(UnknownSessionError, match="'ghost'"):
            await second.commit_ingest([message(1), message(0, sid="ghost")])
        assert await first.session_messages("s1") == [message(0)]
    finally:
        await first.close()
        await second.close()


def test_audit_names_a_database_url_without_its_password(postgres: PostgresServer) -> None:
    runner = CliRunner()
    secret = "hunter2-secret"
    closed = f"postgresql://poirot:{secret}@127.0.0.1:1/none"
    result = runner.invoke(app, ["audit", "verify", "--db-url", closed])
    assert result.exit_code == 2
    assert "cannot connect to postgresql://poirot:***@127.0.0.1:1/none" in result.stderr
    assert secret not in result.output
    for args, problem in (
        (["--db-url", "mysql://x@y/z"], "starts with postgresql://"),
        (["--db-url", "postgresql://h:port/z"], "not a PostgreSQL URL"),
        (["--db-url", postgres.url("postgres"), "--db", "x.db"], "one of them"),
        ([], "one of them"),
        ([*("--db-url", postgres.url("postgres"))], "cannot be read"),  # not a store
    ):
        result = runner.invoke(app, ["audit", "verify", *args], env={"POIROTD_DB_URL": None})
        assert result.exit_code == 2 and problem in result.stderr, (args, result.stderr)


async def test_audit_reads_the_password_from_a_file(postgres_url: str, tmp_path: Path) -> None:
    """The server trusts loopback, so any password works; a missing file is an error."""
    await (await PostgresStore.open(postgres_url, where="db")).close()
    password = tmp_path / "password"
    password.write_text("ignored-by-trust\n")
    runner = CliRunner()
    args = ["audit", "verify", "--db-url", postgres_url, "--db-password-file"]
    assert runner.invoke(app, [*args, str(password)]).exit_code == 0
    missing = runner.invoke(app, [*args, str(password) + ".nope"])
    assert missing.exit_code == 2 and "No such file" in missing.stderr


async def test_a_session_another_daemon_started_can_be_ended(postgres_url: str) -> None:
    first = await PostgresStore.open(postgres_url, where="db")
    second = await PostgresStore.open(postgres_url, where="db")
    try:
        await first.commit_ingest([session("s1")])
        await second.commit_ingest([SessionEnd(session_id="s1", ended_at=T0)])
        stored = await first.get_session("s1")
        assert stored is not None and stored.ended_at == T0
    finally:
        await first.close()
        await second.close()
    assert PostgresDb(postgres_url).query("SELECT kind, ref FROM audit ORDER BY seq") == [
        ("session", "s1"),
        ("session", "s1"),
    ]


async def test_a_connection_lost_while_idle_is_replaced_before_the_next_write(
    postgres_url: str,
) -> None:
    """A server restart, a failover or an idle timeout ends the store's idle connections: the
    next write goes on a new one rather than failing (an investigation's write would fail the
    investigation), and a read is tried once more."""
    store = await PostgresStore.open(postgres_url, where="db")
    try:
        await store.commit_ingest([session("s1")])
        _terminate_others(postgres_url)
        await asyncio.sleep(0.2)  # the server's error and its end of the stream arrive
        await store.commit_ingest([message(0)])
        assert store.faults.availability.up
        assert await store.session_messages("s1") == [message(0)]
    finally:
        await store.close()
    assert verify(postgres_url).ok


async def test_a_connection_lost_in_a_write_fails_it_and_the_next_call_reconnects(
    postgres_url: str,
) -> None:
    store = await PostgresStore.open(postgres_url, where="db")
    try:
        await store.commit_ingest([session("s1")])
        with psycopg.connect(postgres_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (CHAIN_LOCK,))
            write = asyncio.create_task(store.commit_ingest([message(0)]))
            await asyncio.sleep(0.3)  # the write's transaction waits for the chain's lock
            _terminate_others(postgres_url, but=holder.info.backend_pid)
            with pytest.raises(StoreUnreachable) as lost:
                await write  # not acknowledged (UNAVAILABLE): its producer sends it again
            assert lost.value.kind == "connection_lost"
            assert not store.faults.availability.up
        await store.commit_ingest([message(0)])
        assert await store.session_messages("s1") == [message(0)]
    finally:
        await store.close()
    assert verify(postgres_url).ok


def _terminate_others(url: str, but: int = 0) -> None:
    """Ends the database's other connections, as a server restart would."""
    PostgresDb(url).query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> ?",
        but,
    )


async def test_long_records_are_compressed_with_lz4(postgres_url: str) -> None:
    store = await PostgresStore.open(postgres_url, where="db")
    try:
        await store.commit_ingest([session("s1"), *(message(i) for i in range(200))])
    finally:
        await store.close()
    db = PostgresDb(postgres_url)
    assert db.query("SELECT pg_column_compression(record) FROM message_blocks") == [("lz4",)]
    assert db.query(
        "SELECT pg_column_compression(payload) FROM audit WHERE kind = 'message_block'"
    ) == [("lz4",)]


def test_audit_does_not_repeat_a_password_libpq_cannot_decode() -> None:
    """libpq's error quotes the percent-encoded token it cannot decode: here, the password."""
    secret = "pw%zz-secret"
    for url in (
        f"postgresql://poirot:{secret}@127.0.0.1:1/none",
        f"postgresql://poirot@127.0.0.1:1/none?password={secret}",
    ):
        result = CliRunner().invoke(app, ["audit", "verify", "--db-url", url])
        assert result.exit_code == 2 and "cannot connect to postgresql://poirot" in result.stderr
        assert secret not in result.output, result.output


async def test_a_change_while_the_listener_reconnects_still_wakes_the_waiters(
    postgres_url: str,
) -> None:
    """A notification sent while no connection listens reaches no one: once listening again,
    the store wakes its waiters to read for themselves, rather than leave them to their bound."""
    db = PostgresDb(postgres_url)
    listening = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND state = 'idle'"
    waiter = await PostgresStore.open(postgres_url, where="db")
    writer = await PostgresStore.open(postgres_url, where="db")
    try:
        await writer.commit_ingest([session("s1")])
        waiter.change_mark()
        async with asyncio.timeout(10):
            await eventually(lambda: bool(db.query(listening)))
        mark = waiter.change_mark()
        db.query(f"SELECT pg_terminate_backend(pid) FROM ({listening}) AS listener")
        await asyncio.sleep(0.2)  # the listener finds its connection lost, and pauses
        await queue(writer, investigation("i1"))  # notified to no one
        async with asyncio.timeout(10):
            await waiter.wait_for_change(mark)
    finally:
        await waiter.close()
        await writer.close()


async def test_connections_notice_a_dead_peer_and_end_a_stalled_transaction(
    postgres_url: str,
) -> None:
    """TCP keepalives and a user timeout unless the URL sets its own, and the server told to end
    a session left idle inside a transaction (it would hold the chain lock for every replica)."""
    joined = "&" if "?" in postgres_url else "?"
    store = await PostgresStore.open(f"{postgres_url}{joined}keepalives_idle=45", where="db")
    try:
        conn = store._writer  # the daemon's own connection, as libpq and the server see it
        parameters = conn.info.get_parameters()
        assert parameters["keepalives"] == "1" and parameters["keepalives_idle"] == "45"
        assert parameters["tcp_user_timeout"] == "60000"
        shown = await (await conn.execute("SHOW idle_in_transaction_session_timeout")).fetchone()
        assert shown == ("1min",)
    finally:
        await store.close()
