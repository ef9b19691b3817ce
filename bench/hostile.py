"""What hostile peers can do to the daemon's rules and to other producers' data (issue 28).

    .venv/bin/python -m bench.hostile            # about 2 minutes
    .venv/bin/python -m bench.hostile --quick    # about 40 s, fewer hostile inputs and sessions

One daemon, a process of its own (`bench.daemon_process`: VmRSS is the daemon's alone), on the
clinic with a real Mosquitto feeding its MQTT input. Its exoskeleton has two signals watched by
a zscore and a rolling_mean rule each: `force` in the default range (|v| <= 2^53,
POIROTD_TELEMETRY_MAX_ABS_VALUE) and `grip`, whose spec declares [-1e150, 1e150]; a threshold
rule watches `motor_temp_c`. Each hostile peer is a row: what it sent and got, then a victim (the
signal's normal producer) sends readings that must make the rules fire, and the row counts what
the victim had acknowledged and the store lacks, the hazard events each rule fired, and the
victim sessions whose hazards have no investigation:

1. extreme readings over gRPC: ±1.797e308, 1e300, NaN, ±inf on `force`, into the hostile's own
   session and the victim's; the victim then sends in that session and another;
2. the same over MQTT, in the input's one session;
3. extremes that a declared range admits: ±1e150 on `grip` reach the victim's windows, and the
   rules fire again once they have left them;
4. a Trigger flood: one client, its rate unbounded (POIROTD_TRIGGER_RATE_PER_CLIENT=0), Triggers
   sessions of its own without pause while the threshold rule fires on N victim sessions; the
   queue is small (6 places, 2 kept for rules) so that hazards are DEFERRED, never refused;
5. spoofed keys (issue 28 item 5): an agent publishing only on its own topic (`mas/doctor/out`,
   a pinned route) names the chief's producer with the chief's seqs, and chooses the chief's
   session, the human kind and indexes; the chief then sends its own seqs on `mas/chief/out`.
   No rule watches agent messages: the row counts refusals by field, conflicts set aside,
   copies dropped and the chief's acknowledged messages the store lacks.

Refused requests of 3 MB and silent Ingest streams are bench.grpc_transport's (its own section).
The results replace this bench's section of BENCHMARKS.md (`--no-write`: print only).
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from bench import report
from bench.daemon_process import Child, child_daemon
from bench.sections.hostile import NAME, section
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.devtools.broker import mosquitto
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, session, start

EXTREMES = (1.7976931348623157e308, -1.7976931348623157e308, 1e300, math.nan, math.inf, -math.inf)
DECLARED = 1e150  # grip's declared range is [-DECLARED, DECLARED]
MQTT_SESSION = "plant-1"
MQTT_TOPIC = "hx/force"
# The agents of the spoofed-keys row: each on its own topic and session, the doctor's route
# pinning what a payload may choose.
CHIEF_TOPIC, CHIEF_SESSION = "mas/chief/out", "mas-chief"
DOCTOR_TOPIC, DOCTOR_SESSION = "mas/doctor/out", "mas-doctor"
PINNED = {"session": True, "kind": "agent", "index": "daemon"}
ROUTE_FIELDS = ("session", "kind", "index", "sender")
# POIROTD_QUEUE_*: a queue the flood fills, so that hazards find it full.
QUEUE = {"capacity": 6, "reserved_for_rules": 2, "per_client": 4}
TRIGGER_REFUSALS = ("queue_full", "too_many_queued", "trigger_rate")


@dataclass(frozen=True)
class Plan:
    mode: str
    repeats: int  # how many times a hostile peer sends its set of extremes
    victims: int  # victim sessions of the Trigger flood


def plan(mode: str) -> Plan:
    return Plan("full", 50, 32) if mode == "full" else Plan(mode, 2, 8)


def rules() -> list[dict[str, Any]]:
    """A zscore (a spike) and a rolling_mean (an offset) rule on each of force and grip, and
    the clinic's overheat threshold."""
    out: list[dict[str, Any]] = [OVERHEAT]
    for signal in ("force", "grip"):
        common = {"component": "exo", "signal": signal, "severity": "warning"}
        out.append(
            common
            | {"name": f"{signal}_spike", "kind": "zscore", "window_samples": 50}
            | {"threshold": 5.0, "min_samples": 20, "cooldown_seconds": 0.0}
        )
        out.append(
            common
            | {"name": f"{signal}_offset", "kind": "rolling_mean", "window_samples": 20}
            | {"min_samples": 10, "above": 5.0, "cooldown_seconds": 0.0}
        )
    return out


def hostile_spec(broker_port: int) -> SystemSpec:
    exo = clinic().components[0].model_dump(mode="json")
    exo["signals"] = {"grip": {"min": -DECLARED, "max": DECLARED}}
    broker = {"port": broker_port, "client_id": "poirotd-hostile", "timeout_s": 2.0}
    mapping = {"topic": MQTT_TOPIC, "component": "exo", "signal": "force"}
    routes = [
        {"topic": CHIEF_TOPIC, "sender": "chief", "session_id": CHIEF_SESSION, "pin": PINNED},
        {"topic": DOCTOR_TOPIC, "sender": "doctor", "session_id": DOCTOR_SESSION, "pin": PINNED},
    ]
    mqtt = {"broker": broker, "mappings": [mapping], "messages": routes}
    return clinic(
        components=[exo],
        rules=rules(),
        hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]},
        inputs={"session_id": MQTT_SESSION, "mqtt": mqtt},
    )


def env() -> dict[str, str]:
    return {
        "POIROTD_TRIGGER_RATE_PER_CLIENT": "0",
        "POIROTD_QUEUE_CAPACITY": str(QUEUE["capacity"]),
        "POIROTD_QUEUE_RESERVED_FOR_RULES": str(QUEUE["reserved_for_rules"]),
        "POIROTD_MAX_QUEUED_TRIGGERS_PER_CLIENT": str(QUEUE["per_client"]),
    }


# ------------------------------------------------------------------ inputs


def victim_values(seed: int) -> list[float]:
    """Readings that make both window rules fire: noise, a spike of 10-sigma, noise, 20 readings
    offset by 8, noise. 181 in all, |v| < 20."""
    noise = np.random.default_rng(seed).normal(0.0, 1.0, 181)
    noise[100] = 10.0
    noise[141:161] = 8.0
    return [float(v) for v in noise]


def reading(session_id: str, signal: str, value: float, at: datetime) -> pb.IngestRequest:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    sample = pb.TelemetrySample(
        session_id=session_id, component="exo", signal=signal, value=value, measured_at=stamp
    )
    return pb.IngestRequest(telemetry=sample)


class Clock:
    """Strictly increasing reading times, from a minute ago: every producer's readings follow
    the ones sent before them."""

    def __init__(self) -> None:
        self._next = datetime.now(UTC) - timedelta(minutes=10)

    def tick(self) -> datetime:
        self._next += timedelta(milliseconds=1)
        return self._next


def stored(child: Child, session_id: str, signal: str, *, below: float = 1e6) -> int:
    """The readings of `signal` in `session_id` the store holds, of magnitude under `below`."""
    with sqlite3.connect(f"file:{child.db_path}?mode=ro", uri=True) as db:
        query = (
            "SELECT count(*) FROM telemetry_samples"
            " WHERE session_id = ? AND signal = ? AND abs(value) < ?"
        )
        (count,) = db.execute(query, (session_id, signal, below)).fetchone()
    return int(count)


def investigated(child: Child, sessions: Sequence[str]) -> Counter[str]:
    """The state of each of these sessions' newest investigation (NONE: it has none)."""
    with sqlite3.connect(f"file:{child.db_path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT session_id, state FROM investigations ORDER BY created_us"
        ).fetchall()
    newest = dict(rows)
    return Counter(newest.get(s, "NONE") for s in sessions)


async def until(check: Callable[[], bool], seconds: float) -> bool:
    """Polls `check` until it holds or `seconds` have passed; whether it held."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


# ------------------------------------------------------------------ rows


@dataclass
class Row:
    peer: str
    sent: int  # hostile inputs
    got: Counter[str] = field(default_factory=Counter)  # what they got: statuses, counts
    victim_acked: int = 0
    victim_lost: int = 0
    fired: dict[str, int] = field(default_factory=dict)  # hazard events, by rule
    hazard_sessions: int = 0  # victim sessions on which a rule fired
    hazards_lost: int = 0  # of those, the ones without an investigation
    states: Counter[str] = field(default_factory=Counter)  # their investigations' states
    rss_before: float = 0.0
    rss_after: float = 0.0
    note: str = ""


def hazard_counts(child: Child, names: Sequence[str]) -> dict[str, int]:
    return {n: int(child.metric("poirot_hazard_events_total", rule=n)) for n in names}


def fired_since(child: Child, before: dict[str, int]) -> dict[str, int]:
    now = hazard_counts(child, list(before))
    return {n: now[n] - before[n] for n in before}


async def settle_hazards(child: Child, row: Row, sessions: Sequence[str]) -> None:
    """Waits for every victim session to have an investigation (up to 30 s), then counts."""
    await until(lambda: investigated(child, sessions)["NONE"] == 0, 30)
    row.states = investigated(child, sessions)
    row.hazard_sessions = len(sessions)
    row.hazards_lost = row.states["NONE"]


async def grpc_refusal(client: PoirotClient, requests: list[pb.IngestRequest]) -> str:
    """The status a stream of these requests ends with."""
    try:
        await client.send(requests)
    except grpc.aio.AioRpcError as error:
        return str(error.code().name)
    return "OK"


async def victim_over_grpc(
    child: Child, clock: Clock, sessions: Sequence[str], signal: str, row: Row
) -> None:
    """Each session's victim readings, one stream each; counts acked and lost."""
    async with PoirotClient(child.target) as client:
        for i, session_id in enumerate(sessions):
            values = victim_values(i)
            requests = [start(session_id)] + [
                reading(session_id, signal, v, clock.tick()) for v in values
            ]
            before = stored(child, session_id, signal)
            durable = await client.send(requests)
            acked = max(0, durable - 1)  # the session start is item 1
            row.victim_acked += acked
            row.victim_lost += acked - (stored(child, session_id, signal) - before)


async def extremes_over_grpc(child: Child, p: Plan, clock: Clock) -> Row:
    names = ["force_spike", "force_offset"]
    row = Row("extreme readings, gRPC Ingest", len(EXTREMES) * 2 * p.repeats)
    row.rss_before = child.rss_mib()
    async with PoirotClient(child.target) as client:
        await client.send(session(2, "victim-grpc"))
        for _ in range(p.repeats):
            for target in ("hostile-own", "victim-grpc"):
                for value in EXTREMES:
                    requests = [start(target), reading(target, "force", value, clock.tick())]
                    row.got[await grpc_refusal(client, requests)] += 1
    for reason in ("value_out_of_range", "invalid"):
        refused = child.metric("poirot_ingest_refused_total", kind="telemetry", reason=reason)
        row.got[f"counted {reason}"] = int(refused)
    before = hazard_counts(child, names)
    sessions = ["victim-grpc", "victim-grpc-2"]
    await victim_over_grpc(child, clock, sessions, "force", row)
    await settle_hazards(child, row, sessions)
    row.fired = fired_since(child, before)
    row.rss_after = child.rss_mib()
    return row


def mqtt_payload(value: float, at: datetime) -> bytes:
    """The JSON the MQTT mapping reads; NaN and ±inf as Python writes them (NaN, Infinity)."""
    return json.dumps({"ts": at.timestamp(), "value": value}).encode()


async def extremes_over_mqtt(child: Child, p: Plan, clock: Clock, broker_port: int) -> Row:
    names = ["force_spike", "force_offset"]
    row = Row("extreme readings, MQTT", len(EXTREMES) * p.repeats)
    row.rss_before = child.rss_mib()
    acked_before = child.metric("poirot_mqtt_messages_acked_total")
    dead_before = child.metric("poirot_mqtt_dead_letters_total")
    victim_before = stored(child, MQTT_SESSION, "force")
    all_before = stored(child, MQTT_SESSION, "force", below=math.inf)
    broker = BrokerConfig(port=broker_port, client_id="hostile-peer", timeout_s=2.0)
    async with MqttPublisher(broker) as hostile:
        for _ in range(p.repeats):
            for value in EXTREMES:
                await hostile.publish(MQTT_TOPIC, mqtt_payload(value, clock.tick()))
    hazards_before = hazard_counts(child, names)
    values = victim_values(7)
    victim = BrokerConfig(port=broker_port, client_id="victim-producer", timeout_s=2.0)
    async with MqttPublisher(victim) as publisher:
        for value in values:
            await publisher.publish(MQTT_TOPIC, mqtt_payload(value, clock.tick()))
            row.victim_acked += 1  # PUBACK at QoS 1: the broker has it
    total = row.sent + len(values)
    await until(
        lambda: child.metric("poirot_mqtt_messages_acked_total") - acked_before >= total, 60
    )
    row.got["dead-lettered"] = int(child.metric("poirot_mqtt_dead_letters_total") - dead_before)
    victim_stored = stored(child, MQTT_SESSION, "force") - victim_before
    all_stored = stored(child, MQTT_SESSION, "force", below=math.inf) - all_before
    row.got["stored"] = all_stored - victim_stored
    row.victim_lost = row.victim_acked - victim_stored
    await settle_hazards(child, row, [MQTT_SESSION])
    row.fired = fired_since(child, hazards_before)
    row.rss_after = child.rss_mib()
    return row


async def declared_extremes(child: Child, p: Plan, clock: Clock) -> Row:
    """±1e150 admitted on grip into the victim's session; the victim's readings after them."""
    names = ["grip_spike", "grip_offset"]
    row = Row("extremes within a declared range (±1e150)", 4 * p.repeats)
    row.rss_before = child.rss_mib()
    target = "victim-declared"
    extremes = [DECLARED, -DECLARED, DECLARED, DECLARED] * p.repeats
    async with PoirotClient(child.target) as client:
        await client.send(session(2, target))
        requests = [start(target)] + [reading(target, "grip", v, clock.tick()) for v in extremes]
        row.got[await grpc_refusal(client, requests)] += len(extremes)
    before = hazard_counts(child, names)
    await victim_over_grpc(child, clock, [target], "grip", row)
    await settle_hazards(child, row, [target])
    row.fired = fired_since(child, before)
    row.rss_after = child.rss_mib()
    row.note = "the victim's first 50 readings push the extremes out of both windows"
    return row


async def trigger_flood(child: Child, p: Plan, clock: Clock) -> Row:
    row = Row("Trigger flood, one client, rate unbounded", 0)
    row.rss_before = child.rss_mib()
    flooded = [f"flood-{i}" for i in range(16)]
    victims = [f"hot-{i}" for i in range(p.victims)]
    refused_before = {r: child.rejected("Investigations.Trigger", r) for r in TRIGGER_REFUSALS}
    deferred_before = child.metric("poirot_investigations_deferred_total")
    async with PoirotClient(child.target) as flooder, PoirotClient(child.target) as victim:
        for session_id in flooded + victims:
            await flooder.send(session(2, session_id))
        stop = asyncio.Event()

        async def flood() -> None:
            i = 0
            while not stop.is_set():
                row.sent += 1
                try:
                    await flooder.trigger(flooded[i % len(flooded)], "flood")
                    row.got["OK"] += 1
                except grpc.aio.AioRpcError as error:
                    row.got[error.code().name] += 1
                i += 1

        before = hazard_counts(child, [OVERHEAT["name"]])
        flooding = asyncio.create_task(flood())
        await asyncio.sleep(1.0)  # the flood has the queue
        for session_id in victims:
            durable = await victim.send(
                [start(session_id), reading(session_id, "motor_temp_c", 85.0, clock.tick())]
            )
            row.victim_acked += max(0, durable - 1)
        await asyncio.sleep(1.0)
        row.states = investigated(child, victims)  # while the flood goes on
        stop.set()
        await flooding
    for reason in TRIGGER_REFUSALS:
        refused = child.rejected("Investigations.Trigger", reason) - refused_before[reason]
        if refused:
            row.got[f"refused {reason}"] = int(refused)
    row.got["hazards deferred"] = int(
        child.metric("poirot_investigations_deferred_total") - deferred_before
    )
    row.victim_lost = row.victim_acked - sum(
        stored(child, s, "motor_temp_c", below=1e3) for s in victims
    )
    during = row.states
    await settle_hazards(child, row, victims)
    row.fired = fired_since(child, before)
    row.note = "during the flood: " + ", ".join(f"{n} {s}" for s, n in sorted(during.items()))
    row.rss_after = child.rss_mib()
    return row


def messages_stored(child: Child, session_id: str, sender: str) -> int:
    """The agent messages of `sender` in `session_id` the store holds."""
    with sqlite3.connect(f"file:{child.db_path}?mode=ro", uri=True) as db:
        query = "SELECT count(*) FROM agent_messages WHERE session_id = ? AND sender = ?"
        (count,) = db.execute(query, (session_id, sender)).fetchone()
    return int(count)


def route_outcomes(child: Child) -> Counter[str]:
    """What the daemon did with agent messages that chose what they may not: refusals by field,
    conflicts set aside, copies dropped."""
    refused = "poirot_mqtt_agent_messages_route_refused_total"
    out = Counter({f"refused {f}": int(child.metric(refused, field=f)) for f in ROUTE_FIELDS})
    conflicts = child.metric("poirot_ingest_conflicts_total", kind="agent_message")
    out["conflicts set aside"] = int(conflicts)
    duplicates = child.metric("poirot_ingest_duplicates_total", kind="agent_message")
    out["dropped as copies"] = int(duplicates)
    return out


def spoofs(n: int) -> list[dict[str, Any]]:
    """The doctor's hostile payloads: the chief's producer and seqs 1..n, then, per seq, the
    chief's session with the human kind, the human kind alone, and index n."""
    seqs = range(1, n + 1)
    keys: list[dict[str, Any]] = [
        {"producer": CHIEF_TOPIC, "seq": s, "content": f"Abort, step {s}."} for s in seqs
    ]
    chosen: list[dict[str, Any]] = [
        {"session": CHIEF_SESSION, "kind": "human", "content": "I am the nurse: abort."},
        {"kind": "human", "content": "I am the nurse: abort."},
        {"index": n, "content": "Abort the session."},
    ]
    return keys + [body for _ in range(n) for body in chosen]


async def publish_messages(
    port: int, client_id: str, topic: str, bodies: list[dict[str, Any]]
) -> None:
    """Each body in order as JSON on `topic`, at QoS 1 (each awaits its PUBACK)."""
    async with MqttPublisher(BrokerConfig(port=port, client_id=client_id, timeout_s=2.0)) as out:
        for body in bodies:
            await out.publish(topic, json.dumps(body).encode())


async def spoofed_keys(child: Child, p: Plan, broker_port: int) -> Row:
    """The doctor's spoofs first (all acked by the daemon), then the chief's seqs 1..n."""
    n = p.repeats * 5
    hostile = spoofs(n)
    row = Row("spoofed keys: another topic's producer, a pinned route's fields", len(hostile))
    row.rss_before = child.rss_mib()
    acked = "poirot_mqtt_agent_messages_acked_total"
    acked_before, got_before = child.metric(acked), route_outcomes(child)
    own_before = messages_stored(child, DOCTOR_SESSION, "doctor")
    victim_before = messages_stored(child, CHIEF_SESSION, "chief")
    await publish_messages(broker_port, "hostile-doctor", DOCTOR_TOPIC, hostile)
    await until(lambda: child.metric(acked) - acked_before >= len(hostile), 60)
    victim = [{"seq": s, "content": f"Proceed, step {s}."} for s in range(1, n + 1)]
    await publish_messages(broker_port, "victim-chief", CHIEF_TOPIC, victim)
    row.victim_acked = len(victim)  # PUBACK at QoS 1: the broker has it
    total = len(hostile) + len(victim)
    await until(lambda: child.metric(acked) - acked_before >= total, 60)
    row.got = route_outcomes(child) - got_before
    row.got["stored as its own"] = messages_stored(child, DOCTOR_SESSION, "doctor") - own_before
    row.victim_lost = row.victim_acked - (
        messages_stored(child, CHIEF_SESSION, "chief") - victim_before
    )
    row.rss_after = child.rss_mib()
    row.note = (
        f"{n} payloads on the doctor's topic name the chief's producer with seqs 1 to {n}; {n}"
        " each choose the chief's session (and kind human), kind human, an index; then the"
        f" chief sends its seqs 1 to {n}: conflicts set aside {row.got['conflicts set aside']},"
        f" messages dropped as copies {row.got['dropped as copies']}. No rule watches agent"
        " messages"
    )
    return row


# ------------------------------------------------------------------ run and report


@dataclass
class Results:
    start_mib: float
    rows: list[Row]
    seconds: float
    queue: dict[str, int]  # POIROTD_QUEUE_*, as QUEUE


async def run(p: Plan, folder: Path) -> Results:
    started = time.monotonic()
    with mosquitto() as broker_port:
        async with child_daemon(folder, hostile_spec(broker_port), env()) as child:
            await until(lambda: child.metric("poirot_mqtt_connects_total") >= 1, 30)
            start_mib = child.rss_mib()
            clock = Clock()
            rows = []
            print("[bench] extreme readings over gRPC", flush=True)
            rows.append(await extremes_over_grpc(child, p, clock))
            print("[bench] extreme readings over MQTT", flush=True)
            rows.append(await extremes_over_mqtt(child, p, clock, broker_port))
            print("[bench] extremes within a declared range", flush=True)
            rows.append(await declared_extremes(child, p, clock))
            print("[bench] Trigger flood", flush=True)
            rows.append(await trigger_flood(child, p, clock))
            print("[bench] spoofed keys", flush=True)
            rows.append(await spoofed_keys(child, p, broker_port))
    return Results(start_mib, rows, time.monotonic() - started, dict(QUEUE))


def main() -> None:
    report.main(NAME, __doc__, "fewer extremes and sessions", plan, run, section)


if __name__ == "__main__":
    main()
