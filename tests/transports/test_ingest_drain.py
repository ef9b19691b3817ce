"""Draining ends open Ingest streams the clean way: what the daemon read is committed and acked,
then the stream ends with UNAVAILABLE telling the client to go to another replica, well before
the transports' grace period, and a new stream is refused the same way."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config.settings import Settings
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.ingest_requests import message, start
from poirotd.errors import DRAINING
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.grpc.server import INGEST_DRAIN_SECONDS
from tests.support.core_errors import client_core_error
from tests.support.daemon import rejected, stored_messages


def numbered(seq: int, request: pb.IngestRequest) -> pb.IngestRequest:
    request.seq = seq
    return request


@pytest.mark.timeout(30)
async def test_drain_acks_what_was_read_and_ends_the_stream_with_unavailable(
    tmp_path: Path,
) -> None:
    settings = Settings(db_path=tmp_path / "poirotd.db", grpc_port=0, metrics_port=0)
    daemon = Daemon(settings, CLINIC, backend=ScriptedBackend(schema_answer))
    await daemon.start()
    stopping: asyncio.Task[None] | None = None
    try:
        async with PoirotClient(f"127.0.0.1:{daemon.grpc_port}") as client:
            call = client.ingest.Stream()
            await call.write(numbered(1, start()))
            for i in range(5):
                await call.write(numbered(i + 2, message(i)))
            acked = 0
            while acked < 6:
                acked = (await call.read()).durable_seq
            # The stream stays open, idle: the daemon now drains.
            began = time.monotonic()
            stopping = asyncio.create_task(daemon.stop())
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while (ack := await call.read()) is not grpc.aio.EOF:
                    acked = ack.durable_seq
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (ended.value.details() or "").startswith(DRAINING)
            assert "reconnect to another replica" in (ended.value.details() or "")
            assert time.monotonic() - began < INGEST_DRAIN_SECONDS
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.send([start()])
            assert refused.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,  # the server may already be stopping
            ) or client_core_error(refused.value)
            await stopping
    except BaseException:
        if stopping is None:
            await daemon.stop()
        else:
            await stopping
        raise
    assert acked == 6
    assert stored_messages(daemon) == 5
    assert rejected(daemon, "Ingest.Stream", "draining") >= 1
