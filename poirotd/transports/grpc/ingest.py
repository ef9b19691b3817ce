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

from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import Internal, InvalidArgument, ServiceError, Unavailable
from poirotd.model import IngestItem
from poirotd.service import PoirotService
from poirotd.transports.grpc.status import abort

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _StreamEnd:
    error: ServiceError | None = None


_Checked = list[tuple[int, IngestItem]]  # (seq, item) in stream order


class _Backlog:
    """One stream's checked items waiting for their commit: a bounded hand-off between reading
    and committing. Reading pauses while a batch's worth waits (HTTP/2 flow control then pushes
    back on the client). A request's items go in together, so the hand-off costs per request,
    not per item."""

    def __init__(self, batch_max: int) -> None:
        self._batch_max = batch_max
        self._items: _Checked = []
        self._end: _StreamEnd | None = None
        self._changed = asyncio.Condition()

    async def put(self, items: _Checked) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._items) < self._batch_max)
            self._items += items
            self._changed.notify_all()

    async def end(self, end: _StreamEnd) -> None:
        async with self._changed:
            self._end = end
            self._changed.notify_all()

    async def take(self) -> tuple[_Checked, _StreamEnd | None]:
        """Waits for items or the end, then takes up to batch_max items; the end comes with
        the last of them."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items) or self._end is not None)
            batch = self._items[: self._batch_max]
            del self._items[: self._batch_max]
            self._changed.notify_all()
            return batch, None if self._items else self._end


class IngestServicer(pb_grpc.IngestServicer):
    def __init__(self, service: PoirotService, *, batch_max: int) -> None:
        self._service = service
        self._batch_max = batch_max

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.IngestRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.IngestAck]:
        # A full batch is written in one transaction (group commit).
        backlog = _Backlog(self._batch_max)
        reader = asyncio.create_task(self._read(request_iterator, backlog))
        try:
            while True:
                batch, end = await backlog.take()
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

    async def _read(self, requests: AsyncIterator[pb.IngestRequest], backlog: _Backlog) -> None:
        validator = self._service.new_ingest_validator()
        async for request in requests:
            checked: _Checked = []
            error: ServiceError | None = None
            try:
                for seq, item, size in _unpack(
                    request, datetime.now(UTC), validator.max_item_bytes
                ):
                    validator.check(seq, item, size)
                    checked.append((seq, item))
            except ServiceError as refusal:
                error = refusal
            except Exception as exc:  # a bug of ours: the stream ends with a status, not a hang
                log.exception("ingest request failed", seq=request.seq)
                error = Internal(f"seq {request.seq}: request failed: {exc}", reason="internal")
            await backlog.put(checked)  # the items before a bad one are still committed
            if error is not None:
                await backlog.end(_StreamEnd(error))
                return
        await backlog.end(_StreamEnd())


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
