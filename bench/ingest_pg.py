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
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import ingest, report
from bench.ingest import Plan, Rate, median
from bench.ingest_tls import alternating, plan
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


def _section(mode: str) -> str:
    return f"bench.ingest_pg {mode}"


def section(p: Plan, r: dict[str, Any]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.ingest_pg" + ("" if p.mode == "full" else f" --{p.mode}")
    ratio = median(r["ratios"])
    cpu_ratio = r["sqlite_us"] / (r["postgres_us"] + r["server_us"])
    return f"""{report.begin_marker(_section(p.mode))}
## Durable gRPC ingest on PostgreSQL vs SQLite ({p.mode}, `{command}`)

Run {when} on commit {r["commit"]}, {platform.python_implementation()}
{platform.python_version()}, {platform.machine()}, a shared 2-core machine; {r["server_version"]}
on loopback.

| Store | Durable gRPC ingest | Daemon CPU per message | Server CPU per message |
| --- | ---: | ---: | ---: |
| SQLite (WAL, synchronous=FULL) | {r["sqlite"]:,.0f} msg/s | {r["sqlite_us"]:.0f} µs | — |
| PostgreSQL (fsync on, synchronous_commit on) | {r["postgres"]:,.0f} msg/s | \
{r["postgres_us"]:.0f} µs | {r["server_us"]:.0f} µs |

PostgreSQL / SQLite: **{ratio:.2f}** (median; per round {ingest.listed(r["ratios"])}).

### How it is measured

- bench.ingest's gRPC measurement on each side: {p.agent_streams} `Ingest.Stream`s of
  {p.agent_messages:,} agent messages each, batched requests, acked once committed (group commit,
  512 items a transaction at most), rate on the client's clock from its first write to its last
  ack. The same messages on both sides; a fresh daemon and a fresh store for each side of each
  round ({p.rounds} rounds, alternating, the order reversed every other round).
- SQLite: the default store file. PostgreSQL: `POIROTD_DB_URL` to a database created for the side
  on a server started for the run (initdb in a temporary folder, Debian's binaries, default
  settings but the port: fsync on, synchronous_commit on, so an ack is a commit flushed to the
  WAL, as SQLite's is an fsync).
- Daemon CPU: this process (the daemon; the client runs in its own process, about
  {r["client_cpu"]:.0%} of a core). Server CPU: the PostgreSQL processes (postmaster, backends,
  WAL writer, checkpointer), from /proc, over the side.

### What limits it

The machine has 2 cores for the client, the daemon and, on the PostgreSQL side, the server, and
other tenants: the daemon used {r["sqlite_cpu"]:.0%} of a core on SQLite and {r["postgres_cpu"]:.0%}
on PostgreSQL, and the server {r["server_us"]:.0f} µs per message on top, on the same two cores.
Were the run bound by CPU alone, PostgreSQL would reach {cpu_ratio:.2f} of SQLite's rate
(SQLite's daemon CPU per message over PostgreSQL's daemon and server CPU per message). A commit on
PostgreSQL is three round trips on one connection (the chain's advisory lock and head, the
sessions looked up and the batch's new message keys; then the blocks' ids; then the chain's
entries and COMMIT, pipelined) and a WAL flush, the server's work on the same cores; SQLite's is
function calls and an fsync on a thread of the daemon. One write connection per daemon
serialises the commits, as SQLite's one writer does; a shared store's throughput grows with
replicas only while the server has cores to spare, and every replica's commits queue on the
chain's advisory lock. On a database server of its own (not sharing the daemon's cores) over a
real network the round trips weigh more and the CPU less.

{report.end_marker(_section(p.mode))}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 shorter rounds")
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
    text = report.reflow(section(p, results))
    report.write_section(_section(p.mode), text)
    print(text)


if __name__ == "__main__":
    main()
