"""bench.idempotency's section: each store's commit rate without keys, with keys in runs and with
keys scattered, and the ratios per round."""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    from bench.idempotency import Plan

NAME = "bench.idempotency"


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
    command = report.command(NAME, p.mode)
    rows = "\n".join(table(name, rates) for name, rates in results.items())
    name = f"{NAME} {p.mode}"
    return f"""{report.begin_marker(name)}
## What idempotency keys cost at commit ({p.mode}, `{command}`)

{report.stamp()}, a shared 2-core machine{server}.

| Store, keys | `commit_ingest` | keyed / unkeyed (median; per round) |
| --- | ---: | ---: |
{rows}

{p.samples:,} samples per side in batches of {p.batch}, one sample per key, committed one batch
after the other into a fresh store; {p.rounds} rounds, the three sides alternating (order turned
each round). Keys in runs are a forwarder's (consecutive seqs: one `ingest_keys` row per
commit); scattered keys are every other seq of one producer, as a share group of two splits
a publisher's messages (a row per sample, the worst case). What it costs: the lookup of the
batch's seq range and the key rows' inserts, each row into two B-trees (the primary key and the
age index pruning uses); on PostgreSQL no round trip of its own (the lookup rides with the
commit's first answers; a batch holding a copy, none here, is written twice), but the server's
work, on the same two cores as this process. Store commits alone: a transport's decoding and its
wire add to both sides alike, so a daemon's ratio is nearer 1.

{report.end_marker(name)}"""
