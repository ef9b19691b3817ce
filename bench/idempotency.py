"""What idempotency keys cost at commit (issue 23), side by side on each store.

    .venv/bin/python -m bench.idempotency            # about 2 minutes
    .venv/bin/python -m bench.idempotency --quick    # about 30 s

`Store.commit_ingest` alone (no transport, no rules): telemetry batches of 512 samples, one
sample per key, committed one after the other into a fresh store, three ways in alternating
rounds (the order turned each round): no keys; keys a forwarder gives (one producer, consecutive
seqs: a run, one key row per commit); keys a share group scatters (every other seq of a
producer: a key row per sample). On SQLite, and on PostgreSQL when Debian's server is installed
(a server started for the run, a fresh database per side). The results replace this bench's
section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import report
from bench.sections.idempotency import NAME, section
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.model import ItemKey, Session, TelemetryBatch
from poirotd.store import PostgresStore, SqliteStore, Store

BATCH = 512
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WAYS = ("none", "runs", "scattered")


@dataclass(frozen=True)
class Plan:
    mode: str
    rounds: int
    samples: int
    batch: int = BATCH  # samples per commit


def batches(way: str, samples: int) -> list[TelemetryBatch]:
    """The samples in batches, keyed `way`."""
    out = []
    for first in range(0, samples, BATCH):
        rows = [
            ("exo", "torque", float(i), T0 + timedelta(microseconds=i))
            for i in range(first, min(first + BATCH, samples))
        ]
        step = {"none": 0, "runs": 1, "scattered": 2}[way]
        keys: list[ItemKey | None] | None = None
        if step:
            keys = [ItemKey("bench", 1 + step * (first + j)) for j in range(len(rows))]
        out.append(TelemetryBatch("s1", rows, keys))
    return out


async def rate(store: Store, way: str, samples: int) -> float:
    """Samples per second committed `way` into `store` (closed after)."""
    work = batches(way, samples)
    try:
        await store.commit_ingest([Session(session_id="s1", system="bench", started_at=T0)])
        began = time.perf_counter()
        for batch in work:
            await store.commit_ingest([batch])
        return samples / (time.perf_counter() - began)
    finally:
        await store.close()


async def measure(p: Plan, open_store: Callable[[str], Awaitable[Store]]) -> dict[str, list[float]]:
    """Per way, the rate of each round."""
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    for n in range(p.rounds):
        order = WAYS if n % 2 == 0 else tuple(reversed(WAYS))
        for way in order:
            rates[way].append(await rate(await open_store(f"{n}-{way}"), way, p.samples))
    return rates


async def run(
    p: Plan, folder: Path, server: PostgresServer | None
) -> dict[str, dict[str, list[float]]]:
    async def sqlite(name: str) -> Store:
        return await SqliteStore.open(folder / f"{name}.db")

    results = {"SQLite": await measure(p, sqlite)}
    if server is not None:

        async def postgres(name: str) -> Store:
            url = server.create_database()
            return await PostgresStore.open(url, where=name)

        results["PostgreSQL"] = await measure(p, postgres)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds of fewer samples")
    report.add_no_write(parser)
    args = parser.parse_args()
    p = Plan("quick", 3, 10_240) if args.quick else Plan("full", 7, 51_200)
    bin_dir = server_binaries()
    server = None if bin_dir is None else PostgresServer(bin_dir)
    if server is not None:
        server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-idempotency-") as tmp:
            results = asyncio.run(run(p, Path(tmp), server))
        version = "" if server is None else f"; {server.version()} on loopback (fsync on)"
    finally:
        if server is not None:
            server.stop()
    report.publish(f"{NAME} {p.mode}", section(p, results, version), write=not args.no_write)


if __name__ == "__main__":
    main()
