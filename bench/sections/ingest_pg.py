"""bench.ingest_pg's section: durable gRPC ingest on PostgreSQL against SQLite, the CPU each side
used, and what limits the PostgreSQL side."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from statistics import median
from typing import TYPE_CHECKING, Any

from bench import report

if TYPE_CHECKING:
    from bench.ingest import Plan

NAME = "bench.ingest_pg"


def section(p: Plan, r: dict[str, Any]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.ingest_pg" + ("" if p.mode == "full" else f" --{p.mode}")
    ratio = median(r["ratios"])
    cpu_ratio = r["sqlite_us"] / (r["postgres_us"] + r["server_us"])
    return f"""{report.begin_marker(f"{NAME} {p.mode}")}
## Durable gRPC ingest on PostgreSQL vs SQLite ({p.mode}, `{command}`)

Run {when} on commit {r["commit"]}, {platform.python_implementation()}
{platform.python_version()}, {platform.machine()}, a shared 2-core machine; {r["server_version"]}
on loopback.

| Store | Durable gRPC ingest | Daemon CPU per message | Server CPU per message |
| --- | ---: | ---: | ---: |
| SQLite (WAL, synchronous=FULL) | {r["sqlite"]:,.0f} msg/s | {r["sqlite_us"]:.0f} µs | — |
| PostgreSQL (fsync on, synchronous_commit on) | {r["postgres"]:,.0f} msg/s | \
{r["postgres_us"]:.0f} µs | {r["server_us"]:.0f} µs |

PostgreSQL / SQLite: **{ratio:.2f}** (median; per round {report.listed(r["ratios"])}).

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

{report.end_marker(f"{NAME} {p.mode}")}"""
