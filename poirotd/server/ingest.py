"""gRPC Ingest: validated items are committed in batches and acked only once durable.

A request carries one item or a batch of them (`items`, numbered from the request's seq): the
batched form is what makes high rates possible, each request costing the event loop one turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import structlog

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import InvalidArgument, ServiceError, Unavailable
from poirotd.server import convert
from poirotd.server.status import abort
from poirotd.service import PoirotService
from poirotd.store import IngestItem

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _StreamEnd:
    error: ServiceError | None = None


_Entry = tuple[int, IngestItem] | _StreamEnd


class IngestServicer(pb_grpc.IngestServicer):
    def __init__(self, service: PoirotService, *, batch_max: int) -> None:
        self._service = service
        self._batch_max = batch_max

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.IngestRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.IngestAck]:
        # A bounded hand-off: reading pauses (and HTTP/2 flow control pushes back on the client)
        # while a batch commits; a full batch is written in one transaction (group commit).
        queue: asyncio.Queue[_Entry] = asyncio.Queue(maxsize=self._batch_max)
        reader = asyncio.create_task(self._read(request_iterator, queue))
        try:
            while True:
                batch, end = await self._next_batch(queue)
                if batch:
                    try:
                        await self._service.commit([item for _, item in batch])
                    except Exception as exc:
                        log.exception("ingest commit failed")
                        error = Unavailable(f"store write failed: {exc}", reason="store_error")
                        await abort(context, self._service.metrics, "Ingest.Stream", error)
                    yield pb.IngestAck(durable_seq=batch[-1][0])
                if end is not None:
                    if end.error is not None:
                        await abort(context, self._service.metrics, "Ingest.Stream", end.error)
                    return
        finally:
            reader.cancel()

    async def _read(
        self, requests: AsyncIterator[pb.IngestRequest], queue: asyncio.Queue[_Entry]
    ) -> None:
        validator = self._service.new_ingest_validator()
        try:
            async for request in requests:
                for seq, item, size in _unpack(
                    request, datetime.now(UTC), validator.max_item_bytes
                ):
                    validator.check(seq, item, size)
                    if queue.full():
                        await queue.put((seq, item))
                    else:  # no coroutine per item when there is room, the usual case
                        queue.put_nowait((seq, item))
        except ServiceError as error:
            await queue.put(_StreamEnd(error))
        else:
            await queue.put(_StreamEnd())

    async def _next_batch(
        self, queue: asyncio.Queue[_Entry]
    ) -> tuple[list[tuple[int, IngestItem]], _StreamEnd | None]:
        """Waits for one entry, then takes whatever else is already waiting (up to batch_max)."""
        batch: list[tuple[int, IngestItem]] = []
        entry = await queue.get()
        while True:
            if isinstance(entry, _StreamEnd):
                return batch, entry
            batch.append(entry)
            if len(batch) >= self._batch_max or queue.empty():
                return batch, None
            entry = queue.get_nowait()


def _unpack(
    request: pb.IngestRequest, received_at: datetime, item_limit: int
) -> Iterator[tuple[int, IngestItem, int]]:
    """(seq, item, its size in bytes) for each item of the request, in order. Within a batch no
    larger than `item_limit`, the batch's size stands for each item's (no item can exceed it):
    sizing an item means serialising it, a tenth of the cost of converting it."""
    request_bytes = request.ByteSize()
    if not request.items:
        yield request.seq, convert.ingest_item(request, request.seq, received_at), request_bytes
        return
    if request.WhichOneof("item") is not None:
        raise InvalidArgument(
            f"seq {request.seq}: a request carries one item or a batch of items, not both",
            reason="invalid",
        )
    sized_each = request_bytes > item_limit
    for offset, entry in enumerate(request.items):
        seq = request.seq + offset
        size = entry.ByteSize() if sized_each else request_bytes
        yield seq, convert.ingest_item(entry, seq, received_at), size
