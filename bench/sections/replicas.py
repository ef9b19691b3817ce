"""bench.replicas' section: durable gRPC ingest through 2 replicas on one PostgreSQL against 1, and
what limits it."""

from __future__ import annotations

import platform
import statistics
from datetime import UTC, datetime
from statistics import median
from typing import TYPE_CHECKING, Any

from bench import report

if TYPE_CHECKING:
    pass

NAME = "bench.replicas"


def section(mode: str, rounds: int, messages: int, r: dict[str, Any]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.replicas" + ("" if mode == "full" else f" --{mode}")
    rows = []
    for name, sides in (("1 replica", r["one"]), ("2 replicas", r["two"])):
        figures = [
            f"{median([s.rate for s in sides]):,.0f} msg/s",
            f"{median([s.transactions for s in sides]):,.0f}",
            f"{median([s.wal_syncs for s in sides]):,.0f}",
            f"{median([s.wal_sync_share for s in sides]):.0%}",
            *(
                f"{median([getattr(s, field) for s in sides]):.2f}"
                for field in ("replica_cpu", "client_cpu", "server_cpu", "cores")
            ),
            f"{median([s.machine_busy for s in sides]):.0%}",
            f"{median([s.server_us for s in sides]):.0f} µs",
        ]
        rows.append(f"| {name} | {' | '.join(figures)} |")
    ratio = statistics.median(r["ratios"])
    table = "\n".join(rows)
    return f"""{report.begin_marker(f"{NAME} {mode}")}
## Replicas: durable gRPC ingest through 1 vs 2 poirotd replicas on one PostgreSQL ({mode}, \
`{command}`)

Run {when} on commit {report.commit_text()}, {platform.python_implementation()}
{platform.python_version()}, {platform.machine()}, a shared 2-core machine; {r["server_version"]}
on loopback (fsync on, synchronous_commit on).

| Side | Durable gRPC ingest | Commits/s | WAL flushes/s | time flushing | CPU (cores): \
replicas | clients | server | all | Machine busy | Server CPU per message |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{table}

2 replicas / 1 replica: **{ratio:.2f}** (median; per round {report.listed(r["ratios"])}).

### How it is measured

- Each side: its replicas as `poirotd run` processes on a database of its own, {r["streams"]}
  `Ingest.Stream`s of {messages:,} agent messages each from bench.agents processes (all to the one
  replica, or two to each of the two), batched, acked once committed; the rate is all messages
  over the slowest client's time from its first write to its last ack. {rounds} rounds, the sides
  alternating, the order reversed every other round.
- CPU from /proc: the replicas' processes, the clients' own count, and the PostgreSQL server's
  (postmaster, backends, WAL writer, checkpointer); "all" is their sum, of the machine's 2 cores
  (which other work on this shared machine also used). Commits/s: the database's committed
  transactions (pg_stat_database, reads included) over the side's time. WAL flushes and the time
  they took: pg_stat_wal with track_wal_io_timing on (set by the bench), over the side's time.
  Machine busy: the share of both cores' time in use by any process (/proc/stat), this run's
  and whatever else the shared machine ran.

### What limits it

{_limits(r)}

{report.end_marker(f"{NAME} {mode}")}"""


def _limits(r: dict[str, Any]) -> str:
    """What bounds the 2-replica side, from its figures."""
    two = r["two"]
    cores = median([s.cores for s in two])
    busy = median([s.machine_busy for s in two])
    flushing = median([s.wal_sync_share for s in two])
    flush_times = [1000 * s.wal_sync_share / s.wal_syncs for s in two if s.wal_syncs]
    flush_ms = median(flush_times) if flush_times else 0.0  # none with fsync off
    lock = (
        "Every write transaction on the shared store takes the chain's advisory lock "
        "(poirotd.store.postgres: the audit chain is one total order) and holds it until its "
        "COMMIT has flushed the WAL, so the replicas' commits run one after the other and the "
        "server cannot group them into one flush."
    )
    if busy >= 0.9:
        bound = (
            f"The 2 cores, in this run: the machine was {busy:.0%} busy during a 2-replica side, "
            f"of which the processes measured (clients, replicas, server) used {cores:.2f} cores "
            "and other work on this shared machine the rest: a second replica competes for the "
            "same small share of the cores as the first, and the rounds vary with the other "
            "load more than with the replicas. The WAL flushes took "
            f"{flushing:.0%} of the time ({flush_ms:.1f} ms each). {lock} On a machine of its "
            "own the next bound is that lock: commits run one at a time, whatever the number of "
            "replicas."
        )
    elif flushing >= 0.5:
        bound = (
            f"The WAL flush, in this run: the server spent {flushing:.0%} of a 2-replica side's "
            f"time flushing it, {flush_ms:.1f} ms a flush on this machine's disk, while the "
            f"processes measured used {cores:.2f} of the 2 cores. {lock} Commits per second are "
            "bounded by the flush time whatever the number of replicas; what a second replica "
            "adds is that its batch grows while the other's commit holds the lock, so the same "
            "serial commits carry more messages. On a database with a fast WAL device the bound "
            "moves to the round trips of a transaction and the replicas' own CPU."
        )
    elif cores >= 1.6:
        bound = (
            f"The 2 cores, in this run: the processes measured used {cores:.2f} of them (the "
            "clients, the replicas and the server share one machine), so a second replica mostly "
            f"shares the same cores. The WAL flushes took {flushing:.0%} of the time "
            f"({flush_ms:.1f} ms each). {lock} That lock bounds the store's commits per second "
            "whatever the number of replicas, once cores are no longer the bound."
        )
    else:
        bound = (
            f"Neither the cores ({cores:.2f} of 2 used by the processes measured) nor the WAL "
            f"flushes ({flushing:.0%} of the time, {flush_ms:.1f} ms each) alone, in this run: "
            "the rest is waiting, on the round trips of each transaction and on the lock. "
            f"{lock} This shared machine's other load also moves the figures from round to round."
        )
    return (
        f"{bound} Replicas are for availability first (a dead replica's investigations are taken "
        "over, ingest goes on through the others), throughput second; sharded chains (one per "
        "system) would lift the lock's bound, at the price of one total order."
    )
