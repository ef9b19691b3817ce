"""A small async client for poirotd's gRPC API (demo, tests, operators' scripts)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Self

import grpc

from poirotd.api.limits import BATCH_BYTES, MAX_REPLY_BYTES
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc

# A batched item's tag and length prefix, on top of its own size.
_FRAMING_BYTES = 4


class PoirotClient:
    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(
            target, options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)]
        )
        self.ingest = pb_grpc.IngestStub(self._channel)
        self.investigations = pb_grpc.InvestigationsStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._channel.close()

    async def send(self, requests: Iterable[pb.IngestRequest]) -> int:
        """Streams the requests' items, numbered here from 1 and packed by `batched`, and returns
        the highest seq the daemon acknowledged as durable. Raises grpc.aio.AioRpcError on
        refusal."""
        durable = 0
        async for ack in self.ingest.Stream(batched(requests)):
            durable = ack.durable_seq
        return durable

    async def stream(self, requests: AsyncIterable[pb.IngestRequest]) -> int:
        """Like `send` for requests that come over time (a paced replay): each goes out alone,
        numbered here from 1, as soon as it is produced."""
        durable = 0
        async for ack in self.ingest.Stream(_numbered(requests)):
            durable = ack.durable_seq
        return durable

    async def trigger(self, session_id: str, reason: str, method: str = "") -> pb.Investigation:
        """`method`: "poirot" (also when empty) or "baseline"."""
        investigation: pb.Investigation = await self.investigations.Trigger(
            pb.TriggerRequest(session_id=session_id, reason=reason, method=method)
        )
        return investigation

    async def get(self, investigation_id: str) -> pb.Investigation:
        investigation: pb.Investigation = await self.investigations.Get(
            pb.GetInvestigationRequest(investigation_id=investigation_id)
        )
        return investigation

    async def confirm(
        self,
        investigation_id: str,
        region_ids: Iterable[str],
        note: str = "",
        *,
        supersede: bool = False,
    ) -> pb.ConfirmOutcomeResponse:
        """Reports the true cause(s) of a succeeded investigation's incident (ConfirmOutcome);
        with `supersede`, corrects an outcome confirmed before with other regions."""
        response: pb.ConfirmOutcomeResponse = await self.investigations.ConfirmOutcome(
            pb.ConfirmOutcomeRequest(
                investigation_id=investigation_id,
                region_ids=list(region_ids),
                note=note,
                supersede=supersede,
            )
        )
        return response

    async def reputation(self) -> pb.GetReputationResponse:
        response: pb.GetReputationResponse = await self.investigations.GetReputation(
            pb.GetReputationRequest()
        )
        return response

    async def watch(
        self, investigation_id: str = "", after_event_id: int = 0
    ) -> AsyncGenerator[pb.InvestigationEvent]:
        request = pb.WatchRequest(investigation_id=investigation_id, after_event_id=after_event_id)
        async for event in self.investigations.Watch(request):
            yield event


def batched(
    requests: Iterable[pb.IngestRequest], first_seq: int = 1, limit: int = BATCH_BYTES
) -> Iterator[pb.IngestRequest]:
    """The items of single-item requests, numbered from first_seq, in batched requests of up to
    `limit` bytes each (an item larger than that goes alone): one read of the stream per batch
    for the daemon instead of one per item."""
    batch, size = pb.IngestRequest(seq=first_seq), 0
    for seq, request in enumerate(requests, start=first_seq):
        item = pb.IngestItem()
        which = request.WhichOneof("item")
        if which is not None:
            getattr(item, which).CopyFrom(getattr(request, which))
        item_size = item.ByteSize() + _FRAMING_BYTES
        if batch.items and size + item_size > limit:
            yield batch
            batch, size = pb.IngestRequest(seq=seq), 0
        batch.items.append(item)
        size += item_size
    if batch.items:
        yield batch


async def _numbered(requests: AsyncIterable[pb.IngestRequest]) -> AsyncIterator[pb.IngestRequest]:
    seq = 0
    async for request in requests:
        seq += 1
        numbered = pb.IngestRequest()
        numbered.CopyFrom(request)
        numbered.seq = seq
        yield numbered
