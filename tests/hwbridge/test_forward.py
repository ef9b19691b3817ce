"""The gRPC forwarder against a real poirotd: a sink call returns only once poirotd has the
samples durably; un-acked samples go out again after poirotd comes back."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import yaml

from hwbridge.config import DeadLetterConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import ForwardError
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import BRIDGE_CLINIC
from poirotd.devtools.process import DaemonProcess, free_port
from poirotd.model import ItemKey, TelemetryBatch
from tests.support.bridge import forwarder, samples, stored_values
from tests.support.daemon import in_process_daemon


def joined(*batches: TelemetryBatch) -> TelemetryBatch:
    """The batches' rows as one batch, with their keys (None for an unkeyed batch's rows)."""
    keys = [key for b in batches for key in (b.keys or [None] * len(b.rows))]
    rows = [row for batch in batches for row in batch.rows]
    return TelemetryBatch("e2e", rows, keys if any(keys) else None)


async def test_sink_call_returns_once_samples_are_durable(daemon: Daemon, tmp_path: Path) -> None:
    async with forwarder(daemon.grpc_port, max_pending=100) as sink:
        # Several concurrent calls, together larger than the pending window: backpressure.
        await asyncio.gather(*(sink(samples(60, offset=k * 60)) for k in range(5)))
        assert sorted(stored_values(tmp_path / "poirotd.db")) == [float(i) for i in range(300)]
        assert sink.stats.durable == sink.stats.accepted == 300 and sink.stats.rejected == 0


async def test_a_redelivery_to_a_new_bridge_keeps_its_mqtt_key_and_is_stored_once(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A bridge restarted before it acked gets the broker's redelivery: the forwarder sends the
    readings' own keys (not ones of its own, which a new process draws anew), so poirotd drops
    the copies. Twenty payloads of two readings each: the second's key names producer#1."""
    keys: list[ItemKey | None] = [
        ItemKey("d2w/p7/vitals" + ("#1" if i % 2 else ""), 1 + i // 2) for i in range(40)
    ]
    keyed = TelemetryBatch("e2e", samples(40).rows, keys)
    async with forwarder(daemon.grpc_port) as first:
        await first(keyed)
    async with forwarder(daemon.grpc_port) as second:
        await second(joined(keyed, samples(10, offset=40)))
        assert second.stats.duplicates == 40
    assert sorted(stored_values(tmp_path / "poirotd.db")) == [float(i) for i in range(50)]


async def test_a_key_reused_for_another_reading_is_counted_as_a_conflict(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A sensor that restarted its count without a new name: its second reading under seq 1
    is set aside by poirotd (not stored in the session, not a copy), and the forwarder says so."""
    key = ItemKey("mqtt:d2w/p7/vitals|", 1)
    async with forwarder(daemon.grpc_port) as sink:
        await sink(TelemetryBatch("e2e", samples(1).rows, [key]))
        await sink(TelemetryBatch("e2e", samples(1, offset=5).rows, [key]))
        assert (sink.stats.duplicates, sink.stats.conflicts) == (0, 1)
    assert stored_values(tmp_path / "poirotd.db") == [0.0]


async def test_samples_wait_for_poirotd_to_come_up(tmp_path: Path) -> None:
    port = free_port()
    async with forwarder(port) as sink:
        waiting = asyncio.create_task(sink(samples(50)))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing to ack it yet
        late = in_process_daemon(tmp_path, BRIDGE_CLINIC, grpc_port=port, drain_seconds=0)
        async with late:
            try:
                async with asyncio.timeout(10):
                    await waiting
                assert len(stored_values(tmp_path / "poirotd.db")) == 50
            finally:
                await sink.close()


async def test_a_stream_poirotd_ended_as_idle_is_reopened_once_there_is_something_to_send(
    tmp_path: Path,
) -> None:
    async with (
        in_process_daemon(tmp_path, BRIDGE_CLINIC, ingest_idle_seconds=0.3) as daemon,
        forwarder(daemon.grpc_port) as sink,
    ):
        await sink(samples(10))
        await asyncio.sleep(1.5)  # five idle deadlines, nothing to send
        assert sink.stats.idle == 1 and sink.stats.streams == 1, "no stream opened meanwhile"
        await asyncio.wait_for(sink(samples(10, offset=10)), 5)
        assert sink.stats.streams == 2 and sink.stats.drained == 0
    assert sorted(stored_values(tmp_path / "poirotd.db")) == [float(i) for i in range(20)]


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
        (stub,) = sink._stubs  # wrap each call the forwarder opens
        monkeypatch.setattr(
            sink, "_stubs", [SimpleNamespace(Stream=lambda: HidingRefusals(stub.Stream()))]
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


@pytest.fixture
def poirotd_process(tmp_path: Path) -> Iterator[DaemonProcess]:
    """`poirotd run` on a fixed port, so a restarted daemon is found at the same address."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(BRIDGE_CLINIC.model_dump(mode="json")))
    with DaemonProcess(spec, tmp_path, grpc_port=free_port()) as process:
        yield process


@pytest.mark.slow
@pytest.mark.timeout(300)  # 1.5 s on a quiet 2-core box; two daemon starts of up to 120 s each
async def test_unacked_samples_are_resent_after_poirotd_crashes(
    poirotd_process: DaemonProcess,
) -> None:
    total = 3000
    async with forwarder(poirotd_process.grpc_port) as sink:
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
    values = stored_values(poirotd_process.db_path)
    # Exactly once: a sample committed just before the crash (its ack lost) is resent, and
    # dropped by its key.
    assert sorted(values) == [float(i) for i in range(total)]
