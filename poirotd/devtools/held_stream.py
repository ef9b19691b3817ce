"""An Ingest stream a client holds open without sending: what a stuck or silent producer looks
like to the daemon, for the tests and the benchmark of its per-client stream bound and idle
deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.devtools.ingest_requests import start


class HeldStream:
    """An Ingest stream that stays open, having opened a session (or having sent nothing at all:
    `session_id` None), until `close` or until the daemon ends it."""

    def __init__(self, client: PoirotClient, session_id: str | None) -> None:
        self._release = asyncio.Event()
        self._call = client.ingest.Stream(self._requests(session_id))

    async def _requests(self, session_id: str | None) -> AsyncIterator[pb.IngestRequest]:
        if session_id is not None:
            request = start(session_id)
            request.seq = 1
            yield request
        await self._release.wait()

    async def opened(self) -> int:
        """The first ack's durable seq: from then on the daemon holds the stream."""
        ack = await self._call.read()
        if not isinstance(ack, pb.IngestAck):
            raise RuntimeError(f"the stream ended before its ack: {await self._call.code()}")
        return ack.durable_seq

    async def ended(self) -> tuple[grpc.StatusCode, str]:
        """The status the daemon ends the stream with, while the client still holds it open."""
        with contextlib.suppress(grpc.aio.AioRpcError):  # read raises a status other than OK
            while await self._call.read() is not grpc.aio.EOF:
                pass
        self._release.set()
        return await self._call.code(), await self._call.details() or ""

    async def close(self) -> None:
        """Ends the stream from the client's side; raises unless the daemon closes it OK."""
        self._release.set()
        while await self._call.read() is not grpc.aio.EOF:
            pass
        code = await self._call.code()
        if code != grpc.StatusCode.OK:
            raise RuntimeError(f"the stream closed with {code}")
