"""bench.ingest_tls' section: durable gRPC ingest and the MQTT input with TLS and credentials
against the same without them."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from statistics import median
from typing import TYPE_CHECKING, Any

from bench import report

if TYPE_CHECKING:
    from bench.ingest import Plan

NAME = "bench.ingest_tls"
# The goal: a locked path keeps at least this share of the open one's rate.
GOAL = 0.8


def _row(name: str, figures: dict[str, Any], unit: str) -> str:
    ratio = median(figures["ratios"])
    met = "yes" if ratio >= GOAL else "**no**"
    return (
        f"| {name} | {figures['plain']:,.0f} {unit} | {figures['locked']:,.0f} {unit} | "
        f"{ratio:.2f} ({report.listed(figures['ratios'])}) | ≥ {GOAL} | {met} |"
    )


def _cost(path: str, figures: dict[str, Any]) -> str:
    """What locking changed in the daemon's CPU per message, and what that leaves of the rate."""
    extra = figures["locked_us"] - figures["plain_us"]
    ratio = median(figures["ratios"])
    head = (
        f"{path}: the locked daemon spent {extra:+.1f} µs of CPU per message "
        f"({figures['plain_us']:.1f} → {figures['locked_us']:.1f} µs)"
    )
    if ratio >= GOAL:
        return head + f", and kept {ratio:.0%} of the plain rate."
    return head + (
        f" and kept {ratio:.0%} of the plain rate, under the goal: TLS record decryption and "
        "the extra reads per message run on the event loop beside the pipeline, and the peer "
        "(broker or client) encrypts on the same two cores."
    )


def section(p: Plan, results: dict[str, Any]) -> str:
    grpc, mqtt = results["grpc"], results["mqtt"]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.ingest_tls" + ("" if p.mode == "full" else f" --{p.mode}")
    return f"""{report.begin_marker(f"{NAME} {p.mode}")}
## Ingest with TLS and authentication ({p.mode}, `{command}`)

Run {when} on commit {report.commit_text()}, {platform.python_implementation()}
{platform.python_version()}, {platform.machine()}, a shared 2-core machine.

| Path | Plain | TLS + credentials | Ratio, median (per round) | Goal | Met |
| --- | ---: | ---: | --- | --- | --- |
{_row("gRPC ingest, durable", grpc, "msg/s")}
{_row("MQTT input, one reading per message", mqtt, "msg/s")}

### How it is measured

- **gRPC ingest**: bench.ingest's measurement ({p.agent_streams} `Ingest.Stream`s of
  {p.agent_messages:,} agent messages each, batched requests, acked once committed, rate on the
  client's clock). Locked: the daemon with `POIROTD_TLS_CERT_FILE`/`_KEY_FILE`,
  `POIROTD_TLS_CLIENT_CA_FILE` (client certificates required) and `POIROTD_AUTH_FILE`; the client
  presents a certificate the CA signed and a bearer token the access file grants `ingest`. The
  daemon used {grpc["plain_cpu"]:.0%} of a core plain ({grpc["plain_us"]:.0f} µs per message),
  {grpc["locked_cpu"]:.0%} locked ({grpc["locked_us"]:.0f} µs); the client process
  {grpc["plain_client_cpu"]:.0%} and {grpc["locked_client_cpu"]:.0%}.
- **MQTT input**: bench.ingest's one-reading measurement ({p.mqtt_messages:,} JSON messages at
  QoS 1 from the raw-socket publisher; decode, checks, durable commit, 20 rules, PUBACK after the
  commit; rate = messages / time to the last ack). Locked: Mosquitto's listener on TLS with
  `require_certificate true`, `allow_anonymous false` and a password file; the daemon's input
  (`tls:` with CA, client certificate and key; `password: {{file: ...}}`) and the publisher both
  log in with a certificate and the password. The daemon used {mqtt["plain_cpu"]:.0%} of a core
  plain ({mqtt["plain_us"]:.0f} µs per message), {mqtt["locked_cpu"]:.0%} locked
  ({mqtt["locked_us"]:.0f} µs).
- Ratio = locked / plain within a round. {p.rounds} rounds per path, plain and locked
  alternating, the order reversed every other round; each side on a fresh daemon (and broker);
  medians. Certificates are ECDSA P-256 from trustme, made for the run.

### What locking costs

{_cost("gRPC", grpc)} {_cost("MQTT", mqtt)} The per-round ratios spread more than the medians
differ: one side of a round can lose a core to the machine's other tenants for a second.

{report.end_marker(f"{NAME} {p.mode}")}"""
