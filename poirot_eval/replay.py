"""Replays a benchmark case into a running daemon over gRPC, paced like the original session.

The daemon serves one system spec, so a replay fits only a daemon started with the case's spec
(`poirotd eval spec CASE -o spec.yaml`, then `poirotd run --config spec.yaml`). Items are sent one
by one as their time comes, each stamped with the time it is sent: the daemon sees a live session.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

from rich.console import Console

from poirot_eval.cases import EvalCase
from poirot_eval.session import session_items
from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import DaemonTls, PoirotClient
from poirotd.demo.main import attribution_table, describe_event
from poirotd.model import AgentMessage, IngestItem, Session, SessionEnd


def pauses(case: EvalCase, *, speed: float, interval: float | None) -> list[float]:
    """Seconds to wait before each message: `interval` when given, else the original gaps
    divided by `speed`. The benchmarks carry no send times and their loaders space messages one
    second apart, so for them `speed` is simply messages per second."""
    if interval is not None:
        return [0.0] + [interval] * (len(case.messages) - 1)
    times = [m.sent_at for m in case.messages]
    return [0.0, *(max(0.0, (b - a).total_seconds()) / speed for a, b in itertools.pairwise(times))]


async def replay(
    case: EvalCase,
    target: str,
    *,
    session_id: str,
    speed: float,
    interval: float | None,
    trigger: bool,
    watch: bool,
    method: str,
    console: Console,
    tls: DaemonTls | None = None,
    token: str | None = None,
) -> pb.Investigation | None:
    """Streams the session; with `trigger`, opens an investigation at its end, and with `watch`
    follows it to the end. Returns the investigation (as last read) when one was opened."""
    items = session_items(case, session_id)
    waits = pauses(case, speed=speed, interval=interval)
    async with PoirotClient(target, tls=tls, token=token) as client:
        durable = await client.stream(_paced(items, waits, console))
        console.print(f"session {session_id}: {len(items)} items sent, durable up to {durable}")
        if not trigger:
            return None
        investigation = await client.trigger(
            session_id, f"replay of {case.dataset} case {case.case_id}", method=method
        )
        console.print(f"triggered investigation {investigation.investigation_id} ({method})")
        if not watch:
            return investigation
        async for event in client.watch(investigation.investigation_id):
            console.print("  " + describe_event(event))
        investigation = await client.get(investigation.investigation_id)
        if investigation.state == pb.INVESTIGATION_STATE_SUCCEEDED:
            console.print(attribution_table(investigation))
        else:
            state = pb.InvestigationState.Name(investigation.state)
            console.print(f"[red]investigation ended {state}:[/] {investigation.error}")
        return investigation


async def _paced(
    items: Sequence[IngestItem], waits: Sequence[float], console: Console
) -> AsyncIterator[pb.IngestRequest]:
    """The session's requests, each message after its pause, each item stamped as it leaves."""
    messages = len(items) - 2
    waits_by_item = [0.0, *waits, 0.0]
    for item, wait in zip(items, waits_by_item, strict=True):
        await asyncio.sleep(wait)
        yield convert.ingest_request(_stamped(item, datetime.now(UTC)))
        if isinstance(item, AgentMessage):
            to = f" -> {item.recipient}" if item.recipient else ""
            console.print(
                f"[dim][{item.index + 1}/{messages}][/] {item.kind} {item.sender}{to} "
                f"({len(item.content)} chars)",
                highlight=False,
            )


def _stamped(item: IngestItem, now: datetime) -> IngestItem:
    if isinstance(item, Session):
        return item.model_copy(update={"started_at": now})
    if isinstance(item, SessionEnd):
        return item.model_copy(update={"ended_at": now})
    if isinstance(item, AgentMessage):
        return item.model_copy(update={"sent_at": now})
    return item
