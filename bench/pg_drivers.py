"""psycopg 3 or asyncpg for the PostgreSQL store: one durable ingest commit through each driver.

The commit is the store's (poirotd.store.postgres): a transaction that takes the chain's advisory
lock, reads the chain head, adds a batch's message keys (one row each, the dedupe index; one
statement over arrays), stores the block and appends its chain entry, then commits (fsync on).
Both drivers run it on the same server, alternating rounds, so the ratio is measured side by
side.

    nice -n 10 python -m bench.pg_drivers [--batches 200] [--batch 512] [--rounds 5]

The result replaces its section of BENCHMARKS.md, with why psycopg was chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg
import psycopg

from bench import report
from bench.sections.pg_drivers import SECTION, section
from poirotd.devtools.postgres import PostgresServer, server_binaries

_TABLES = """
CREATE TABLE keys (session_id text, idx bigint, PRIMARY KEY (session_id, idx));
CREATE TABLE blocks (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, record text);
CREATE TABLE audit (seq bigint PRIMARY KEY, kind text, ref text, payload text, prev text, hash text)
"""
# The new keys of a batch in one statement: which messages are resends is its answer.
_NEW_KEYS = (
    "INSERT INTO keys SELECT * FROM unnest($1::text[], $2::bigint[])"
    " ON CONFLICT DO NOTHING RETURNING idx"
)
_PSYCOPG_NEW_KEYS = _NEW_KEYS.replace("$1", "%s").replace("$2", "%s")
_HEAD = "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"


def _batch(n: int, batch: int) -> tuple[list[tuple[str, int]], str]:
    keys = [("s1", n * batch + i) for i in range(batch)]
    return keys, "x" * (120 * batch)  # a block record about as long as the messages'


async def _psycopg(url: str, batches: int, batch: int) -> float:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        started = time.perf_counter()
        for n in range(batches):
            keys, record = _batch(n, batch)
            # Pipeline mode: statements whose results are not read yet share a round trip.
            async with conn.pipeline(), conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(1)")
                head = await (await conn.execute(_HEAD)).fetchone()
                seq = head[0] + 1 if head else 1
                sessions, indexes = map(list, zip(*keys, strict=True))
                new = await conn.execute(_PSYCOPG_NEW_KEYS, (sessions, indexes))
                assert len(await new.fetchall()) == batch
                cur = await conn.execute(
                    "INSERT INTO blocks (record) VALUES (%s) RETURNING id", (record,)
                )
                (block,) = await cur.fetchone() or (0,)
                await conn.execute(
                    "INSERT INTO audit VALUES (%s, %s, %s, %s, %s, %s)",
                    (seq, "message_block", str(block), record, "0" * 64, "1" * 64),
                )
        return time.perf_counter() - started


async def _asyncpg(url: str, batches: int, batch: int) -> float:
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        for n in range(batches):
            keys, record = _batch(n, batch)
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(1)")
                head = await conn.fetchrow(_HEAD)
                seq = head[0] + 1 if head else 1
                sessions, indexes = map(list, zip(*keys, strict=True))
                assert len(await conn.fetch(_NEW_KEYS, sessions, indexes)) == batch
                block = await conn.fetchval(
                    "INSERT INTO blocks (record) VALUES ($1) RETURNING id", record
                )
                await conn.execute(
                    "INSERT INTO audit VALUES ($1, $2, $3, $4, $5, $6)",
                    seq,
                    "message_block",
                    str(block),
                    record,
                    "0" * 64,
                    "1" * 64,
                )
        return time.perf_counter() - started
    finally:
        await conn.close()


async def _measure(server: PostgresServer, args: argparse.Namespace) -> dict[str, list[float]]:
    drivers: dict[str, Callable[[str, int, int], Awaitable[float]]] = {
        "psycopg": _psycopg,
        "asyncpg": _asyncpg,
    }
    rates: dict[str, list[float]] = {name: [] for name in drivers}
    for _ in range(args.rounds):
        for name, run in drivers.items():
            url = server.create_database()
            with psycopg.connect(url, autocommit=True) as conn:
                for statement in _TABLES.split(";"):
                    conn.execute(statement)
            seconds = await run(url, args.batches, args.batch)
            rates[name].append(args.batches * args.batch / seconds)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    report.add_no_write(parser)
    args = parser.parse_args()
    bin_dir = server_binaries()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (Debian package `postgresql`)")
    server = PostgresServer(bin_dir)
    server.start()
    try:
        rates = asyncio.run(_measure(server, args))
        version = server.version()
    finally:
        server.stop()
    report.publish(SECTION, section(args, rates, version), write=not args.no_write)


if __name__ == "__main__":
    main()
