"""The standalone bridge as a process (`python -m hwbridge`), its config, and what it stored."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from pathlib import Path

import yaml

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


def stored(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM telemetry_samples").fetchone()
    return int(count)
