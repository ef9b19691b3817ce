"""The gRPC forwarder against a real poirotd: a sink call returns only once poirotd has the
samples durably; un-acked samples go out again after poirotd comes back."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import yaml

from hwbridge.broker import free_port
from hwbridge.config import BackoffConfig, DeadLetterConfig, PoirotdConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import Forwarder, ForwardError
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config import Settings, SystemSpec
from poirotd.daemon import Daemon
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import TelemetryBatch

SPEC = {
    "system": {"name": "clinic", "description": "Three agents plan therapy on an exoskeleton."},
    "agents": [
        {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose."},
        {"id": "physio", "name": "Physio", "system_prompt": "You advise on dosing."},
    ],
    "components": [
        {
            "id": "d2w_exoskeleton",
            "name": "Discover2Walk exoskeleton",
            "type": "hardware",
            "description": "Error signature: implausible readings. Normal behaviour: gait data.",
        }
    ],
    # Never called here; an OpenAI-compatible backend is built without contacting the server.
    "llm": {"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "none"},
}
START = datetime(2026, 1, 1, tzinfo=UTC)


def samples(n: int, offset: int = 0, component: str = "d2w_exoskeleton") -> TelemetryBatch:
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


def joined(*batches: TelemetryBatch) -> TelemetryBatch:
    return TelemetryBatch("e2e", [row for batch in batches for row in batch.rows])


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


def stored_values(db: Path) -> list[float]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT value FROM telemetry_samples ORDER BY block_id, position"
        ).fetchall()
    return [value for (value,) in rows]


async def start_daemon(db: Path, port: int = 0) -> Daemon:
    settings = Settings(db_path=db, grpc_port=port, metrics_port=0, drain_seconds=0)
    daemon = Daemon(
        settings, SystemSpec.model_validate(SPEC), backend=ScriptedBackend(lambda *_: "")
    )
    await daemon.start()
    return daemon


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    d = await start_daemon(tmp_path / "poirotd.db")
    yield d
    await d.stop()


async def test_sink_call_returns_once_samples_are_durable(daemon: Daemon, tmp_path: Path) -> None:
    async with forwarder(daemon.grpc_port, max_pending=100) as sink:
        # Several concurrent calls, together larger than the pending window: backpressure.
        await asyncio.gather(*(sink(samples(60, offset=k * 60)) for k in range(5)))
        assert sorted(stored_values(tmp_path / "poirotd.db")) == [float(i) for i in range(300)]
        assert sink.stats.durable == sink.stats.accepted == 300 and sink.stats.rejected == 0


async def test_samples_wait_for_poirotd_to_come_up(tmp_path: Path) -> None:
    port = free_port()
    async with forwarder(port) as sink:
        waiting = asyncio.create_task(sink(samples(50)))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing to ack it yet
        late = await start_daemon(tmp_path / "poirotd.db", port)
        try:
            async with asyncio.timeout(10):
                await waiting
            assert len(stored_values(tmp_path / "poirotd.db")) == 50
        finally:
            await sink.close()
            await late.stop()


async def test_a_refused_sample_is_dead_lettered_and_the_rest_flow(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Many samples follow the refused one, so the refusal lands while the forwarder is still
    writing: the case where grpc.aio hides the server's status (grpc/grpc#36066)."""
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    bad = samples(1, offset=10, component="toaster")
    async with forwarder(daemon.grpc_port, dead_letters=dead_letters) as sink:
        async with asyncio.timeout(10):
            await sink(joined(samples(10), bad, samples(2000, offset=11)))
        assert sink.stats.rejected == 1
    (letter,) = dead_letters.recent()
    assert letter.source == "poirotd" and "'toaster' is not declared" in letter.reason
    assert b'"component":"toaster"' in letter.payload
    assert set(stored_values(tmp_path / "poirotd.db")) == {float(i) for i in range(2011)} - {10.0}


class HidingRefusals:
    """grpc/grpc#36066 at its worst, around a real call: once the client has written past the
    sample poirotd refuses, the refusal reaches it as INTERNAL "Internal error from Core"."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._written = 0

    async def write(self, request: pb.IngestRequest) -> None:
        last = request.seq + max(len(request.items), 1) - 1  # a batch numbers from its seq
        self._written = max(self._written, last)
        await self._call.write(request)

    async def read(self) -> object:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as error:
            refused = re.match(r"seq (\d+):", error.details() or "")
            if refused is None or self._written <= int(refused[1]):
                raise
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="Internal error from Core",
            ) from error

    def cancel(self) -> bool:
        return bool(self._call.cancel())


async def test_a_refusal_grpc_hides_is_found_by_probing(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
    async with forwarder(daemon.grpc_port, dead_letters=dead_letters) as sink:
        stub = sink._stub  # wrap each call the forwarder opens
        monkeypatch.setattr(
            sink, "_stub", SimpleNamespace(Stream=lambda: HidingRefusals(stub.Stream()))
        )
        bad = samples(1, offset=10, component="toaster")
        async with asyncio.timeout(10):
            await sink(joined(samples(10), bad, samples(500, offset=11)))
        assert sink.stats.rejected == 1 and sink.stats.streams == 3
    assert "'toaster' is not declared" in dead_letters.recent()[0].reason
    assert len(stored_values(tmp_path / "poirotd.db")) == 510


async def test_a_refused_session_fails_the_forwarder(daemon: Daemon) -> None:
    async with forwarder(daemon.grpc_port, system="trading-desk") as sink:
        with pytest.raises(ForwardError, match="this daemon monitors 'clinic'"):
            async with asyncio.timeout(10):
                await sink(samples(3))
        with pytest.raises(ForwardError):
            await sink(samples(1))


class PoirotdProcess:
    """`poirotd run` on a fixed port, so a restarted daemon is found at the same address."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.db = folder / "poirotd.db"
        self.spec = folder / "spec.yaml"
        self.spec.write_text(yaml.safe_dump(SPEC))
        self.log = folder / "poirotd.log"
        self._ready = folder / "ready.json"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._ready.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "poirotd", "run", "--config", str(self.spec)),
                    *("--db", str(self.db), "--grpc-port", str(self.port)),
                    *("--metrics-port", "0", "--ready-file", str(self._ready)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not self._ready.exists():
            assert self._process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "poirotd did not get ready"
            time.sleep(0.05)

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()


@pytest.fixture
def poirotd_process(tmp_path: Path) -> Iterator[PoirotdProcess]:
    process = PoirotdProcess(tmp_path)
    process.start()
    yield process
    process.kill()


@pytest.mark.slow
async def test_unacked_samples_are_resent_after_poirotd_crashes(
    poirotd_process: PoirotdProcess,
) -> None:
    total = 3000
    async with forwarder(poirotd_process.port) as sink:
        sending = asyncio.gather(*(sink(samples(100, offset=k * 100)) for k in range(30)))
        async with asyncio.timeout(10):
            while sink.stats.durable < 500:  # noqa: ASYNC110 - counters have no event
                await asyncio.sleep(0.005)
        await asyncio.to_thread(poirotd_process.kill)  # SIGKILL mid-stream: acks are lost
        assert not sending.done()
        await asyncio.to_thread(poirotd_process.start)
        async with asyncio.timeout(30):
            await sending
        assert sink.stats.resent > 0 and sink.stats.streams >= 2
    values = stored_values(poirotd_process.db)
    # At least once: a sample committed just before the crash may be stored twice, none is lost.
    assert set(values) == {float(i) for i in range(total)} and len(values) >= total
