"""An in-process daemon on OS-chosen loopback ports, and a client for it: what most API tests run
against (the `daemon` and `client` fixtures are built on these)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import yaml

from poirotd.client.wire import PoirotClient
from poirotd.config.settings import Settings
from poirotd.config.spec import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.process import DaemonProcess, free_port
from poirotd.llm.base import LLMBackend
from poirotd.model import Investigation
from poirotd.store import Store


@asynccontextmanager
async def in_process_daemon(
    tmp_path: Path, spec: SystemSpec, backend: LLMBackend | None = None, **settings: Any
) -> AsyncIterator[Daemon]:
    """A started daemon with its store in `tmp_path`; without `backend` it builds the spec's."""
    defaults: dict[str, Any] = {"grpc_port": 0, "metrics_port": 0, "drain_seconds": 5}
    daemon = Daemon(
        Settings(db_path=tmp_path / "poirotd.db", **(defaults | settings)), spec, backend=backend
    )
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


@asynccontextmanager
async def client_of(daemon: Daemon) -> AsyncIterator[PoirotClient]:
    async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        yield client


async def finished_investigation(
    store: Store, session_id: str, seconds: float = 60
) -> Investigation:
    """The session's latest investigation, once it finished (fails after `seconds`)."""
    for _ in range(int(seconds * 20)):
        found, _ = await store.list_investigations(session_id=session_id)
        if found and found[0].state.finished:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no investigation of {session_id} finished in {seconds} s")


def stored_messages(daemon: Daemon) -> int:
    """Agent messages in the daemon's store."""
    with sqlite3.connect(daemon.settings.db_path) as db:
        (count,) = db.execute("SELECT count(*) FROM agent_messages").fetchone()
    return int(count)


def rejected(daemon: Daemon, rpc: str, reason: str) -> float:
    """How many requests to `rpc` the daemon refused for `reason` (its counter's sample)."""
    value = daemon.metrics.registry.get_sample_value(
        "poirot_requests_rejected_total", {"rpc": rpc, "reason": reason}
    )
    return value or 0.0


def limit_rejections(daemon: Daemon, limit: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_limit_rejections_total", {"limit": limit}
    )
    return value or 0.0


@contextmanager
def two_replicas(
    spec_of: Callable[[str], SystemSpec], folder: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """`poirotd run` as replicas a and b (spec `spec_of(name)`, in folder/a and folder/b, each its
    own store unless `env` names a shared one), started in turn and killed at the end."""
    replicas: list[DaemonProcess] = []
    for name in ("a", "b"):
        (folder / name).mkdir()
        config = folder / name / "spec.yaml"
        config.write_text(yaml.safe_dump(spec_of(name).model_dump(mode="json")))
        replicas.append(DaemonProcess(config, folder / name, env=env, grpc_port=free_port()))
    try:
        for replica in replicas:
            replica.start()
        yield replicas[0], replicas[1]
    finally:
        for replica in replicas:
            replica.kill()
