"""A small async client for poirotd's gRPC API (demo, tests, operators' scripts)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Self

import grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.wire import MAX_REPLY_BYTES


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
        """Streams the requests (seq numbers are assigned here, from 1) and returns the highest
        seq the daemon acknowledged as durable. Raises grpc.aio.AioRpcError on refusal."""
        counter = itertools.count(1)
        numbered = [_with_seq(request, next(counter)) for request in requests]
        durable = 0
        async for ack in self.ingest.Stream(iter(numbered)):
            durable = ack.durable_seq
        return durable

    async def trigger(self, session_id: str, reason: str) -> pb.Investigation:
        investigation: pb.Investigation = await self.investigations.Trigger(
            pb.TriggerRequest(session_id=session_id, reason=reason)
        )
        return investigation

    async def get(self, investigation_id: str) -> pb.Investigation:
        investigation: pb.Investigation = await self.investigations.Get(
            pb.GetInvestigationRequest(investigation_id=investigation_id)
        )
        return investigation

    async def watch(
        self, investigation_id: str = "", after_event_id: int = 0
    ) -> AsyncIterator[pb.InvestigationEvent]:
        request = pb.WatchRequest(investigation_id=investigation_id, after_event_id=after_event_id)
        async for event in self.investigations.Watch(request):
            yield event


def _with_seq(request: pb.IngestRequest, seq: int) -> pb.IngestRequest:
    numbered = pb.IngestRequest()
    numbered.CopyFrom(request)
    numbered.seq = seq
    return numbered
