"""bench.pg_drivers' section: one durable ingest commit's rate through psycopg 3 and asyncpg, and
why psycopg is the store's driver."""

from __future__ import annotations

import argparse
import statistics

import asyncpg
import psycopg

from bench import report

SECTION = "bench.pg_drivers"


def section(args: argparse.Namespace, rates: dict[str, list[float]], version: str) -> str:
    psycopg_rate, asyncpg_rate = (statistics.median(rates[n]) for n in ("psycopg", "asyncpg"))
    ratios = [a / p for p, a in zip(rates["psycopg"], rates["asyncpg"], strict=True)]
    return f"""{report.begin_marker(SECTION)}
## PostgreSQL driver: psycopg 3 or asyncpg (`python -m bench.pg_drivers`)

{report.stamp()}, a shared 2-core machine; {version} on loopback, fsync on.

| Driver | Durable commits of {args.batch} messages |
| --- | ---: |
| psycopg {psycopg.__version__} (pipeline mode) | {psycopg_rate:,.0f} msg/s |
| asyncpg {asyncpg.__version__} | {asyncpg_rate:,.0f} msg/s |

asyncpg / psycopg: {statistics.median(ratios):.2f} (median; per round {report.listed(ratios)}).

Each transaction is the PostgreSQL store's commit: the chain's advisory lock, the chain head, the
batch's message keys added in one statement over arrays (which are new), the block, its chain
entry, COMMIT. {args.rounds} rounds of {args.batches} transactions, the drivers alternating, a fresh
database each. While the store was written, shorter runs of this bench (3 rounds of 100) had
asyncpg ahead by 1.14 before psycopg used pipeline mode (each statement its own round trip), and
by 1.40 when the keys still went one row each through executemany.

**psycopg 3 is the store's driver.** At this commit alone the two are close on this shared
machine (the per-round ratios above run from {min(ratios):.2f} to {max(ratios):.2f}), so the
choice rests on the rest: psycopg gives `poirotd audit` synchronous connections over the same
queries as the daemon's asynchronous ones (asyncpg is async only), and it is libpq, so PGPASSFILE
and ~/.pgpass, service files, sslmode and client certificates, target_session_attrs for a
primary/standby pair all work as PostgreSQL documents them. Should the driver be found to limit
a deployment, the change stays inside `poirotd/store/postgres.py`.

{report.end_marker(SECTION)}"""
