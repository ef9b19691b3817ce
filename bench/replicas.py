"""Durable gRPC ingest through 1 and through 2 poirotd replicas on one PostgreSQL store (issue 23),
side by side.

    nice -n 10 .venv/bin/python -m bench.replicas            # 5 rounds, about 4 minutes
    nice -n 10 .venv/bin/python -m bench.replicas --quick    # 3 shorter rounds

Each side starts its replicas as `poirotd run` processes (POIROTD_DB_URL to a database created for
the side, on a PostgreSQL server started for the run: fsync and synchronous_commit on) and
bench.agents processes streaming agent messages, acked once committed: the same streams and
messages on both sides, all to the one replica, or half to each of the two. The rate is the
messages acknowledged over the time from the first write to the last ack (the slowest client's).
Rounds alternate the sides, the order reversed every other round; the ratio is taken within a
round. The CPU of the replicas and of the server is read from /proc. The results replace this
bench's section of BENCHMARKS.md (`--no-write`: print only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench import report
from bench.ingest import MESSAGE_RULE, Worker, bench_spec
from bench.sections.replicas import NAME, section
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.devtools.process import DaemonProcess

_STREAMS = 4  # client streams per side, split evenly over its replicas
_MODES = {"full": (5, 25_000), "quick": (3, 8_000)}  # rounds, messages per stream


@dataclass
class Side:
    rate: float  # messages acknowledged per second
    replica_cpu: float  # the replicas' CPU, in cores, over the side
    client_cpu: float  # the clients' (bench.agents) CPU, in cores
    server_cpu: float  # the server's CPU, in cores
    server_us: float  # the server's CPU per message
    transactions: float  # transactions committed per second (pg_stat_database: reads included)
    wal_syncs: float  # WAL flushes per second (pg_stat_wal)
    wal_sync_share: float  # the share of the side's time the server spent flushing the WAL
    machine_busy: float  # the share of the machine's CPU time in use, by any process

    @property
    def cores(self) -> float:
        return self.replica_cpu + self.client_cpu + self.server_cpu


def _spec_file(folder: Path) -> Path:
    """The benches' clinic with an agent-message rule; its LLM is never called (the backend is
    built without contacting the server), so `poirotd run` starts without a model."""
    spec = bench_spec([MESSAGE_RULE]).model_dump(mode="json", exclude_defaults=True)
    spec["llm"] = {"backend": "openai", "base_urls": ["http://127.0.0.1:9/v1"], "model": "none"}
    path = folder / "clinic.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    server: PostgresServer, spec: Path, folder: Path, replicas: int, messages: int
) -> Side:
    url = server.create_database()
    daemons = []
    for i in range(replicas):
        (folder / f"r{i}").mkdir(parents=True)
        env = {"POIROTD_DB_URL": url, "POIROTD_REPLICA_ID": f"r{i}", "POIROTD_LOG_LEVEL": "warning"}
        daemons.append(DaemonProcess(spec, folder / f"r{i}", env=env))
    try:
        for daemon in daemons:
            await asyncio.to_thread(daemon.start)
        clients = [
            Worker(
                "bench.agents",
                *("--target", daemon.grpc_target, "--streams", _STREAMS // replicas),
                *("--messages", messages),
            )
            for daemon in daemons
        ]
        for client in clients:
            await client.__aenter__()
        try:
            cpu_before = [_cpu_seconds(d.pid) for d in daemons]
            server_before = server.cpu_seconds()
            commits_before = await asyncio.to_thread(_commits, url)
            wal_before = await asyncio.to_thread(_wal, url)
            machine_before = _machine_ticks()
            for client in clients:
                await client.go()
            results = [await client.result(900) for client in clients]
            replica_cpu = sum(_cpu_seconds(d.pid) for d in daemons) - sum(cpu_before)
            server_cpu = server.cpu_seconds() - server_before
            commits = await asyncio.to_thread(_commits, url) - commits_before
            wal_after = await asyncio.to_thread(_wal, url)
            machine_after = _machine_ticks()
        finally:
            for client in clients:
                await client.__aexit__(None, None, None)
    finally:
        for daemon in daemons:
            await asyncio.to_thread(daemon.terminate)
    acked = sum(r["acked"] for r in results)
    if acked != _STREAMS * messages:
        raise RuntimeError(f"{acked} messages acked of {_STREAMS * messages}")
    seconds = max(r["seconds"] for r in results)
    return Side(
        rate=acked / seconds,
        replica_cpu=replica_cpu / seconds,
        client_cpu=sum(r["cpu_s"] for r in results) / seconds,
        server_cpu=server_cpu / seconds,
        server_us=1e6 * server_cpu / acked,
        transactions=commits / seconds,
        wal_syncs=(wal_after[0] - wal_before[0]) / seconds,
        wal_sync_share=(wal_after[1] - wal_before[1]) / 1000 / seconds,
        machine_busy=(machine_after[0] - machine_before[0])
        / max(1, machine_after[1] - machine_before[1]),
    )


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    user, nice, system, idle, iowait, *rest = map(int, Path("/proc/stat").read_text().split()[1:9])
    busy = user + nice + system + sum(rest)
    return busy, busy + idle + iowait


def _wal(url: str) -> tuple[int, float]:
    """The server's WAL flushes so far, and the milliseconds they took (track_wal_io_timing)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT wal_sync, wal_sync_time FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def _time_wal_flushes(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET track_wal_io_timing = on")
        conn.execute("SELECT pg_reload_conf()")


def _commits(url: str) -> int:
    """The database's committed transactions so far (the statistics lag by up to a second)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def run(server: PostgresServer, folder: Path, rounds: int, messages: int) -> dict[str, Any]:
    spec = _spec_file(folder)
    await asyncio.to_thread(_time_wal_flushes, server.url("postgres"))
    one: list[Side] = []
    two: list[Side] = []
    for r in range(rounds):
        sides = [(1, one), (2, two)]
        for replicas, results in sides if r % 2 == 0 else sides[::-1]:
            results.append(
                await measure(server, spec, folder / f"{r}-{replicas}", replicas, messages)
            )
            print(f"[bench] round {r} {replicas} replica(s): {results[-1]}", flush=True)
    return {
        "one": one,
        "two": two,
        "ratios": [b.rate / a.rate for a, b in zip(one, two, strict=True)],
        "server_version": server.version(),
        "streams": _STREAMS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 shorter rounds")
    report.add_no_write(parser)
    args = parser.parse_args()
    bin_dir = server_binaries()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (Debian package `postgresql`)")
    mode = "quick" if args.quick else "full"
    rounds, messages = _MODES[mode]
    server = PostgresServer(bin_dir)
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
            results = asyncio.run(run(server, Path(tmp), rounds, messages))
    finally:
        server.stop()
    text = section(mode, rounds, messages, results)
    report.publish(f"{NAME} {mode}", text, write=not args.no_write)


if __name__ == "__main__":
    main()
