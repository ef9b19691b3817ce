"""bench.grpc_transport's section: each method's refused and answered calls with the daemon's
VmRSS around them, and what became of the silent streams."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from bench import report
from poirotd.investigations.service import MAX_TEXT_CHARS

if TYPE_CHECKING:
    from bench.grpc_transport import Flood, Plan, Results

NAME = "bench.grpc_transport"


def _codes(codes: Counter[str]) -> str:
    return ", ".join(f"{n} {code}" for code, n in codes.most_common())


def _row(method: str, r: Results) -> str:
    refused, answered = r.refused[method], r.answered[method]
    cells = (method, _codes(refused.codes), _rss(refused), _codes(answered.codes), _rss(answered))
    return "| " + " | ".join(cells) + " |"


def _rss(f: Flood) -> str:
    return (
        f"{f.before_mib:.0f} → {f.after_mib:.0f} MiB ({f.grown_mib:+.0f}; highest {f.peak_mib:.0f})"
    )


def section(p: Plan, r: Results) -> str:
    command = report.command(NAME, p.mode)
    s = r.streams
    rows = "\n".join(_row(method, r) for method in r.refused)
    name = f"{NAME} {p.mode}"
    return f"""{report.begin_marker(name)}
## Refused requests and silent streams at the gRPC transport ({p.mode}, `{command}`)

{report.stamp()}, a shared 2-core machine. The daemon is a process of its own
(`bench.daemon_child`, scripted LLM), {r.start_mib:.0f} MiB resident once started; VmRSS is read
from /proc before and after each run of {p.requests} calls, made one at a time.

| Method | Refused, ~3 MB each | VmRSS | Answered | VmRSS |
| --- | --- | ---: | --- | ---: |
{rows}

Refused calls carry a {p.refused_bytes >> 20} MiB string as the id, session id or page token;
each method's request bound (`poirotd.api.limits.MAX_REQUEST_BYTES`) refuses them before they
are decoded. Answered calls are Get and ConfirmOutcome (a {MAX_TEXT_CHARS:,}-character note) of
a finished investigation, List of a session, and Trigger of a known session (a
{MAX_TEXT_CHARS:,}-character reason): each Trigger queues an investigation that runs and is
stored, so that row's growth is the investigations'.

**Silent streams.** {s.held} Ingest streams of one host (the per-client bound) each sent a
session start, got its ack and then sent nothing. A producer of the same host was refused at
first ({s.first_try}) and let in {s.admitted_s:.1f} s after the last silent stream's ack, at its
try {s.tries} (every 0.25 s), with the idle deadline (`POIROTD_INGEST_IDLE_SECONDS`) at
{p.idle_seconds:g} s. The silent streams ended {_codes(s.endings)} ("{s.detail}"); a stream
that sent nothing at all ended {s.never_sent} after {s.never_sent_s:.1f} s.
`poirot_requests_rejected_total{{rpc="Ingest.Stream",reason="idle"}}` counted
{s.counted_idle:.0f}.

{report.end_marker(name)}"""
