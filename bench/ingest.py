"""Ingest benchmarks for issue #4: MQTT telemetry, hazard latency, gRPC agent messages, memory.

    .venv/bin/python -m bench.ingest --quick          # about 3 minutes
    .venv/bin/python -m bench.ingest --minutes 10     # the full run, 10-minute memory figure

The machine is shared and noisy, so each rate is set against a baseline measured side by side in
this one run, the two sides alternating round by round, and reported as a ratio. Everything runs
on 127.0.0.1; every wait is bounded by a count and a timeout; every process started here is
stopped here. The results replace this mode's section of BENCHMARKS.md, rendered by
bench/sections/ingest.py (`--no-write`: print only); other sections stay.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import numpy as np

from bench import report
from bench.agents import CONTENT, SENDERS
from bench.publisher import FRAME_SIGNALS, SPIKE
from bench.sections.ingest import NAME, section
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttSubscriber
from poirotd.config import Settings, SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.broker import MAX_INFLIGHT, mosquitto
from poirotd.devtools.clinic import CLINIC
from poirotd.hazards import RuleEngine
from poirotd.investigations.triggers import HazardTriggers
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import (
    AgentMessage,
    CommitItem,
    HazardEvent,
    IngestItem,
    ItemKey,
    MessageKind,
    SampleRow,
    Session,
    TelemetryBatch,
)
from poirotd.observability import logs
from poirotd.observability.gc_tuning import tune_for_daemon
from poirotd.store import SqliteStore
from poirotd.store.idempotency import LeftOut

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# Telemetry load of the latency and memory runs (issue #4), and a tenth of it for contrast.
LOAD = 10_000.0
LIGHT_LOAD = 1_000.0
# Agent messages/s per stream during the memory run, next to the 10k samples/s of telemetry.
RSS_AGENT_RATE = 500.0
COMMIT_BATCH = 512  # Settings.ingest_batch_max's default: the raw store commits what gRPC does
# The input's MQTT client buffer (BrokerConfig.queue_size's default). Mosquitto 2.0.11 does not
# hold its max_inflight_messages window once PUBACKs flow (measured: 7,309 un-acked messages
# queued at one client with the window at 1,000); the input stops reading the socket while this
# buffer is nearly full, so a burst waits at the broker instead of in the daemon's memory.
CLIENT_BUFFER = 10_000

FRAME_MAPPING = {
    "topic": "bench/frames",
    "component": "exo",
    "codec": {
        "kind": "struct",
        "format": "<d" + "f" * FRAME_SIGNALS,
        "fields": ["t", *(f"f{j}" for j in range(FRAME_SIGNALS))],
        "timestamp_field": "t",
    },
}
# One JSON reading per message on bench/s0..s9 -> signals s0..s9 (first match wins: frames first).
SAMPLE_MAPPING = {
    "topic": "bench/+",
    "component": "exo",
    "signal": "{w1}",
    "codec": {"kind": "json", "timestamp_field": "ts"},
}
# Watching every signal of the rate run, never firing (readings are N(0, 1)): the cost of rule
# evaluation without investigations.
SAMPLE_RULES = [
    {"kind": kind, "name": f"s{k}_{kind}", "component": "exo", "signal": f"s{k}", **extra}
    for k in range(10)
    for kind, extra in (
        ("threshold", {"above": 100.0}),
        ("rolling_mean", {"above": 100.0, "window_samples": 50}),
    )
]
# An agent_flag rule evaluates every agent message (none carries the marker).
# A bench.agents message as a batched item, in bytes (its text and the fields around it).
AGENT_ITEM_BYTES = len(CONTENT) + 40
MESSAGE_RULE = {"name": "agent_flag", "kind": "agent_flag"}


def frame_rules(cooldown_s: float, above: float = SPIKE / 2) -> list[dict[str, Any]]:
    """One threshold per frame signal; each signal spikes once per SPIKE_PERIOD frames."""
    return [
        {
            "name": f"f{j}_spike",
            "kind": "threshold",
            "component": "exo",
            "signal": f"f{j}",
            "above": above,
            "cooldown_seconds": cooldown_s,
        }
        for j in range(FRAME_SIGNALS)
    ]


def bench_spec(
    rules: Sequence[dict[str, Any]],
    mqtt_port: int | None = None,
    broker: dict[str, Any] | None = None,
) -> SystemSpec:
    """The tests' clinic with these rules and, given a broker, the in-process input (`broker`:
    further BrokerConfig fields, e.g. TLS and credentials)."""
    data = CLINIC.model_dump(mode="json")
    data["rules"] = [{"severity": "warning", **rule} for rule in rules]
    if mqtt_port is not None:
        data["inputs"] = {
            "session_id": "bench",
            "mqtt": {
                "broker": {
                    "port": mqtt_port,
                    "client_id": "poirotd-bench",
                    "queue_size": CLIENT_BUFFER,
                    **(broker or {}),
                },
                "mappings": [FRAME_MAPPING, SAMPLE_MAPPING],
            },
        }
    return SystemSpec.model_validate(data)


# ------------------------------------------------------------------ plumbing


@dataclass(frozen=True)
class Plan:
    mode: str
    rounds: int
    mqtt_messages: int
    latency_seconds: float
    agent_streams: int
    agent_messages: int  # per stream
    rss_minutes: float
    rss_bursts: tuple[int, ...]  # frames per saturating burst after the memory run's load


def plan(quick: bool, minutes: float) -> Plan:
    if quick:
        return Plan("quick", 2, 10_000, 15.0, 4, 5_000, 1.0, (2_000, 8_000))
    return Plan("full", 3, 30_000, 60.0, 4, 25_000, minutes, (3_000, 12_000))


@dataclass
class Meter:
    """Wall time and this process's CPU time (event loop and store threads) over a block."""

    seconds: float = 0.0
    cpu_share: float = 0.0  # of one core

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        try:
            yield
        finally:
            self.seconds = time.perf_counter() - wall
            self.cpu_share = (_cpu_seconds() - cpu) / self.seconds


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Worker:
    """A benchmark process speaking ready / go / one JSON line (bench.publisher, bench.agents)."""

    def __init__(self, module: str, *args: object) -> None:
        self._argv = [sys.executable, "-m", module, *(str(a) for a in args)]
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Worker:
        self._process = await asyncio.create_subprocess_exec(
            *self._argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT
        )
        async with asyncio.timeout(30):
            line = await self._streams()[1].readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"{self._argv[2]} did not start: {line!r}")
        return self

    def _streams(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        assert self._process is not None and self._process.stdin and self._process.stdout
        return self._process.stdin, self._process.stdout

    async def go(self) -> None:
        stdin = self._streams()[0]
        stdin.write(b"go\n")
        await stdin.drain()

    async def result(self, timeout_s: float) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            line = await self._streams()[1].readline()
        if not line:
            raise RuntimeError(f"{self._argv[2]} ended without a result")
        result: dict[str, Any] = json.loads(line)
        return result

    async def __aexit__(self, *exc: object) -> None:
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def mqtt_counter(daemon: Daemon, name: str) -> float:
    """One of the input's counters, reading only its collector (cheap enough to poll)."""
    full = f"poirot_mqtt_{name}_total"
    for family in daemon.metrics.registry.restricted_registry([full]).collect():
        for sample in family.samples:
            if sample.name == full:
                return float(sample.value)
    raise LookupError(full)


async def until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.01) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 - polling counters that have no event to wait on
            await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def running_daemon(
    spec: SystemSpec, folder: Path, security: dict[str, Any] | None = None
) -> AsyncIterator[Daemon]:
    """`security`: Settings fields beyond the defaults (TLS files, the access file)."""
    settings = Settings(
        db_path=folder / "poirotd.db", grpc_port=0, metrics_port=0, **(security or {})
    )
    daemon = Daemon(settings, spec, backend=ScriptedBackend(schema_answer))
    await daemon.start()
    try:
        if spec.inputs is not None:
            await until(lambda: mqtt_counter(daemon, "connects") >= 1, 10)
        yield daemon
    finally:
        await daemon.stop()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# ------------------------------------------------------------------ MQTT sustained rate


@dataclass
class Rate:
    count: int
    meter: Meter
    offered: float = 0.0  # what the load generator managed, per second
    generator_cpu: float = 0.0  # the load generator's CPU, share of one core

    @property
    def per_second(self) -> float:
        return self.count / self.meter.seconds


async def bare_subscriber(port: int, messages: int) -> Rate:
    """aiomqtt at QoS 1, counting: what the broker and one Python MQTT client deliver."""
    meter = Meter()
    async with aiomqtt.Client("127.0.0.1", port, identifier="bare-subscriber") as client:
        await client.subscribe("bench/#", qos=1)
        async with _publisher(port, SAMPLE, messages) as publisher:
            with meter.measure():
                await publisher.go()
                count = 0
                async with asyncio.timeout(max(60.0, messages / 200)):
                    async for _ in client.messages:
                        count += 1
                        if count == messages:
                            break
            published = await publisher.result(30)
    return Rate(count, meter, published["published"] / published["seconds"])


async def transport_subscriber(port: int, messages: int) -> Rate:
    """hwbridge's MQTT transport alone, acking each message on receipt: the same client, burst
    reads and buffer draining as the daemon's input, with nothing behind them."""
    meter = Meter()
    subscriber = MqttSubscriber(
        BrokerConfig(port=port, client_id="bare-transport"), [("bench/#", 1)]
    )
    deliveries = subscriber.deliveries()
    count = 0

    async def take_all() -> None:
        nonlocal count
        async for delivery in deliveries:
            delivery.ack()
            count += 1
            if count == messages:
                return

    async with asyncio.TaskGroup() as group:
        taking = group.create_task(take_all())
        await until(lambda: subscriber.stats.connects > 0, 30)
        async with _publisher(port, SAMPLE, messages) as publisher:
            with meter.measure():
                await publisher.go()
                async with asyncio.timeout(max(60.0, messages / 200)):
                    await taking
            published = await publisher.result(30)
    await deliveries.aclose()
    return Rate(count, meter, published["published"] / published["seconds"])


@dataclass(frozen=True)
class Layout:
    """A publisher layout, the rules the daemon evaluates on it, and readings per message."""

    name: str
    rules: Sequence[dict[str, Any]]
    readings: int


SAMPLE = Layout("sample", SAMPLE_RULES, 1)
# Spikes reach SPIKE: rules above it never fire, so no investigation competes with ingest.
FRAMES = Layout("frames", frame_rules(60.0, above=2 * SPIKE), FRAME_SIGNALS)


@dataclass(frozen=True)
class MqttCredentials:
    """How the input and the publisher reach a locked broker (TLS, a client certificate and a
    password): the input's BrokerConfig fields and the publisher's options."""

    broker: dict[str, Any]
    publisher_args: tuple[object, ...]


async def daemon_input(
    port: int,
    messages: int,
    folder: Path,
    layout: Layout,
    credentials: MqttCredentials | None = None,
) -> Rate:
    """The daemon's input: decode, validate, durable commit, rules, then PUBACK. Counts
    readings (= messages for the one-reading layout)."""
    meter = Meter()
    broker, extra = (credentials.broker, credentials.publisher_args) if credentials else ({}, ())
    async with running_daemon(bench_spec(layout.rules, port, broker), folder) as daemon:
        async with _publisher(port, layout, messages, *extra) as publisher:
            with meter.measure():
                await publisher.go()
                await until(
                    lambda: mqtt_counter(daemon, "messages_acked") >= messages,
                    max(60.0, messages / 100),
                    0.05,
                )
            published = await publisher.result(30)
        committed = mqtt_counter(daemon, "samples_committed")
        dropped = mqtt_counter(daemon, "messages_dropped")
        if committed != messages * layout.readings or dropped:
            raise RuntimeError(
                f"{committed:.0f} samples committed, {dropped:.0f} messages dropped by the "
                f"client, of {messages} messages"
            )
    return Rate(int(committed), meter, published["published"] / published["seconds"])


def _publisher(port: int, layout: Layout, messages: int, *extra: object) -> Worker:
    return Worker(
        "bench.publisher",
        *("--port", port, "--layout", layout.name, "--window", MAX_INFLIGHT),
        *("--messages", messages, *extra),
    )


async def mqtt_rate(p: Plan, folder: Path) -> dict[str, Any]:
    """Rounds of (a) a plain aiomqtt subscriber, (a') hwbridge's transport alone, (b) the daemon
    input, one reading per message, the order reversed every other round; then (c) the daemon
    input on 50-reading frames against (d) the store committing the same readings, the limit
    once messages are large."""
    bare: list[Rate] = []
    transport: list[Rate] = []
    daemon: list[Rate] = []
    frames: list[Rate] = []
    store: list[Rate] = []
    frame_messages = p.mqtt_messages // 5

    async def run_bare(port: int, _: Path) -> None:
        bare.append(await bare_subscriber(port, p.mqtt_messages))

    async def run_transport(port: int, _: Path) -> None:
        transport.append(await transport_subscriber(port, p.mqtt_messages))

    async def run_daemon(port: int, where: Path) -> None:
        daemon.append(await daemon_input(port, p.mqtt_messages, where, SAMPLE))

    sides: list[Callable[[int, Path], Awaitable[None]]] = [run_bare, run_transport, run_daemon]
    for r in range(p.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            where = folder / f"{r}-{side.__name__}"
            where.mkdir()
            with mosquitto() as port:
                await side(port, where)
        where = folder / f"{r}-frames"
        where.mkdir()
        with mosquitto() as port:
            frames.append(await daemon_input(port, frame_messages, where, FRAMES))
        commits = telemetry_commits(frame_messages * FRAME_SIGNALS)
        store.append(await raw_commit(commits, where / "raw.db"))
    return {
        "bare": median([x.per_second for x in bare]),
        "transport": median([x.per_second for x in transport]),
        "daemon": median([x.per_second for x in daemon]),
        "ratios": [d.per_second / t.per_second for t, d in zip(transport, daemon, strict=True)],
        "bare_ratios": [d.per_second / b.per_second for b, d in zip(bare, daemon, strict=True)],
        "bare_cpu": median([x.meter.cpu_share for x in bare]),
        "transport_cpu": median([x.meter.cpu_share for x in transport]),
        "daemon_cpu": median([x.meter.cpu_share for x in daemon]),
        "offered": median([x.offered for x in bare + daemon]),
        "frames": median([x.per_second for x in frames]),
        "store": median([x.per_second for x in store]),
        "frame_ratios": [f.per_second / s.per_second for f, s in zip(frames, store, strict=True)],
        "frames_cpu": median([x.meter.cpu_share for x in frames]),
        "messages": p.mqtt_messages,
        "frame_messages": frame_messages,
        "rounds": p.rounds,
    }


# ------------------------------------------------------------------ hazard latency


@dataclass
class Probe:
    """What the bench-only hooks saw: publish → HazardEvent (rules evaluated on arrival) and
    publish → the triggers opening investigations for it (after the commit), in seconds, both
    against the triggering sample's measured_at, which the publisher stamps with its send time;
    and each store commit as (items, seconds)."""

    events: list[float] = field(default_factory=list)
    opened: list[float] = field(default_factory=list)
    commits: list[tuple[int, float]] = field(default_factory=list)
    # Each cyclic garbage collection in this process, in seconds (the event loop waits).
    collections: list[float] = field(default_factory=list)


@contextlib.contextmanager
def probes(probe: Probe) -> Iterator[None]:
    """Installs the hooks that fill `probe` (and a collector callback); removed on exit."""
    evaluate, open_events, commit_ingest = (
        RuleEngine.observe,
        HazardTriggers.open,
        SqliteStore.commit_ingest,
    )

    def timed_evaluate(self: RuleEngine, items: Sequence[CommitItem]) -> list[HazardEvent]:
        events = evaluate(self, items)
        now = time.time()
        probe.events.extend(now - event.at.timestamp() for event in events)
        return events

    async def timed_open(self: HazardTriggers, events: Sequence[HazardEvent]) -> None:
        now = time.time()
        probe.opened.extend(now - event.at.timestamp() for event in events)
        await open_events(self, events)

    async def timed_commit(
        self: SqliteStore, items: Sequence[CommitItem], keys: Sequence[ItemKey | None] = ()
    ) -> LeftOut:
        began = time.perf_counter()
        left_out = await commit_ingest(self, items, keys)
        if samples := _samples_in(items):  # not a session start
            probe.commits.append((samples, time.perf_counter() - began))
        return left_out

    hooks = {
        (RuleEngine, "observe"): (timed_evaluate, evaluate),
        (HazardTriggers, "open"): (timed_open, open_events),
        (SqliteStore, "commit_ingest"): (timed_commit, commit_ingest),
    }
    began: list[float] = []

    def collected(phase: str, _: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            probe.collections.append(time.perf_counter() - began[0])

    for (owner, name), (hook, _) in hooks.items():
        setattr(owner, name, hook)
    gc.callbacks.append(collected)
    try:
        yield
    finally:
        gc.callbacks.remove(collected)
        for (owner, name), (_, original) in hooks.items():
            setattr(owner, name, original)


async def hazard_latency(p: Plan, folder: Path, samples_per_s: float) -> dict[str, Any]:
    """One frame of FRAME_SIGNALS readings per message; every signal spikes once per
    SPIKE_PERIOD frames and one threshold rule per signal (cooldown 2 s) fires on it."""
    probe = Probe()
    meter = Meter()
    with mosquitto() as port, probes(probe):
        spec = bench_spec(frame_rules(cooldown_s=2.0), port)
        async with running_daemon(spec, folder) as daemon:
            args = ("--rate", samples_per_s / FRAME_SIGNALS, "--seconds", p.latency_seconds)
            async with Worker(
                "bench.publisher", "--port", port, "--layout", "frames", *args
            ) as publisher:
                with meter.measure():
                    await publisher.go()
                    published = (await publisher.result(p.latency_seconds + 60))["published"]
                await until(lambda: mqtt_counter(daemon, "messages_acked") >= published, 30)
            investigations = _count(daemon, "SELECT count(*) FROM investigations")
    ms = np.array(probe.events) * 1000
    opened_ms = np.array(probe.opened) * 1000
    sizes = [n for n, _ in probe.commits]
    commit_ms = np.array([t for _, t in probe.commits]) * 1000
    return {
        "events": len(probe.events),
        **{f"p{q}": float(np.percentile(ms, q)) for q in (50, 95, 99)},
        "max": float(ms.max()),
        **{f"opened_p{q}": float(np.percentile(opened_ms, q)) for q in (50, 99)},
        "offered": published * FRAME_SIGNALS / meter.seconds,
        "cpu": meter.cpu_share,
        "investigations": investigations,
        "seconds": p.latency_seconds,
        "batch": median(sizes),
        "commit_p50": float(np.percentile(commit_ms, 50)),
        "commit_p99": float(np.percentile(commit_ms, 99)),
        "collections": len(probe.collections),
        "collection_max": 1000 * max(probe.collections, default=0.0),
    }


def _count(daemon: Daemon, sql: str) -> int:
    with contextlib.closing(sqlite3.connect(daemon.settings.db_path)) as db:
        return int(db.execute(sql).fetchone()[0])


# ------------------------------------------------------------------ gRPC agent messages


async def grpc_ingest(
    p: Plan,
    folder: Path,
    security: dict[str, Any] | None = None,
    client_args: Sequence[object] = (),
) -> Rate:
    """bench.agents against the daemon; `security`: its TLS and access settings, `client_args`:
    the client's matching options (bench.agents --help)."""
    meter = Meter()
    async with (
        running_daemon(bench_spec([MESSAGE_RULE]), folder, security) as daemon,
        Worker(
            "bench.agents",
            *("--target", f"127.0.0.1:{daemon.grpc_port}", "--streams", p.agent_streams),
            *("--messages", p.agent_messages, *client_args),
        ) as agents,
    ):
        with meter.measure():
            await agents.go()
            result = await agents.result(600)
    expected = p.agent_streams * p.agent_messages
    if result["acked"] != expected:
        raise RuntimeError(f"{result['acked']} messages acked of {expected}")
    # The client's own clock: from its first write to its last ack.
    meter.seconds = result["seconds"]
    return Rate(result["acked"], meter, generator_cpu=result["cpu_s"] / result["seconds"])


def agent_items(p: Plan) -> list[IngestItem]:
    """The messages bench.agents sends, as the store takes them."""
    at = datetime.now(UTC)
    items: list[IngestItem] = []
    for stream in range(p.agent_streams):
        session_id = f"raw-{stream}"
        items.append(Session(session_id=session_id, system="clinic", started_at=at))
        items.extend(
            AgentMessage(
                session_id=session_id,
                index=i,
                kind=MessageKind.AGENT,
                sender=SENDERS[i % len(SENDERS)],
                content=CONTENT,
                sent_at=at + timedelta(microseconds=i),
            )
            for i in range(p.agent_messages)
        )
    return items


def telemetry_commits(count: int) -> list[list[CommitItem]]:
    """Frame-layout telemetry (FRAME_SIGNALS signals) as the MQTT input commits it: batches of
    rows, COMMIT_BATCH rows each, after the session start."""
    at = datetime.now(UTC)
    rows: list[SampleRow] = [
        (
            "exo",
            f"f{i % FRAME_SIGNALS}",
            i / 7,
            at + timedelta(microseconds=i // FRAME_SIGNALS * 5_000),
        )
        for i in range(count)
    ]
    session = Session(session_id="raw", system="clinic", started_at=at)
    batches: list[list[CommitItem]] = [
        [TelemetryBatch("raw", rows[start : start + COMMIT_BATCH])]
        for start in range(0, count, COMMIT_BATCH)
    ]
    return [[session], *batches]


def in_commits(items: Sequence[CommitItem]) -> list[Sequence[CommitItem]]:
    """Items in commits of COMMIT_BATCH, as gRPC ingest commits them."""
    size = COMMIT_BATCH
    return [items[start : start + size] for start in range(0, len(items), size)]


def _samples_in(items: Sequence[CommitItem]) -> int:
    """Messages and telemetry samples (a batch counts its rows); session starts do not count."""
    return sum(
        len(item.rows) if isinstance(item, TelemetryBatch) else not isinstance(item, Session)
        for item in items
    )


async def raw_commit(commits: Sequence[Sequence[CommitItem]], db: Path) -> Rate:
    """Commits straight into Store.commit_ingest: the store's own rate, without transport,
    validation or rules. Session starts are not counted."""
    meter = Meter()
    store = await SqliteStore.open(db)
    try:
        with meter.measure():
            for items in commits:
                await store.commit_ingest(items)
    finally:
        await store.close()
    return Rate(sum(_samples_in(items) for items in commits), meter)


async def agent_ingest(p: Plan, folder: Path) -> dict[str, Any]:
    grpc_rates: list[Rate] = []
    raw_rates: list[Rate] = []
    for r in range(p.rounds):
        where = folder / f"grpc-{r}"
        where.mkdir()
        if r % 2 == 0:
            grpc_rates.append(await grpc_ingest(p, where))
            raw_rates.append(await raw_commit(in_commits(agent_items(p)), where / "raw.db"))
        else:
            raw_rates.append(await raw_commit(in_commits(agent_items(p)), where / "raw.db"))
            grpc_rates.append(await grpc_ingest(p, where))
    return {
        "grpc": median([x.per_second for x in grpc_rates]),
        "raw": median([x.per_second for x in raw_rates]),
        "ratios": [g.per_second / s.per_second for g, s in zip(grpc_rates, raw_rates, strict=True)],
        "grpc_cpu": median([x.meter.cpu_share for x in grpc_rates]),
        "client_cpu": median([x.generator_cpu for x in grpc_rates]),
        "messages": p.agent_streams * p.agent_messages,
        "streams": p.agent_streams,
        "rounds": p.rounds,
    }


# ------------------------------------------------------------------ memory


def proc_status(pid: int, field_name: str) -> int:
    """A number of /proc/PID/status: KiB for the Vm* fields, a count for Threads."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise LookupError(field_name)


@dataclass
class RssRun:
    minutes: float
    samples_mib: list[tuple[float, float]] = field(default_factory=list)  # (minute, VmRSS)
    start_mib: float = 0.0
    hwm_mib: float = 0.0  # at the end of the load
    drained_hwm_mib: float = 0.0  # once drained, just before exit
    telemetry: int = 0
    messages: int = 0
    # Telemetry samples the daemon had committed when the publisher finished.
    committed: int = 0
    # After each saturating burst: (readings in it, VmRSS MiB).
    bursts: list[tuple[int, float]] = field(default_factory=list)
    db_mib: float = 0.0
    pauses: float = 0.0  # times the input paused reading from the broker, all run long
    dropped: float = 0.0  # messages its client buffer dropped, all run long


async def peak_rss(p: Plan, folder: Path) -> RssRun:
    """The daemon as a child process under 10k samples/s of MQTT telemetry (rules firing,
    investigations opening once a minute) plus agent messages over gRPC, for the whole run."""
    run = RssRun(p.rss_minutes)
    seconds = p.rss_minutes * 60
    with mosquitto() as port:
        spec = bench_spec([*frame_rules(cooldown_s=60.0), MESSAGE_RULE], port)
        spec_path, db, ready = folder / "spec.json", folder / "rss.db", folder / "ready.json"
        spec_path.write_text(spec.model_dump_json())
        argv = [sys.executable, "-m", "bench.daemon_child", str(spec_path), str(db), str(ready)]
        child = await asyncio.to_thread(spawn, argv)
        try:
            await until(ready.exists, 60, 0.1)
            ports = json.loads(ready.read_text())
            grpc_port, metrics_port = ports["grpc_port"], ports["metrics_port"]
            run.start_mib = proc_status(child.pid, "VmRSS") / 1024
            telemetry = Worker(
                "bench.publisher",
                *("--port", port, "--layout", "frames"),
                *("--rate", LOAD / FRAME_SIGNALS, "--seconds", seconds),
            )
            agents = Worker(
                "bench.agents",
                *("--target", f"127.0.0.1:{grpc_port}", "--streams", 1),
                *("--rate", RSS_AGENT_RATE, "--seconds", seconds),
            )
            async with telemetry, agents:
                began = time.monotonic()
                await telemetry.go()
                await agents.go()
                while (elapsed := time.monotonic() - began) < seconds:
                    rss = proc_status(child.pid, "VmRSS") / 1024
                    run.samples_mib.append((elapsed / 60, rss))
                    await asyncio.sleep(min(5.0, seconds - elapsed))
                run.telemetry = (await telemetry.result(120))["published"] * FRAME_SIGNALS
                run.committed = int(await asyncio.to_thread(_scrape, metrics_port))
                run.messages = (await agents.result(120))["acked"]
            run.hwm_mib = proc_status(child.pid, "VmHWM") / 1024
            for frames in p.rss_bursts:
                await _burst(port, metrics_port, frames)
                run.bursts.append((frames * FRAME_SIGNALS, proc_status(child.pid, "VmRSS") / 1024))
            run.pauses = await asyncio.to_thread(
                _scrape, metrics_port, "poirot_mqtt_read_pauses_total"
            )
            run.dropped = await asyncio.to_thread(
                _scrape, metrics_port, "poirot_mqtt_messages_dropped_total"
            )
        finally:
            run.drained_hwm_mib = await asyncio.to_thread(reap, child) / 1024
    run.db_mib = await asyncio.to_thread(_size_mib, folder, "rss.db*")
    return run


async def _burst(port: int, metrics_port: int, frames: int) -> None:
    """Frames as fast as the publisher goes, far beyond what the input takes, until committed:
    the input's queues fill to their configured bounds."""
    target = await asyncio.to_thread(_scrape, metrics_port) + frames * FRAME_SIGNALS
    async with _publisher(port, FRAMES, frames) as publisher:
        await publisher.go()
        await publisher.result(120)
    async with asyncio.timeout(frames * FRAME_SIGNALS / 1_000):
        while await asyncio.to_thread(_scrape, metrics_port) < target:  # noqa: ASYNC110
            await asyncio.sleep(0.5)  # another process's counter: nothing to wait on but polls


def _scrape(port: int, name: str = "poirot_mqtt_samples_committed_total") -> float:
    """One sample from the daemon's /metrics, the way Prometheus sees it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise LookupError(name)


def spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`argv` from the repository's root, with this environment or `env`."""
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def reap(child: subprocess.Popen[bytes]) -> float:
    """SIGTERM (the daemon drains), SIGKILL after 30 s; the last VmHWM (KiB) read before it
    exited, so the drain is covered. Not ru_maxrss: Linux carries the spawning process's peak
    into an exec'd child's, which made this figure the benchmark's own size."""
    child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    hwm = 0
    while child.poll() is None:
        with contextlib.suppress(OSError, LookupError):
            hwm = proc_status(child.pid, "VmHWM")
        if time.monotonic() > deadline:
            child.kill()
            deadline = float("inf")
        time.sleep(0.05)
    return float(hwm)


def _size_mib(folder: Path, pattern: str) -> float:
    return sum(path.stat().st_size for path in folder.glob(pattern)) / 2**20


# ------------------------------------------------------------------ report


@dataclass(frozen=True)
class Setup:
    """The fixed figures the runs use, which the section quotes."""

    load: float = LOAD
    commit_batch: int = COMMIT_BATCH
    client_buffer: int = CLIENT_BUFFER
    agent_item_bytes: int = AGENT_ITEM_BYTES


@dataclass
class Results:
    mqtt: dict[str, Any]
    latency: dict[str, Any]
    light: dict[str, Any]
    agents: dict[str, Any]
    rss: RssRun
    mosquitto_version: str
    setup: Setup = field(default_factory=Setup)


def mosquitto_version() -> str:
    out = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].removeprefix("mosquitto version ") if out.stdout else "?"


async def run(p: Plan) -> Results:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        folder = Path(tmp)

        def step(name: str) -> Path:
            print(f"[bench] {name}", flush=True)
            (folder / name).mkdir()
            return folder / name

        mqtt = await mqtt_rate(p, step("mqtt"))
        latency = await hazard_latency(p, step("latency"), LOAD)
        light = await hazard_latency(p, step("light"), LIGHT_LOAD)
        agents = await agent_ingest(p, step("agents"))
        rss = await peak_rss(p, step("rss"))
    return Results(mqtt, latency, light, agents, rss, mosquitto_version())


async def until_signalled(work: Awaitable[T]) -> T:
    """SIGTERM or SIGINT cancels the run, so every broker and process it started is stopped."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    return await task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short rounds, 1-minute memory run")
    parser.add_argument("--minutes", type=float, default=10.0, help="memory run length (full)")
    report.add_no_write(parser)
    args = parser.parse_args()
    logs.configure("warning", "json")
    # The daemon's process runs with this collector setting (Daemon.run_until_signalled); the
    # in-process runs here mirror it, the baselines alike.
    tune_for_daemon()
    p = plan(args.quick, args.minutes)
    results = asyncio.run(until_signalled(run(p)))
    report.publish(f"{NAME} {p.mode}", section(p, results), write=not args.no_write)


if __name__ == "__main__":
    main()
