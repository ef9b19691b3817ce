"""A start that fails part-way leaves nothing behind: when a transport cannot bind (its port
taken), what had started (the store, the model, the investigation workers, the background tasks,
the transports before it) is stopped in reverse order, and the StartupError says which transport
and port.
`poirotd run` then exits 2 with that one line, no traceback."""

from __future__ import annotations

import asyncio
import gc
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from poirotd.config import Settings
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.process import free_port
from poirotd.errors import StartupError, TransportBindError
from poirotd.llm.scripted import ScriptedBackend
from tests.support.cli import poirotd

# Each transport, in the order the daemon starts them, with the setting of its port.
TRANSPORTS = {"grpc": "grpc_port", "metrics": "metrics_port", "otlp_http": "otlp_http_port"}
MESSAGES = {
    "grpc": "cannot listen for gRPC on 127.0.0.1:{port} (POIROTD_GRPC_HOST, POIROTD_GRPC_PORT): "
    "the port is taken, or the host is not an address of this machine",
    "metrics": "cannot listen for metrics on 127.0.0.1:{port} (POIROTD_METRICS_HOST, "
    "POIROTD_METRICS_PORT): Address already in use",
    "otlp_http": "cannot listen for otlp_http on 127.0.0.1:{port} (POIROTD_OTLP_HTTP_HOST, "
    "POIROTD_OTLP_HTTP_PORT): Address already in use",
}


@contextmanager
def listening() -> Iterator[int]:
    """A loopback port this test holds (listening, as another program would)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        probe.listen()
        return True


@pytest.mark.parametrize("taken", list(TRANSPORTS))
def test_a_transport_that_cannot_bind_stops_everything_that_had_started(
    tmp_path: Path, taken: str
) -> None:
    """Run in its own event loop (asyncio.run) so that the loop's tasks, and every thread
    started meanwhile, can be counted once it is gone. gRPC's poller thread is the library's
    and lives while any gRPC object does: the refusal is kept as text, so that nothing keeps
    the daemon's objects alive once it has returned."""
    db = tmp_path / "poirotd.db"
    threads = set(threading.enumerate())
    with listening() as held:
        ports = {name: held if name == taken else free_port() for name in TRANSPORTS}

        async def fail_to_start() -> str:
            listen: dict[str, Any] = {TRANSPORTS[name]: port for name, port in ports.items()}
            settings = Settings(db_path=db, drain_seconds=5, **listen)
            daemon = Daemon(settings, CLINIC, backend=ScriptedBackend(schema_answer))
            try:
                await daemon.start()
            except StartupError as exc:
                assert isinstance(exc, TransportBindError)
                refusal = str(exc)
            else:
                raise AssertionError("the daemon started on a taken port")
            assert asyncio.all_tasks() == {asyncio.current_task()}
            await daemon.stop()  # a no-op: nothing is running
            return refusal

        refusal = asyncio.run(fail_to_start())
    assert refusal == MESSAGES[taken].format(port=held)
    # Every SQLite connection is closed: the last one to close removes the WAL.
    assert db.exists() and not db.with_name(db.name + "-wal").exists()
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for transport, port in ports.items():
        if transport != taken:
            assert bindable(port), f"the {transport} transport still listens on {port}"
    gc.collect()
    deadline = time.monotonic() + 5  # a closed store's worker threads end on their own
    while set(threading.enumerate()) != threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) == threads


def test_run_exits_2_with_one_line_naming_the_taken_port(tmp_path: Path) -> None:
    spec = tmp_path / "clinic.yaml"
    data = CLINIC.model_dump(mode="json", exclude_defaults=True)
    # A model server that is not there: building its backend connects to nothing.
    data["llm"] = {"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "m"}
    spec.write_text(yaml.safe_dump(data))
    with listening() as held:
        result = poirotd(
            "run",
            "--config",
            str(spec),
            "--db",
            str(tmp_path / "db.sqlite"),
            "--grpc-port",
            "0",
            "--metrics-port",
            str(held),
            env={"POIROTD_LOG_FORMAT": "json", "POIROTD_LOG_LEVEL": "warning"},
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [MESSAGES["metrics"].format(port=held)]
