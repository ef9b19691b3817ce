"""bench.hostile's section: a row per hostile peer (what it sent and got, what the victim and the
rules became) and the notes that explain them."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    from bench.hostile import Plan, Results, Row

NAME = "bench.hostile"
HEADER = (
    "| Hostile peer | Inputs | What they got | Victim acked | Victim lost | Hazard events fired"
    " | Hazards lost (sessions; newest investigation) | VmRSS |"
)


def _counts(counts: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items() if n) or "none"


def _row(r: Row) -> str:
    rss = f"{r.rss_before:.0f} → {r.rss_after:.0f} MiB"
    states = _counts(r.states)
    hazards = f"{r.hazards_lost} of {r.hazard_sessions} ({states})" if r.hazard_sessions else "—"
    cells = (
        r.peer,
        str(r.sent),
        _counts(r.got),
        str(r.victim_acked),
        str(r.victim_lost),
        _counts(r.fired) if r.fired else "—",
        hazards,
        rss,
    )
    return "| " + " | ".join(cells) + " |"


def section(p: Plan, r: Results) -> str:
    command = report.command(NAME, p.mode)
    rows = "\n".join(_row(row) for row in r.rows)
    notes = "\n".join(f"- {row.peer}: {row.note}." for row in r.rows if row.note)
    name = f"{NAME} {p.mode}"
    return f"""{report.begin_marker(name)}
## Hostile peers: rules still firing, nothing acknowledged lost ({p.mode}, `{command}`)

{report.stamp()}, a shared 2-core machine, {r.seconds:.0f} s. One daemon, a process
of its own (`bench.daemon_process`, scripted LLM), {r.start_mib:.0f} MiB resident once started,
fed by a real Mosquitto; each row's VmRSS is read from /proc before and after it.

{HEADER}
| --- | ---: | --- | ---: | ---: | --- | --- | ---: |
{rows}

{notes}

The extremes are ±1.797e308, 1e300, NaN and ±inf, each sent {p.repeats} times (over gRPC into
the hostile's own session and into the victim's). The victim then sends 181 readings per
session: noise, a 10-sigma spike (the zscore rule), an offset of 8 for 20 readings (the
rolling_mean rule). "Victim lost" is what the daemon acknowledged (gRPC's durable seq; at QoS 1,
the broker's PUBACK) and its store lacks. "Hazards lost" counts victim sessions on which a rule
fired and that have no investigation. The Trigger flood's queue holds {r.queue["capacity"]}
({r.queue["reserved_for_rules"]} kept for rules, {r.queue["per_client"]} per client); its
{p.victims} victim sessions each get one reading of 85 °C (the threshold rule). Refused
requests of 3 MB and silent Ingest streams: see the section of `bench.grpc_transport`.

{report.end_marker(name)}"""
