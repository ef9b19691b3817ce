"""Durable gRPC ingest on the PostgreSQL store against the SQLite store (issue 23), side by side.

    .venv/bin/python -m bench.ingest_pg            # about 3 minutes
    .venv/bin/python -m bench.ingest_pg --quick    # about a minute

bench.ingest's gRPC measurement (bench.agents streams agent messages to an in-process daemon,
acked once committed) with the daemon on SQLite (POIROTD_DB_PATH, the default) and on PostgreSQL
(POIROTD_DB_URL: a server started for the run from Debian's package, fsync and synchronous_commit
on, on loopback, a fresh database per side), alternating round by round with bench.ingest_tls's
`alternating`, the order reversed every other round. The daemon's CPU and the server's are both
counted per message. The results replace this mode's section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from bench import ingest, report
from bench.ingest import Plan, Rate, median
from bench.ingest_tls import alternating, plan
from bench.sections.ingest_pg import NAME, section
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.observability import logs
from poirotd.observability.gc_tuning import tune_for_daemon

# Until the backends of a closed connection have exited and been reaped, whose CPU time then
# moves to the postmaster's children's.
_SETTLE_S = 0.5


async def run(p: Plan, folder: Path, server: PostgresServer) -> dict[str, Any]:
    """Both sides, `p.rounds` rounds; the ratio is PostgreSQL / SQLite within a round."""
    commit = report.commit_text()  # the code measured, before anything changes it
    server_us: list[float] = []

    async def on_sqlite(where: Path) -> Rate:
        return await ingest.grpc_ingest(p, where)

    async def on_postgres(where: Path) -> Rate:
        url = server.create_database()
        await asyncio.sleep(_SETTLE_S)
        before = server.cpu_seconds()
        rate = await ingest.grpc_ingest(p, where, {"db_url": url})
        await asyncio.sleep(_SETTLE_S)
        server_us.append(1e6 * (server.cpu_seconds() - before) / rate.count)
        return rate

    pair = await alternating(p.rounds, folder, on_sqlite, on_postgres)
    figures = pair.summary()  # "plain": SQLite, "locked": PostgreSQL
    return {
        "sqlite": figures["plain"],
        "postgres": figures["locked"],
        "ratios": figures["ratios"],
        "sqlite_us": figures["plain_us"],
        "postgres_us": figures["locked_us"],
        "server_us": median(server_us),
        "sqlite_cpu": figures["plain_cpu"],
        "postgres_cpu": figures["locked_cpu"],
        "client_cpu": median([figures["plain_client_cpu"], figures["locked_client_cpu"]]),
        "server_version": server.version(),
        "commit": commit,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 shorter rounds")
    report.add_no_write(parser)
    args = parser.parse_args()
    bin_dir = server_binaries()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (Debian package `postgresql`)")
    logs.configure("warning", "json")
    tune_for_daemon()  # as bench.ingest: the daemon's collector setting, both sides alike
    p = plan("quick" if args.quick else "full")
    server = PostgresServer(bin_dir)
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ingest-pg-") as tmp:
            results = asyncio.run(ingest.until_signalled(run(p, Path(tmp), server)))
    finally:
        server.stop()
    report.publish(f"{NAME} {p.mode}", section(p, results), write=not args.no_write)


if __name__ == "__main__":
    main()
