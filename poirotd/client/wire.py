"""A small async client for poirotd's gRPC API (demo, tests, operators' scripts)."""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from poirotd.api.limits import BATCH_BYTES, MAX_REPLY_BYTES
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc

# A batched item's tag and length prefix, on top of its own size.
_FRAMING_BYTES = 4


@dataclass(frozen=True)
class DaemonTls:
    """How to reach a daemon's TLS port: the CA that signed its certificate (None: the system's
    roots), this client's certificate and key when the daemon requires one, and the name to
    expect in its certificate when it is not the target's host. PEM bytes, as a gRPC channel
    takes them (`client_tls.ClientTLS` is the outgoing TLS of MQTT and LLM connections)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(
        cls,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        server_name: str | None = None,
    ) -> DaemonTls:
        if (cert is None) != (key is None):
            raise ValueError("a client certificate and its key go together")
        return cls(
            ca.read_bytes() if ca else None,
            cert.read_bytes() if cert else None,
            key.read_bytes() if key else None,
            server_name,
        )


def open_channel(
    target: str,
    *,
    tls: DaemonTls | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A channel to a daemon, over TLS when `tls` is given, sending `authorization: Bearer
    <token>` with every call when `token` is."""
    interceptors = [kind(token) for kind in _TOKEN_INTERCEPTORS] if token is not None else []
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    if tls.server_name is not None:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)


class _BearerToken:
    """Adds the token to a call's metadata. grpc.aio files an interceptor under one kind of
    call only, hence one subclass per kind."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    async def _call(
        self, continuation: Callable[..., Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._header)
        return await continuation(details._replace(metadata=metadata), request)


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    intercept_unary_unary = _BearerToken._call


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    intercept_unary_stream = _BearerToken._call


class _StreamUnaryToken(_BearerToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    intercept_stream_unary = _BearerToken._call


class _StreamStreamToken(_BearerToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    intercept_stream_stream = _BearerToken._call


_TOKEN_INTERCEPTORS = (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)


class PoirotClient:
    def __init__(
        self, target: str, *, tls: DaemonTls | None = None, token: str | None = None
    ) -> None:
        self._channel = open_channel(
            target,
            tls=tls,
            token=token,
            options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)],
        )
        self.ingest = pb_grpc.IngestStub(self._channel)
        self.investigations = pb_grpc.InvestigationsStub(self._channel)
        self.sessions = pb_grpc.SessionsStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
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
        """`method`: "poirot" (also when empty), "baseline", "echo", "errorprobe" or "ensemble"."""
        investigation: pb.Investigation = await self.investigations.Trigger(
            pb.TriggerRequest(session_id=session_id, reason=reason, method=method)
        )
        return investigation

    async def get(
        self, investigation_id: str, *, include_exchanges: bool = False
    ) -> pb.Investigation:
        """With `include_exchanges`, every prompt and answer too (the auditor role)."""
        investigation: pb.Investigation = await self.investigations.Get(
            pb.GetInvestigationRequest(
                investigation_id=investigation_id, include_exchanges=include_exchanges
            )
        )
        return investigation

    async def list_investigations(
        self,
        *,
        session_id: str = "",
        state: pb.InvestigationState.ValueType = pb.INVESTIGATION_STATE_UNSPECIFIED,
        method: str = "",
        page_size: int = 0,
        page_token: str = "",
        canaries: bool = False,
    ) -> pb.ListInvestigationsResponse:
        """A page of investigations, newest first; an empty filter matches every one. Real
        investigations only, or with `canaries` the canaries' only."""
        response: pb.ListInvestigationsResponse = await self.investigations.List(
            pb.ListInvestigationsRequest(
                session_id=session_id,
                state=state,
                method=method,
                page_size=page_size,
                page_token=page_token,
                canaries=canaries,
            )
        )
        return response

    async def list_sessions(
        self, *, page_size: int = 0, page_token: str = ""
    ) -> pb.ListSessionsResponse:
        """A page of stored sessions, newest started first, with their counts."""
        response: pb.ListSessionsResponse = await self.sessions.List(
            pb.ListSessionsRequest(page_size=page_size, page_token=page_token)
        )
        return response

    async def get_session(
        self,
        session_id: str,
        *,
        include_messages: bool = False,
        from_index: int = 0,
        max_messages: int = 0,
    ) -> pb.SessionDetail:
        """One session's counts and telemetry summary; with `include_messages` (the auditor
        role) a page of its messages from `from_index` on."""
        detail: pb.SessionDetail = await self.sessions.Get(
            pb.GetSessionRequest(
                session_id=session_id,
                include_messages=include_messages,
                from_index=from_index,
                max_messages=max_messages,
            )
        )
        return detail

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

    async def seed_reputation(
        self, source: str, outcomes: Iterable[pb.CampaignOutcome]
    ) -> pb.GetReputationResponse:
        """Seeds β and reliabilities from a fault campaign's outcomes (SeedReputation)."""
        response: pb.GetReputationResponse = await self.investigations.SeedReputation(
            pb.SeedReputationRequest(source=source, outcomes=list(outcomes))
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
    for the daemon instead of one per item. Idempotency keys go along (a batch holds one
    producer's items: another producer starts a new batch)."""
    batch, size = pb.IngestRequest(seq=first_seq), 0
    for seq, request in enumerate(requests, start=first_seq):
        item = pb.IngestItem(producer_seq=request.producer_seq)
        which = request.WhichOneof("item")
        if which is not None:
            getattr(item, which).CopyFrom(getattr(request, which))
        item_size = item.ByteSize() + _FRAMING_BYTES
        if batch.items and (size + item_size > limit or request.producer != batch.producer):
            yield batch
            batch, size = pb.IngestRequest(seq=seq), 0
        batch.producer = request.producer
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
