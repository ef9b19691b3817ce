"""bench.http_transports' section: for plain HTTP and TLS, the daemon's VmRSS, threads and open
connections while the slow clients are held and after, and what became of each kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    from bench.http_transports import Plan, Results

NAME = "bench.http_transports"


def _kinds(r: Results) -> str:
    lines = []
    for transport in dict.fromkeys(c.transport for c in r.clients):
        for kind in dict.fromkeys(c.kind for c in r.clients):
            mine = [c for c in r.clients if c.transport == transport and c.kind == kind]
            ended = sorted(c.ended_after for c in mine if c.ended_after is not None)
            refused, held = sum(c.refused for c in mine), sum(c.hung_up for c in mine)
            fates = [
                f"{len(ended)} ended by the daemon after {ended[0]:.1f}-{ended[-1]:.1f} s"
                if ended
                else "",
                f"{refused} of them refused at once ({'closed' if r.tls else '503'})"
                if refused
                else "",
                f"{held} still open when the clients hung up" if held else "",
            ]
            lines.append(f"| {transport} | {kind} | {'; '.join(f for f in fates if f)} |")
    return "\n".join(lines)


def _side(p: Plan, r: Results) -> str:
    rows = "\n".join(
        f"| {x.when} | {x.rss_mib:.0f} | {x.threads} | {x.open_connections} |" for x in r.readings
    )
    first, held = r.readings[0], r.readings[1]
    refused = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(r.refusals.items())) or "none counted"
    scrape_ms = "not answered" if r.scrape_ms is None else f"answered in {r.scrape_ms:.0f} ms"
    return f"""### {"TLS" if r.tls else "Plain HTTP"}

| The daemon | VmRSS (MiB) | threads | connections open |
| --- | ---: | ---: | ---: |
{rows}

Holding them cost the daemon {held.rss_mib - first.rss_mib:+.0f} MiB and
{held.threads - first.threads:+d} threads. A scrape from another address while they were held:
{scrape_ms}. Refusals the daemon counted (transport, reason): {refused}.

| transport | client | what became of it |
| --- | --- | --- |
{_kinds(r)}
"""


def section(p: Plan, sides: list[Results]) -> str:
    command = report.command(NAME, p.mode)
    name = f"{NAME} {p.mode}"
    body = "\n".join(_side(p, r) for r in sides)
    return f"""{report.begin_marker(name)}
## Slow clients on the HTTP transports ({p.mode}, `{command}`)

{report.stamp()}, a shared 2-core machine. {p.connections} connections from {p.peers}
loopback addresses, half on /metrics and half on OTLP/HTTP, against a daemon process whose
request deadline is {p.deadline:g} s; "connections open" counts the clients' connections the
daemon had not ended.

{body}
{report.end_marker(name)}"""
