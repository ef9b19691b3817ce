"""gRPC Sessions: list stored sessions, read one; a thin skin over `ingest.session_reads`.

Who may read what is the role table's (`security.roles`): a reader the counts and telemetry, an
auditor also the messages. Here only the wire's bounds: page sizes, and the bytes of messages
one reply carries."""

from __future__ import annotations

import grpc

from poirotd.api import convert
from poirotd.api.limits import MAX_REPLY_BYTES
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import InvalidArgument, ServiceError
from poirotd.ingest.session_reads import TELEMETRY_WINDOW, SessionReads
from poirotd.observability.metrics import Metrics
from poirotd.transports.grpc.status import abort

_MAX_PAGE = 500
_DEFAULT_PAGE = 50
_MAX_MESSAGES = 1000
_DEFAULT_MESSAGES = 100
# The messages of one reply, at most (a message may hold up to the item size limit): well under
# what a client accepts, whatever the rest of the reply holds.
MESSAGE_BYTES = MAX_REPLY_BYTES // 4


class SessionsServicer(pb_grpc.SessionsServicer):
    def __init__(self, sessions: SessionReads, metrics: Metrics) -> None:
        self._sessions = sessions
        self._metrics = metrics

    async def List(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        try:
            if request.page_size > _MAX_PAGE:
                raise InvalidArgument(f"page_size is at most {_MAX_PAGE}", reason="invalid")
            found, token = await self._sessions.page(
                page_size=request.page_size or _DEFAULT_PAGE,
                page_token=request.page_token or None,
            )
        except ServiceError as error:
            await abort(context, self._metrics, "Sessions.List", error)
        return pb.ListSessionsResponse(
            sessions=[convert.session_summary(s) for s in found], next_page_token=token or ""
        )

    async def Get(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionDetail:
        try:
            if request.max_messages > _MAX_MESSAGES:
                raise InvalidArgument(f"max_messages is at most {_MAX_MESSAGES}", reason="invalid")
            summary = await self._sessions.get(request.session_id)
            telemetry = await self._sessions.telemetry(request.session_id)
            detail = pb.SessionDetail(
                session=convert.session_summary(summary),
                telemetry=[convert.signal_summary(s) for s in telemetry],
                telemetry_window=TELEMETRY_WINDOW,
            )
            if request.include_messages:
                await self._add_messages(request, detail)
        except ServiceError as error:
            await abort(context, self._metrics, "Sessions.Get", error)
        return detail

    async def _add_messages(self, request: pb.GetSessionRequest, detail: pb.SessionDetail) -> None:
        """A page of messages, cut short (at least one) where the next would pass MESSAGE_BYTES;
        next_index then names it."""
        page, next_index = await self._sessions.messages(
            request.session_id,
            from_index=request.from_index,
            limit=request.max_messages or _DEFAULT_MESSAGES,
        )
        size = 0
        for message in page:
            wire = convert.agent_message(message)
            size += wire.ByteSize()
            if detail.messages and size > MESSAGE_BYTES:
                next_index = message.index
                break
            detail.messages.append(wire)
        if next_index is not None:
            detail.next_index = next_index
