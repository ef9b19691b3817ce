"""bench.fuzz's section: a row per target (crashes, UNKNOWN and INTERNAL answers, slow answers,
acknowledged items lost, memory), the statuses seen and the findings; the table's rows and the
findings are also what the bench prints as it goes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    from bench.fuzz import Run, Tally

SECTION = "bench.fuzz"
COLUMNS = (
    "target",
    "inputs (raw bytes)",
    "crashes",
    "UNKNOWN",
    "INTERNAL",
    "> 1 s",
    "acked",
    "acked lost",
    "RSS before → after (trimmed)",
    "time",
)


def table(tallies: list[Tally]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "| --- |" + " ---: |" * (len(COLUMNS) - 1),
    ]
    for t in tallies:
        inputs = f"{t.inputs:,}" + (f" ({t.raw:,})" if t.raw else "")
        acked = "—" if t.acked is None else f"{t.acked:,}"
        lost = "—" if t.acked is None else str(t.lost)
        cells = [
            t.target,
            inputs,
            str(t.crashes),
            str(t.unknown),
            str(t.internal),
            f"{t.slow} (max {t.slowest:.2f} s)",
            acked,
            lost,
            f"{t.rss_before_mib:.0f} → {t.rss_after_mib:.0f} ({t.rss_trimmed_mib:.0f}) MiB",
            f"{t.seconds:.0f} s",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def statuses(tallies: list[Tally]) -> str:
    lines = []
    for t in tallies:
        seen = ", ".join(f"{name} {n:,}" for name, n in sorted(t.statuses.items()))
        lines.append(
            f"- {t.target}: {seen}; the daemon's loop stalled at most "
            f"{t.longest_loop_stall:.2f} s, the collector paused at most "
            f"{t.longest_collection:.2f} s"
        )
    return "\n".join(lines)


def findings(tallies: list[Tally]) -> str:
    found = [f"- {t.target}: {f}" for t in tallies for f in t.findings]
    return "\n".join(found) if found else "None: every count the goals name is 0."


def section(tallies: list[Tally], run: Run) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    n, seed, seconds = run.inputs, run.seed, run.seconds
    return f"""{report.begin_marker(SECTION)}
## Fuzzing (`python -m bench.fuzz`)

{when}, commit {report.commit_text()}; {n:,} inputs per target, hypothesis seed {seed}, \
{seconds / 60:.1f} minutes in all on the shared 2-core machine.

```sh
.venv/bin/python -m bench.fuzz            # this section: {run.full_inputs:,} inputs per target
.venv/bin/python -m bench.fuzz --quick    # {run.quick_inputs} per target, prints only (the test)
```

A daemon runs in the bench's process on its own event loop (the tests' clinic spec with
reputation on, a pinned hazard space, a threshold rule, a scripted LLM, its SQLite store on
tmpfs) with a real Mosquitto for its MQTT input. Hypothesis generates one input at a time and
the next waits for its answer. gRPC targets get structured requests (each field unset, valid or
hostile: edge and huge integers, text over every limit, times outside 1970..now, unknown enum
numbers) and, one in four, raw bytes (random, a valid request damaged, hand-made wire damage)
through a generic channel method; Ingest.Stream gets 1-4 requests per stream. The MQTT input
gets JSON, CBOR and binary frames on its topics (valid, bent, damaged, deeply nested), with
templated names; the spec loader gets the spec's YAML with its tree or text mutated, alias
bombs, deep nesting and cycles.

{table(tallies)}

Goals (issue 20): 0 crashes, 0 UNKNOWN, 0 INTERNAL (every bad input gets a specific status),
0 answers slower than 1 s, 0 acknowledged items lost; RSS bounded.

- **crashes**: the daemon stopped answering its health check, one of its long-lived tasks
  ended, asyncio reported an exception nobody retrieved, the MQTT input failed and restarted,
  or the spec loader raised anything but its SpecError.
- **UNKNOWN / INTERNAL**: answers with that gRPC status.
- **> 1 s**: answers that took longer, on the client's clock (Watch: until its first event or
  its status when one is owed; an open Watch that may wait for future events is only checked
  for an immediate error). The slowest answer is in brackets.
- **acked / acked lost**: Ingest.Stream: items up to each stream's last acknowledged seq
  (sessions, messages, samples), each looked up in the store at the end; Trigger: investigations
  returned, each looked up; ConfirmOutcome: investigations confirmed, each holding the last
  outcome acknowledged; MQTT: readings the input counted as committed (then acked to the
  broker) against the rows stored, and a canary reading every {run.canary_every} messages, each
  looked up.
- **RSS**: VmRSS of the process holding the daemon (and the fuzzer's client), after a
  collection, before and after the target; in brackets after `malloc_trim`, once glibc has
  handed back the free heap its arenas keep (each thread that parsed a large request keeps
  megabytes of it): what is still in use. The next target starts from there.

Statuses seen, with the longest stall of the daemon's event loop (a task that sleeps 50 ms
at a time, woken late) and the longest pause of the cyclic collector during each target (the
process runs with the daemon's collector settings, `tune_for_daemon`):

{statuses(tallies)}

{_memory(tallies)}

Findings of this run:

{findings(tallies)}

Defects this benchmark found while it was built, each fixed with a regression test: the spec
loader raised RecursionError on deep nesting (after about a second in PyYAML's pure-Python
scanner), AttributeError, KeyError or ValueError on a value its explicit tag does not fit
(`!!timestamp hello`), and built alias bombs whole (1.8 s and 159 MB for 4.8 million values);
session ids and signal names had no length bound (a 300,000-character session id was stored
and held in memory for good). Not the daemon's: grpc's asyncio client reports `INTERNAL:
Internal error from Core` instead of the server's status when a write fails as the server ends
the stream (grpc/grpc#36066), so Ingest streams go through grpc's blocking client.
{report.end_marker(SECTION)}"""


def _memory(tallies: list[Tally]) -> str:
    """How the memory in use moved once the first targets had filled the store."""
    if len(tallies) < 3:
        return ""
    later = tallies[2:]
    inputs = sum(t.inputs for t in later)
    moved = later[-1].rss_trimmed_mib - tallies[1].rss_trimmed_mib
    return (
        f"From the third target on ({inputs:,} inputs) the memory in use (RSS after "
        f"`malloc_trim`) moved by {moved:+.0f} MiB. What it holds is not split between the "
        "daemon and the fuzzer, which share the process; tracemalloc in a separate run saw "
        "under 5 MB of Python objects kept after 4,000 streams, so the rest is native heap "
        "(gRPC and protobuf buffers of requests up to megabytes, SQLite, glibc's arenas)."
    )
