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
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import median

from bench import report
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.model import ItemKey, Session, TelemetryBatch
from poirotd.store import PostgresStore, SqliteStore, Store

BATCH = 512
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WAYS = ("none", "runs", "scattered")
_NAME = "bench.idempotency"


@dataclass(frozen=True)
class Plan:
    mode: str
    rounds: int
    samples: int


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


def ratios(rates: dict[str, list[float]], way: str) -> list[float]:
    return [keyed / plain for keyed, plain in zip(rates[way], rates["none"], strict=True)]


def table(name: str, rates: dict[str, list[float]]) -> str:
    lines = [f"| {name} | {median(rates['none']):,.0f} samples/s | 1.00 |"]
    for way, label in (("runs", "keys in runs"), ("scattered", "keys scattered")):
        r = ratios(rates, way)
        lines.append(
            f"| {name}, {label} | {median(rates[way]):,.0f} samples/s | **{median(r):.2f}** "
            f"({', '.join(f'{x:.2f}' for x in r)}) |"
        )
    return "\n".join(lines)


def section(p: Plan, results: dict[str, dict[str, list[float]]], server: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.idempotency" + ("" if p.mode == "full" else f" --{p.mode}")
    rows = "\n".join(table(name, rates) for name, rates in results.items())
    name = f"{_NAME} {p.mode}"
    return f"""{report.begin_marker(name)}
## What idempotency keys cost at commit ({p.mode}, `{command}`)

Run {when} on commit {report.commit_text()}, {platform.python_implementation()}
{platform.python_version()}, a shared 2-core machine{server}.

| Store, keys | `commit_ingest` | keyed / unkeyed (median; per round) |
| --- | ---: | ---: |
{rows}

{p.samples:,} samples per side in batches of {BATCH}, one sample per key, committed one batch
after the other into a fresh store; {p.rounds} rounds, the three sides alternating (order turned
each round). Keys in runs are a forwarder's (consecutive seqs: one `ingest_keys` row per
commit); scattered keys are every other seq of one producer, as a share group of two splits
a publisher's messages (a row per sample, the worst case). What it costs: the lookup of the
batch's seq range and the key rows' inserts, each row into two B-trees (the primary key and the
age index pruning uses); on PostgreSQL no round trip of its own (the lookup rides with the
commit's first answers; a batch holding a copy, none here, is written twice), but the server's
work, on the same two cores as this process. Store commits alone: through a transport, decoding and
the transport add to both sides alike, so a daemon's ratio is nearer 1.

{report.end_marker(name)}"""


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
    parser.add_argument("--no-write", action="store_true", help="print, leave BENCHMARKS.md")
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
    text = section(p, results, version)
    if not args.no_write:
        report.write_section(f"{_NAME} {p.mode}", text)
    print(text)


if __name__ == "__main__":
    main()
