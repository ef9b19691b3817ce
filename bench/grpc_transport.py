"""What refused gRPC requests and silent Ingest streams cost the daemon (issue 28, items 3, 4).

    .venv/bin/python -m bench.grpc_transport          # about 2 minutes (the default idle deadline)
    .venv/bin/python -m bench.grpc_transport --quick  # about 40 s: 100 requests each, 5 s deadline

The daemon runs as a process of its own (`bench.daemon_child`: the tests' clinic with a pinned
hazard space, a scripted LLM, `poirotd run`'s collector settings), so that the resident memory
read from /proc (VmRSS) is the daemon's alone. Over loopback gRPC, one call at a time:

1. refused: `requests` calls of each of Get, Trigger, List and ConfirmOutcome carrying about
   3 MB (an investigation id, a session id, a page token that large);
2. answered: `requests` calls of each that the daemon answers: Get and ConfirmOutcome (a
   4,000-character note) of a finished investigation, List of a session, Trigger of a known
   session (a 4,000-character reason; each queues an investigation, which runs and is stored:
   that memory is the investigations', not the requests');
3. silent streams: as many Ingest streams as one client may hold
   (POIROTD_MAX_INGEST_STREAMS_PER_CLIENT), each sending a session start and then nothing, and a
   producer of the same host that tries every quarter second until it is let in; then a stream
   that sends nothing at all.

The results replace this bench's section of BENCHMARKS.md (`--no-write`: print only).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.message import Message

from bench import daemon_process, report
from bench.daemon_process import Child
from bench.sections.grpc_transport import NAME, section
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import Settings
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.held_stream import HeldStream
from poirotd.devtools.ingest_requests import session
from poirotd.investigations.service import MAX_TEXT_CHARS

METHODS = ("Get", "Trigger", "List", "ConfirmOutcome")
REFUSED_BYTES = 3 << 20
SESSION = "transport-1"
CONFIRMED = ["exo"]

Call = Callable[[PoirotClient], Awaitable[object]]


@dataclass(frozen=True)
class Plan:
    mode: str
    requests: int  # per method, refused and answered alike
    idle_seconds: float  # the daemon's POIROTD_INGEST_IDLE_SECONDS
    refused_bytes: int = REFUSED_BYTES  # what each refused call carries


def plan(mode: str) -> Plan:
    if mode == "smoke":
        return Plan("smoke", 5, 1.0)
    if mode == "quick":
        return Plan("quick", 100, 5.0)
    return Plan("full", 300, Settings().ingest_idle_seconds)


# ------------------------------------------------------------------ the daemon


@contextlib.asynccontextmanager
async def child_daemon(folder: Path, p: Plan) -> AsyncIterator[Child]:
    """The clinic with a pinned hazard space, its Trigger rate unbounded and its queue long
    enough for the answered Triggers."""
    spec = clinic(hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]})
    env = {
        "POIROTD_INGEST_IDLE_SECONDS": str(p.idle_seconds),
        "POIROTD_TRIGGER_RATE_PER_CLIENT": "0",
        "POIROTD_QUEUE_CAPACITY": str(p.requests + 16),
    }
    async with daemon_process.child_daemon(folder, spec, env) as child:
        yield child


# ------------------------------------------------------------------ requests


def refused_call(method: str, size: int = REFUSED_BYTES) -> Call:
    """A call of `method` carrying a string of `size` characters where an id or token goes."""
    big = "x" * size
    requests: dict[str, Message] = {
        "Get": pb.GetInvestigationRequest(investigation_id=big),
        "Trigger": pb.TriggerRequest(session_id=big, reason="bench"),
        "List": pb.ListInvestigationsRequest(page_token=big),
        "ConfirmOutcome": pb.ConfirmOutcomeRequest(investigation_id=big, region_ids=CONFIRMED),
    }
    return _call(method, requests[method])


def answered_call(method: str, investigation_id: str) -> Call:
    """A call of `method` that the seeded daemon answers, as large as the method takes."""
    text = "n" * MAX_TEXT_CHARS
    requests: dict[str, Message] = {
        "Get": pb.GetInvestigationRequest(investigation_id=investigation_id),
        "Trigger": pb.TriggerRequest(session_id=SESSION, reason=text),
        "List": pb.ListInvestigationsRequest(session_id=SESSION, page_size=50),
        "ConfirmOutcome": pb.ConfirmOutcomeRequest(
            investigation_id=investigation_id, region_ids=CONFIRMED, note=text
        ),
    }
    return _call(method, requests[method])


def _call(method: str, request: Message) -> Call:
    """`request` sent to the Investigations method of that name."""

    async def call(client: PoirotClient) -> object:
        rpc: Callable[[Message], Awaitable[object]] = getattr(client.investigations, method)
        return await rpc(request)

    return call


@dataclass
class Flood:
    """`requests` calls of one method, one at a time: their statuses and the daemon's VmRSS
    before, at its highest after any call, and after."""

    before_mib: float
    peak_mib: float = 0.0
    after_mib: float = 0.0
    codes: Counter[str] = field(default_factory=Counter)

    @property
    def grown_mib(self) -> float:
        return self.after_mib - self.before_mib


async def flood(
    child: Child, call: Call, requests: int, *, give_up_above_mib: float | None = None
) -> Flood:
    """The calls, one after the other; stops early once the daemon's VmRSS has grown by more than
    `give_up_above_mib` over `before_mib` (a test's bound: a leaking daemon need not be pushed
    to gigabytes)."""
    result = Flood(child.rss_mib())
    result.peak_mib = result.before_mib
    async with PoirotClient(child.target) as client:
        for _ in range(requests):
            try:
                await call(client)
                result.codes["OK"] += 1
            except grpc.aio.AioRpcError as error:
                result.codes[error.code().name] += 1
            result.peak_mib = max(result.peak_mib, child.rss_mib())
            grown = result.peak_mib - result.before_mib
            if give_up_above_mib is not None and grown > give_up_above_mib:
                break
    result.after_mib = child.rss_mib()
    return result


async def seed(child: Child) -> str:
    """A session and one investigation of it, run to the end and its outcome confirmed."""
    async with PoirotClient(child.target) as client:
        await client.send(session(8, SESSION))
        queued = await client.trigger(SESSION, f"seeded by {NAME}")
        async for _ in client.watch(queued.investigation_id):
            pass
        await client.confirm(queued.investigation_id, CONFIRMED, note="seeded")
        return queued.investigation_id


# ------------------------------------------------------------------ silent streams


@dataclass
class Streams:
    held: int = 0  # silent streams the daemon held
    first_try: str = ""  # the late producer's first status
    admitted_s: float = 0.0  # when it was let in, after the last silent stream's ack
    tries: int = 0
    endings: Counter[str] = field(default_factory=Counter)  # the silent streams' statuses
    detail: str = ""  # one of those statuses' details
    never_sent_s: float = 0.0  # how long a stream that sent nothing at all was held
    never_sent: str = ""
    counted_idle: float = 0.0  # poirot_requests_rejected_total{Ingest.Stream, idle}


async def silent_streams(child: Child, bound: int) -> Streams:
    """`bound` silent streams of this host, and a late producer of the same host."""
    figures = Streams()
    async with PoirotClient(child.target) as quiet, PoirotClient(child.target) as late:
        silent = [HeldStream(quiet, f"quiet-{i}") for i in range(bound)]
        for stream in silent:
            await stream.opened()
        figures.held = len(silent)
        silenced = time.monotonic()
        while True:
            figures.tries += 1
            try:
                await late.send(session(2, "late"))
                break
            except grpc.aio.AioRpcError as refused:
                figures.first_try = figures.first_try or refused.code().name
                await asyncio.sleep(0.25)
        figures.admitted_s = time.monotonic() - silenced
        figures.first_try = figures.first_try or "OK"
        for code, details in await asyncio.gather(*(s.ended() for s in silent)):
            figures.endings[code.name] += 1
            figures.detail = details
        opened = time.monotonic()
        code, _ = await HeldStream(quiet, None).ended()
        figures.never_sent_s, figures.never_sent = time.monotonic() - opened, code.name
    figures.counted_idle = child.rejected("Ingest.Stream", "idle")
    return figures


# ------------------------------------------------------------------ run and report


@dataclass
class Results:
    start_mib: float
    refused: dict[str, Flood]
    answered: dict[str, Flood]
    streams: Streams


async def run(p: Plan, folder: Path) -> Results:
    async with child_daemon(folder, p) as child:
        start_mib = child.rss_mib()
        refused = {}
        for method in METHODS:
            print(f"[bench] refused {method}", flush=True)
            refused[method] = await flood(child, refused_call(method, p.refused_bytes), p.requests)
        investigation_id = await seed(child)
        answered = {}
        for method in METHODS:
            print(f"[bench] answered {method}", flush=True)
            answered[method] = await flood(
                child, answered_call(method, investigation_id), p.requests
            )
        print("[bench] silent streams", flush=True)
        bound = Settings().max_ingest_streams_per_client
        streams = await silent_streams(child, bound)
    return Results(start_mib, refused, answered, streams)


def main() -> None:
    report.main(NAME, __doc__, "100 calls each, a 5 s deadline", plan, run, section)


if __name__ == "__main__":
    main()
