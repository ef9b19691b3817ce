"""Fuzzing benchmark for issue 20: every transport of the daemon against malformed input.

    .venv/bin/python -m bench.fuzz            # 10,000 inputs per target (about 15 minutes)
    .venv/bin/python -m bench.fuzz --quick    # 500 per target: the smoke test of tests/

A real daemon runs in this process on its own event-loop thread (the tests' clinic spec, a
scripted LLM, its SQLite store in a temporary folder, on tmpfs when there is one) with a real
Mosquitto (`poirotd.devtools.broker`) for its MQTT input. Hypothesis generates the inputs
(`bench.fuzz_inputs`) on the main thread, one at a time: every RPC of poirot.v1 over loopback
gRPC, structured mutations of valid requests and raw bytes through a generic channel method;
MQTT messages through the broker to the daemon's input; spec YAML through the loader the daemon
starts with. Each input waits for its answer before the next, so each latency is the daemon's.

The full run writes its section of BENCHMARKS.md (which also says what each count means); a
quick run only prints, and `--json` saves the tallies for the test.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from bench import report
from bench.fuzz_inputs import Hints, ingest_stream, mqtt_messages, request_bytes, spec_texts
from bench.sections.fuzz import SECTION, findings, section, statuses, table
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import Settings, SystemSpec
from poirotd.config.loader import SpecError, load_spec_text
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.broker import mosquitto
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.ingest_requests import session
from poirotd.llm.scripted import ScriptedBackend
from poirotd.observability.gc_tuning import tune_for_daemon
from poirotd.transports.mqtt import mqtt_input_spec

FULL_INPUTS = 10_000
QUICK_INPUTS = 500
SLOW_SECONDS = 1.0
# An input without an answer by then is given up on (and counted slow).
GIVE_UP_SECONDS = 30.0
# Every this many MQTT inputs, a valid reading with a known value that must end up stored.
CANARY_EVERY = 20
# Findings kept per target and kind, for the report.
FINDINGS_KEPT = 3

_T = TypeVar("_T")

# ------------------------------------------------------------------ the daemon under test

SESSIONS = ("fz-1", "fz-2")
MQTT_SESSION = "fz-mqtt"
REGIONS = ("doctor", "chief", "physio", "exo")
# Each topic family of bench.fuzz_inputs.mqtt_messages, and the canaries'.
MAPPINGS: list[dict[str, Any]] = [
    {"topic": "fz/canary", "component": "exo", "signal": "canary"},
    # A templated signal: a publisher can mint names until the component's bound refuses them.
    {"topic": "fz/j/+", "component": "exo", "signal": "{w1}{field}"},
    {"topic": "fz/c/+", "component": "exo", "codec": {"kind": "cbor"}},
    {
        "topic": "fz/f",
        "component": "exo",
        "codec": {"kind": "struct", "format": "<dff", "fields": ["t", "a", "b"]},
    },
    # A templated component: undeclared ones are refused and dead-lettered.
    {"topic": "fz/k/+/raw", "component": "{w1}"},
    {
        "topic": "fz/ms",
        "component": "exo",
        "codec": {"kind": "json", "timestamp_unit": "ms", "fields": ["a"], "prefix_field": "sym"},
    },
]


def fuzz_spec(broker_port: int) -> dict[str, Any]:
    """The tests' clinic with reputation on, a pinned hazard space, a rule on the exoskeleton's
    readings and an MQTT input: every path an input can take is live."""
    data = CLINIC.model_dump(mode="json")
    data["protocol"]["reputation"] = {"enabled": True}
    data["hazard_space"] = {
        "regions": [
            {"id": r, "name": r, "type": "hardware" if r == "exo" else "agent", "description": r}
            for r in REGIONS
        ]
    }
    rule = {"name": "exo_value_high", "kind": "threshold", "severity": "warning"}
    data["rules"] = [rule | {"component": "exo", "signal": "value", "above": 1e6}]
    data["inputs"] = {
        "session_id": MQTT_SESSION,
        "mqtt": {
            "broker": {
                "port": broker_port,
                "client_id": "poirotd-fuzz",
                "timeout_s": 2.0,
                "backoff": {"initial_s": 0.05, "max_s": 0.5},
            },
            "mappings": MAPPINGS,
        },
    }
    return data


class LoopThread:
    """An event loop on its own thread, for the daemon and the calls made to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.faults: list[str] = []
        self.loop.set_exception_handler(self._on_fault)
        self._thread = threading.Thread(target=self.loop.run_forever, name="daemon", daemon=True)
        self._thread.start()

    def _on_fault(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What asyncio reports unhandled: a task that died with its exception unretrieved, a
        callback that raised."""
        error = context.get("exception")
        self.faults.append(f"{context.get('message', '')}: {error!r}"[:300])

    def run(self, work: Coroutine[Any, Any, _T], timeout: float = GIVE_UP_SECONDS) -> _T:
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass(frozen=True)
class Seeded:
    """What the daemon holds before fuzzing: the valid values requests are built from."""

    investigations: tuple[str, ...]
    page_token: str
    last_event_id: int


class Harness:
    """The daemon under test, its broker, a gRPC channel and an MQTT publisher to it."""

    def __init__(self, folder: Path, broker_port: int) -> None:
        self.folder = folder
        self.spec = SystemSpec.model_validate(fuzz_spec(broker_port))
        self.broker = BrokerConfig(port=broker_port, client_id="fuzz-publisher", timeout_s=2.0)
        self.thread = LoopThread()
        self.daemon = Daemon(
            Settings(db_path=folder / "poirotd.db", grpc_port=0, metrics_port=0, drain_seconds=5),
            self.spec,
            backend=ScriptedBackend(schema_answer),
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dead: set[str] = set()
        # The longest the daemon's loop went without running a ready task, since `stalls()`.
        self._stall = 0.0
        self.channel: grpc.aio.Channel
        self.blocking_channel: grpc.Channel
        self.publisher: MqttPublisher
        self.seeded: Seeded
        self._watchdog: asyncio.Task[None]

    @property
    def db_path(self) -> Path:
        return self.daemon.settings.db_path

    def start(self) -> None:
        self.seeded = self.thread.run(self._start(), timeout=120)

    async def _start(self) -> Seeded:
        await self.daemon.start()
        target = f"127.0.0.1:{self.daemon.grpc_port}"
        unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self.channel = grpc.aio.insecure_channel(target, options=unlimited)
        self.blocking_channel = grpc.insecure_channel(target, options=unlimited)
        self.publisher = await MqttPublisher(self.broker).__aenter__()
        seeded = await self._seed(target)
        while self.counter("connects") < 1:  # noqa: ASYNC110 - a counter has no event to wait on
            await asyncio.sleep(0.02)
        self._watchdog = asyncio.create_task(self._watch_loop(), name="fuzz-watchdog")
        # The daemon's long-lived tasks (named; asyncio numbers the others): one that ends is
        # a task that died.
        self._tasks = {
            t for t in asyncio.all_tasks() if not t.done() and not t.get_name().startswith("Task-")
        }
        return seeded

    async def _seed(self, target: str) -> Seeded:
        """Two sessions, three investigations run to the end, one of them confirmed."""
        async with PoirotClient(target) as client:
            for session_id in SESSIONS:
                await client.send(session(8, session_id))
            ids = []
            for method in ("poirot", "baseline", "poirot"):
                queued = await client.trigger(SESSIONS[0], "seeded by the fuzzer", method)
                async for _ in client.watch(queued.investigation_id):
                    pass
                ids.append(queued.investigation_id)
            await client.confirm(ids[0], ["exo"], note="seeded")
            page = await client.investigations.List(pb.ListInvestigationsRequest(page_size=1))
            events = [e.event_id async for e in client.watch(ids[-1])]
        return Seeded(tuple(ids), page.next_page_token, max(events))

    async def _watch_loop(self) -> None:
        """Sleeps a tick at a time: how late it wakes is how long the loop was blocked."""
        tick = 0.05
        while True:
            started = time.monotonic()
            await asyncio.sleep(tick)
            self._stall = max(self._stall, time.monotonic() - started - tick)

    def stalls(self) -> float:
        stall, self._stall = self._stall, 0.0
        return stall

    def counter(self, name: str) -> float:
        """One of the MQTT input's counters (`poirot_mqtt_<name>_total`)."""
        value = self.daemon.metrics.registry.get_sample_value(f"poirot_mqtt_{name}_total")
        return value or 0.0

    def faults(self) -> list[str]:
        """Faults since the last call: asyncio's reports and long-lived tasks that ended."""
        found, self.thread.faults = self.thread.faults, []
        for task in self._tasks:
            name = task.get_name()
            if task.done() and name not in self._dead:
                self._dead.add(name)
                error = None if task.cancelled() else task.exception()
                found.append(f"task {name} ended: {error!r}")
        return found

    def alive(self) -> bool:
        """The daemon answers its health check."""

        async def check() -> bool:
            stub = health_pb2_grpc.HealthStub(self.channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        try:
            return self.thread.run(check())
        except TimeoutError:
            return False

    def stop(self) -> None:
        async def stop() -> None:
            self._watchdog.cancel()
            await self.publisher.__aexit__(None, None, None)
            await self.channel.close()
            self.blocking_channel.close()
            await self.daemon.stop()

        self.thread.run(stop(), timeout=60)
        self.thread.close()

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True) as db:
            return db.execute(sql, args).fetchall()


def hints(seeded: Seeded) -> Hints:
    """Valid values by field name, for structured requests."""
    agents = ("doctor", "chief", "physio")
    return {
        "session_id": st.sampled_from(SESSIONS),
        "system": st.just("clinic"),
        "sender": st.sampled_from(agents),
        "recipient": st.sampled_from(agents),
        "component": st.sampled_from(("exo", *agents)),
        "signal": st.sampled_from(("value", "temp")),
        "value": st.floats(-10, 10),
        "index": st.integers(0, 50),
        "content": st.text(max_size=80),
        "investigation_id": st.sampled_from(seeded.investigations),
        "region_ids": st.sampled_from(REGIONS),
        "note": st.text(max_size=40),
        "reason": st.text(max_size=40),
        "method": st.sampled_from(("", "poirot", "baseline")),
        "page_token": st.just(seeded.page_token),
        "page_size": st.integers(0, 100),
        "after_event_id": st.integers(0, seeded.last_event_id),
        "min_score": st.floats(0, 1),
    }


# ------------------------------------------------------------------ targets


@dataclass(frozen=True)
class Outcome:
    # A gRPC status name; MQTT: acked; the spec loader: loaded, refused or the exception's name.
    status: str
    seconds: float
    raw: bool = False
    crash: str = ""
    # The status's detail, quoted in findings.
    detail: str = ""


@dataclass
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    send: Callable[[Any], Coroutine[Any, Any, Outcome]]
    # (acknowledged items, of which the store lacks) once the inputs are done; None: no acks.
    settle: Callable[[], Awaitable[tuple[int, int]]] | None = None


def _failed(error: grpc.aio.AioRpcError, started: float, raw: bool) -> Outcome:
    detail = (error.details() or "")[:200]
    return Outcome(str(error.code().name), time.monotonic() - started, raw, detail=detail)


class Unary:
    """A unary RPC fed bytes; Trigger's and ConfirmOutcome's successes are remembered so the
    store can be checked for them at the end."""

    def __init__(self, harness: Harness, method: str) -> None:
        self._harness = harness
        self.method = method
        self._call = harness.channel.unary_unary(f"/poirot.v1.Investigations/{method}")
        self.acked: dict[str, tuple[str, ...]] = {}

    async def send(self, example: tuple[bool, bytes]) -> Outcome:
        raw, data = example
        started = time.monotonic()
        try:
            reply = await self._call(data, timeout=GIVE_UP_SECONDS)
        except grpc.aio.AioRpcError as error:
            return _failed(error, started, raw)
        seconds = time.monotonic() - started
        if self.method == "Trigger":
            self.acked[pb.Investigation.FromString(reply).investigation_id] = ()
        elif self.method == "ConfirmOutcome":
            request = pb.ConfirmOutcomeRequest.FromString(data)
            confirmed = pb.ConfirmOutcomeResponse.FromString(reply).confirmed
            self.acked[request.investigation_id] = tuple(confirmed.region_ids)
        return Outcome("OK", seconds, raw)

    async def settle(self) -> tuple[int, int]:
        """Every investigation a Trigger returned is stored; every confirmed investigation holds
        the last outcome a ConfirmOutcome acknowledged."""
        lost = 0
        for investigation_id, regions in self.acked.items():
            rows = self._harness.query(
                "SELECT json_extract(record, '$.confirmed.region_ids') FROM investigations"
                " WHERE investigation_id = ?",
                investigation_id,
            )
            if not rows or (regions and tuple(json.loads(rows[0][0] or "[]")) != regions):
                lost += 1
        return len(self.acked), lost


class Watch:
    """Watch is a server stream that may rightly stay open: a request that owes an answer (an
    investigation's events and end, an error, or the first of every investigation's stored
    events) must give one within the time; one that may wait for future events is only checked
    for an error at once."""

    _IDLE_CHECK_SECONDS = 0.02

    def __init__(self, harness: Harness) -> None:
        self._call = harness.channel.unary_stream("/poirot.v1.Investigations/Watch")
        self._last_event_id = harness.seeded.last_event_id

    def _owes_answer(self, data: bytes) -> bool:
        try:
            request = pb.WatchRequest.FromString(data)
        except Exception:  # undecodable: INVALID_ARGUMENT is owed
            return True
        if request.investigation_id or request.system not in ("", "clinic"):
            return True
        filtered = bool(request.component) or request.min_score > 0
        return not filtered and request.after_event_id < self._last_event_id

    async def send(self, example: tuple[bool, bytes]) -> Outcome:
        raw, data = example
        owed = self._owes_answer(data)
        call = self._call(data, timeout=GIVE_UP_SECONDS)
        started = time.monotonic()
        try:
            async with asyncio.timeout(None if owed else self._IDLE_CHECK_SECONDS):
                first = await call.read()
            status = "OK" if first is grpc.aio.EOF else "OK (events)"
        except grpc.aio.AioRpcError as error:
            return _failed(error, started, raw)
        except TimeoutError:
            status = "OK (waiting for events)"
        finally:
            call.cancel()
        return Outcome(status, time.monotonic() - started, raw)


class IngestStream:
    """Ingest.Stream fed bytes; the items each stream acknowledged are remembered and looked
    for in the store at the end.

    Streams go through grpc's blocking API, on a worker thread: its asyncio client reports
    `INTERNAL: Internal error from Core` instead of the server's status when a write fails
    because the server has just ended the call (grpc/grpc#36066), which a stream the daemon
    refuses early while large requests are still being written runs into."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness
        self._call = harness.blocking_channel.stream_stream("/poirot.v1.Ingest/Stream")
        self.sessions: set[str] = set()
        self.messages: set[tuple[str, int]] = set()
        # Messages the daemon numbers (assign_index): their index is not the request's.
        self.assigned: Counter[str] = Counter()
        self.samples: Counter[tuple[str, str, str]] = Counter()
        # Idempotency keys (producer, producer_seq) of the items acknowledged so far: a later
        # item with one of them is a copy the store drops, not an item to find.
        self.keys: set[tuple[str, int]] = set()

    async def send(self, example: tuple[bool, list[bytes]]) -> Outcome:
        raw, requests = example
        return await asyncio.to_thread(self._send, raw, requests)

    def _send(self, raw: bool, requests: list[bytes]) -> Outcome:
        started = time.monotonic()
        acked = 0
        outcome = None
        try:
            for ack in self._call(iter(requests), timeout=GIVE_UP_SECONDS):
                acked = max(acked, pb.IngestAck.FromString(ack).durable_seq)
        except grpc.RpcError as error:
            detail = (error.details() or "")[:200]
            status = str(error.code().name)
            outcome = Outcome(status, time.monotonic() - started, raw, detail=detail)
        self._remember(requests, acked)
        return outcome or Outcome("OK", time.monotonic() - started, raw)

    def _remember(self, requests: list[bytes], acked: int) -> None:
        """The items up to the acknowledged seq: the stream takes items in order while seqs
        increase and ends at the first it refuses, so those are the ones it committed."""
        last = 0
        for data in requests:
            try:
                request = pb.IngestRequest.FromString(data)
            except Exception:  # the server stopped reading here too
                return
            items: list[Any] = list(request.items) or [request]
            for offset, item in enumerate(items):
                seq = request.seq + offset
                if seq <= last or seq > acked:
                    return
                last = seq
                if item.producer_seq and request.producer:
                    key = (request.producer, item.producer_seq)
                    if key in self.keys:
                        continue
                    self.keys.add(key)
                self._remember_item(item)

    def _remember_item(self, item: pb.IngestItem | pb.IngestRequest) -> None:
        kind = item.WhichOneof("item")
        if kind == "session_start":
            self.sessions.add(item.session_start.session_id)
        elif kind == "agent_message" and item.agent_message.assign_index:
            self.assigned[item.agent_message.session_id] += 1
        elif kind == "agent_message":
            self.messages.add((item.agent_message.session_id, item.agent_message.index))
        elif kind == "telemetry":
            t = item.telemetry
            self.samples[(t.session_id, t.component, t.signal)] += 1
        elif kind == "session_end":
            self.sessions.add(item.session_end.session_id)

    async def settle(self) -> tuple[int, int]:
        query = self._harness.query
        sessions = {row[0] for row in query("SELECT session_id FROM sessions")}
        messages = set(query("SELECT session_id, idx FROM agent_messages"))
        stored = Counter(
            {
                (s, c, n): count
                for s, c, n, count in query(
                    "SELECT session_id, component, signal, count(*) FROM telemetry_samples"
                    " GROUP BY session_id, component, signal"
                )
            }
        )
        lost = len(self.sessions - sessions) + len(self.messages - messages)
        lost += sum(max(0, n - stored[key]) for key, n in self.samples.items())
        # A daemon-numbered message is found by count: the daemon hands each a fresh index (past
        # every index admitted before it), so its session holds at least that many messages. A
        # later explicit index equal to an assigned one is, by the wire's rule that (session,
        # index) is unique, a resend of the assigned message, not a second message.
        per_session = Counter(session for session, _ in messages)
        lost += sum(max(0, n - per_session[s]) for s, n in self.assigned.items())
        acked = len(self.sessions) + len(self.messages) + sum(self.samples.values())
        acked += sum(self.assigned.values())
        return acked, lost


class MqttInput:
    """Publishes each message at QoS 1 and waits for the daemon's input to acknowledge it
    (its PUBACK goes out once the readings are committed or the message is dead-lettered).
    Canaries, valid readings with a known value, go between the inputs; at the end every one
    of them, and every reading the input counted as committed, must be in the store."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness
        self.published = 0
        self.canaries = 0

    async def _publish(self, topic: str, payload: bytes) -> float:
        """Seconds until the input acknowledged the message; GIVE_UP_SECONDS if it did not."""
        started = time.monotonic()
        await self._harness.publisher.publish(topic, payload)
        self.published += 1
        try:
            async with asyncio.timeout(GIVE_UP_SECONDS / 3):
                while self._harness.counter("messages_acked") < self.published:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
        except TimeoutError:
            # Counted slow; the next message waits for its own ack, not this one's too.
            self.published = int(self._harness.counter("messages_acked"))
            return GIVE_UP_SECONDS
        # A publish the publisher repeated (no PUBACK in time) is acked twice.
        self.published = max(self.published, int(self._harness.counter("messages_acked")))
        return time.monotonic() - started

    async def send(self, example: tuple[str, bytes]) -> Outcome:
        if self.published % CANARY_EVERY == 0:
            self.canaries += 1
            stamp = datetime.now(UTC).timestamp()
            canary = json.dumps({"ts": stamp, "value": self.canaries}).encode()
            await self._publish("fz/canary", canary)
        topic, payload = example
        seconds = await self._publish(topic, payload)
        return Outcome("acked", seconds)

    async def settle(self) -> tuple[int, int]:
        query = self._harness.query
        canaries = {
            int(value)
            for (value,) in query(
                "SELECT value FROM telemetry_samples WHERE session_id = ? AND signal = 'canary'",
                MQTT_SESSION,
            )
        }
        (stored,) = query(
            "SELECT count(*) FROM telemetry_samples WHERE session_id = ?", MQTT_SESSION
        )[0]
        committed = int(self._harness.counter("samples_committed"))
        lost = len(set(range(1, self.canaries + 1)) - canaries) + max(0, committed - stored)
        return committed, lost


async def load_spec(text: str) -> Outcome:
    """The loader the daemon starts with, on the daemon's loop thread like every target."""
    started = time.monotonic()
    try:
        load_spec_text(text, checks=[mqtt_input_spec])
        status, crash = "loaded", ""
    except SpecError:
        status, crash = "refused (SpecError)", ""
    except Exception as exc:
        status, crash = type(exc).__name__, f"{type(exc).__name__}: {str(exc)[:200]}"
    return Outcome(status, time.monotonic() - started, crash=crash)


def targets(harness: Harness) -> list[Target]:
    now = datetime.now(UTC)
    valid = hints(harness.seeded)
    ingest = IngestStream(harness)
    found = [Target("Ingest.Stream", ingest_stream(valid, now), ingest.send, ingest.settle)]
    service = pb.DESCRIPTOR.services_by_name["Investigations"]
    for method in service.methods:
        strategy = request_bytes(method.input_type, valid, now)
        name = f"Investigations.{method.name}"
        if method.server_streaming:
            found.append(Target(name, strategy, Watch(harness).send))
            continue
        unary = Unary(harness, method.name)
        settle = unary.settle if method.name in ("Trigger", "ConfirmOutcome") else None
        found.append(Target(name, strategy, unary.send, settle))
    mqtt = MqttInput(harness)
    components = [*harness.spec.agent_ids, "exo"]
    found.append(Target("MQTT input", mqtt_messages(now, components), mqtt.send, mqtt.settle))
    found.append(Target("spec loader", spec_texts(fuzz_spec(1883)), load_spec))
    return found


# ------------------------------------------------------------------ tallies


@dataclass
class Tally:
    target: str
    inputs: int = 0
    raw: int = 0
    crashes: int = 0
    unknown: int = 0
    internal: int = 0
    slow: int = 0
    acked: int | None = None
    lost: int = 0
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    # After glibc returned the free heap it kept (malloc_trim): what is still in use.
    rss_trimmed_mib: float = 0.0
    seconds: float = 0.0
    slowest: float = 0.0
    longest_collection: float = 0.0
    longest_loop_stall: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome, faults: list[str], example: Any) -> None:
        self.inputs += 1
        self.raw += outcome.raw
        self.statuses[outcome.status] = self.statuses.get(outcome.status, 0) + 1
        self.slowest = max(self.slowest, outcome.seconds)
        problems = [f"crash: {f}" for f in faults]
        if outcome.crash:
            problems.append(f"crash: {outcome.crash}")
        self.crashes += len(problems)
        if outcome.status in ("UNKNOWN", "INTERNAL"):
            problems.append(f"{outcome.status} ({outcome.detail})")
            self.unknown += outcome.status == "UNKNOWN"
            self.internal += outcome.status == "INTERNAL"
        if outcome.seconds > SLOW_SECONDS:
            self.slow += 1
            problems.append(f"{outcome.seconds:.1f} s ({outcome.status})")
        for problem in problems:
            self.note(f"{problem} for {_shown(example)}")

    def note(self, finding: str) -> None:
        kind = finding.split(" ", 1)[0]
        if sum(f.split(" ", 1)[0] == kind for f in self.findings) < FINDINGS_KEPT:
            self.findings.append(finding)


def _shown(example: Any) -> str:
    text = repr(example)
    return text if len(text) <= 160 else f"{text[:160]}... ({len(text)} characters)"


class CollectorPauses:
    """The cyclic garbage collector's pauses (they stop the daemon's loop and the fuzzer
    alike): the longest since the last `take`."""

    def __init__(self) -> None:
        self._started = 0.0
        self.longest = 0.0
        gc.callbacks.append(self._on_collect)

    def _on_collect(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.monotonic()
        else:
            self.longest = max(self.longest, time.monotonic() - self._started)

    def take(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest


PAUSES = CollectorPauses()


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def trimmed_rss_mib() -> float:
    """RSS once glibc has handed back the free memory its arenas keep (large requests leave
    megabytes of it on every thread that parsed one)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def drive(strategy: st.SearchStrategy[Any], n: int, seed: int, each: Callable[[Any], None]) -> None:
    """Hypothesis generates `n` inputs (generation only: nothing to shrink, nothing saved) and
    hands each to `each`, which never raises."""

    @hypothesis_seed(seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(strategy)
    def run(example: Any) -> None:
        each(example)

    run()


def fuzz(harness: Harness, target: Target, n: int, seed: int) -> Tally:
    tally = Tally(target.name)
    gc.collect()
    tally.rss_before_mib = rss_mib()
    restarts = harness.counter("input_restarts")
    started = time.monotonic()
    PAUSES.take()
    harness.stalls()

    def each(example: Any) -> None:
        try:
            outcome = harness.thread.run(target.send(example))
        except TimeoutError:
            outcome = Outcome("no answer", GIVE_UP_SECONDS)
        tally.add(outcome, harness.faults(), example)

    for round_seed in range(seed, seed + 50):  # hypothesis may stop short of n on small spaces
        if tally.inputs >= n:
            break
        drive(target.strategy, n - tally.inputs, round_seed, each)
    if target.settle is not None:
        tally.acked, tally.lost = harness.thread.run(_settled(harness, target.settle))
    tally.seconds = time.monotonic() - started
    tally.longest_collection = PAUSES.take()
    tally.longest_loop_stall = harness.stalls()
    if (more := int(harness.counter("input_restarts") - restarts)) > 0:
        tally.crashes += more
        tally.note(f"crash: the MQTT input failed and restarted {more} times")
    if not harness.alive():
        tally.crashes += 1
        tally.note("crash: the daemon no longer answers its health check")
    gc.collect()
    tally.rss_after_mib = rss_mib()
    tally.rss_trimmed_mib = trimmed_rss_mib()
    return tally


async def _settled(harness: Harness, settle: Callable[[], Awaitable[tuple[int, int]]]) -> Any:
    """Lets investigations the inputs opened finish writing, then checks the store."""
    await asyncio.sleep(0.5)
    return await settle()


# ------------------------------------------------------------------ report


@dataclass(frozen=True)
class Run:
    """One run of the bench as its section states it: its size, seed and length, and the sizes
    of the two modes."""

    inputs: int  # per target
    seed: int
    seconds: float
    full_inputs: int = FULL_INPUTS
    quick_inputs: int = QUICK_INPUTS
    canary_every: int = CANARY_EVERY


# ------------------------------------------------------------------ main


def run(n: int, seed: int, only: list[str]) -> list[Tally]:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40),  # errors only
        logger_factory=structlog.PrintLoggerFactory(),
    )
    with ExitStack() as stack:
        shm = Path("/dev/shm")
        folder = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="fuzz-", dir=shm if shm.is_dir() else None)
            )
        )
        harness = Harness(folder, stack.enter_context(mosquitto()))
        harness.start()
        # As `poirotd run` sets the collector once started (bench.ingest does the same).
        tune_for_daemon()
        stack.callback(harness.stop)
        tallies = []
        for target in targets(harness):
            if only and target.name not in only:
                continue
            tally = fuzz(harness, target, n, seed)
            print(table([tally]).splitlines()[-1], flush=True)
            print(findings([tally]), flush=True)
            tallies.append(tally)
        return tallies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_INPUTS} inputs per target")
    parser.add_argument("--inputs", type=int, help="inputs per target (overrides the mode)")
    parser.add_argument("--seed", type=int, default=20, help="hypothesis seed (20: the issue)")
    parser.add_argument("--target", action="append", default=[], help="only this target")
    parser.add_argument("--json", type=Path, help="also write the tallies here")
    args = parser.parse_args(argv)
    n = args.inputs or (QUICK_INPUTS if args.quick else FULL_INPUTS)
    started = time.monotonic()
    tallies = run(n, args.seed, args.target)
    seconds = time.monotonic() - started
    print(table(tallies), statuses(tallies), findings(tallies), sep="\n\n")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(t) for t in tallies], indent=1))
    if not args.quick and args.inputs is None and not args.target:
        report.write_section(SECTION, section(tallies, Run(n, args.seed, seconds)))
        print(f"\nwrote the {SECTION} section of {report.REPORT}")


if __name__ == "__main__":
    main()
