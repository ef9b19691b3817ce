"""The standalone bridge as a process (`python -m hwbridge`), its config, and what it stored."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from hwbridge.config import BackoffConfig, DeadLetterConfig, PoirotdConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import Forwarder
from poirotd.model import TelemetryBatch
from tests.support.gait import EXAMPLE
from tests.support.mosquitto import Mosquitto


def bridge_config(folder: Path, mosquitto: Mosquitto, poirotd_port: int) -> Path:
    """The example config, pointed at the test's broker and poirotd."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["session_id"] = "e2e"
    config["poirotd"] = {
        "target": f"127.0.0.1:{poirotd_port}",
        "system": "clinic",
        "backoff": {"initial_s": 0.05, "max_s": 0.3},
    }
    config["mqtt"]["broker"].update(port=mosquitto.port, timeout_s=1.0)
    config["dead_letter"] = {"path": str(folder / "dead.jsonl")}
    path = folder / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def hwbridge(*args: str, log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hwbridge", *args, stdout=out, stderr=out
        )


async def stop(process: asyncio.subprocess.Process) -> int:
    """SIGTERM (the bridge logs its final counters), then SIGKILL if it does not exit."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(15):
            return await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


START = datetime(2026, 1, 1, tzinfo=UTC)


def samples(n: int, offset: int = 0, component: str = "d2w_exoskeleton") -> TelemetryBatch:
    """Session e2e's knee angle, valued offset, offset + 1, ... one millisecond apart."""
    return TelemetryBatch(
        "e2e",
        [
            (
                component,
                "knee_left_deg",
                float(offset + i),
                START + timedelta(milliseconds=offset + i),
            )
            for i in range(n)
        ],
    )


def stored_values(db: Path) -> list[float]:
    """Every stored sample's value, in storage order."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT value FROM telemetry_samples ORDER BY block_id, position"
        ).fetchall()
    return [value for (value,) in rows]


def stored(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM telemetry_samples").fetchone()
    return int(count)


def forwarder(
    port: int,
    system: str = "clinic",
    *,
    max_pending: int = 20_000,
    dead_letters: DeadLetterStore | None = None,
) -> Forwarder:
    config = PoirotdConfig(
        target=f"127.0.0.1:{port}",
        system=system,
        max_pending=max_pending,
        backoff=BackoffConfig(initial_s=0.05, max_s=0.3),
    )
    store = dead_letters or DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    return Forwarder(config, "e2e", store)
