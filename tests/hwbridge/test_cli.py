"""`python -m hwbridge`: refusals are clear, and the whole path works on real parts."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hwbridge.__main__ import app
from poirotd.devtools.clinic import BRIDGE_CLINIC
from poirotd.devtools.process import free_port
from tests.support.bridge import bridge_config, hwbridge, stop, stored
from tests.support.daemon import in_process_daemon
from tests.support.mosquitto import Mosquitto
from tests.support.waiting import eventually

EXAMPLE = Path(__file__).parents[2] / "hwbridge" / "bridge.example.yaml"


def test_run_refuses_a_bad_config_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("session_id: s\npoirotd: {system: clinic}\nmqtt:\n  mappings:\n")
    result = CliRunner().invoke(app, ["run", "--config", str(config)])
    assert result.exit_code == 2
    assert "bridge.yaml: mqtt.mappings:" in result.output


@pytest.mark.parametrize(
    "args, problem",
    [
        (["simulate", "exo", "--fault", "elbow_deg:stuck"], "unknown signal"),
        (["simulate", "exo", "--fault", "knee_left_deg:offset:magnitude"], "expected key=value"),
        (["simulate", "exo", "--rate", "20000"], "less than or equal to 10000"),
        (["simulate", "market", "--shock", "stale:start_s=1"], "needs duration_s"),
    ],
)
def test_simulator_options_are_validated(args: list[str], problem: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and problem in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)  # 2.5 s on a quiet 2-core box; its own waits add up to 85 s
async def test_simulated_gait_reaches_poirotd_even_when_it_was_down(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """While poirotd is down the bridge acks nothing, so stopping it loses nothing: the broker
    hands the whole backlog to the restarted bridge once poirotd is back."""
    port, log, db = free_port(), tmp_path / "hwbridge.log", tmp_path / "poirotd.db"
    config = bridge_config(tmp_path, mosquitto, port)
    bridge = await hwbridge("run", "--config", str(config), log=log)
    # The broker queues for a session only once it has subscribed; publish after that.
    async with asyncio.timeout(20):
        await eventually(lambda: log.exists() and "mqtt subscribed" in log.read_text())
    simulator = await hwbridge(
        *("simulate", "exo", "--broker", f"127.0.0.1:{mosquitto.port}", "--patient", "p7"),
        *("--rate", "1500", "--duration", "1", "--seed", "4"),
        *("--fault", "proprioception_score:offset:magnitude=-4"),
        log=log,
    )
    async with asyncio.timeout(20):
        assert await simulator.wait() == 0, log.read_text()
    assert await stop(bridge) == 0, log.read_text()  # poirotd never answered

    async with in_process_daemon(tmp_path, BRIDGE_CLINIC, grpc_port=port, drain_seconds=0):
        bridge = await hwbridge("run", "--config", str(config), log=log)
        try:
            # 1 s at 1500 samples/s over the frame channels + 1 heart rate + 2 clinical scores.
            async with asyncio.timeout(30):
                await eventually(lambda: stored(db) >= 1503)
        finally:
            exit_code = await stop(bridge)
    assert exit_code == 0, log.read_text()
    with sqlite3.connect(db) as conn:
        score = conn.execute(
            "SELECT value FROM telemetry_samples WHERE signal = 'proprioception_score'"
        ).fetchall()
    assert stored(db) == 1503 and score == [(2.0,)]  # Sensor-X: 6/8 reported as 2/8
    assert "bridge stopped" in log.read_text()
