"""Authentication and roles on every RPC: the caller's bearer token or client certificate is
looked up in the access policy, and the method's role (`security.roles.REQUIRED`) checked,
before the handler runs.

No credentials, an unknown token or certificate: UNAUTHENTICATED. Known but without the role:
PERMISSION_DENIED naming the role. Each refusal is counted, logged and chained
(`DenialRecorder`). The handler runs with the caller's identity in `caller()`.

The check runs inside the wrapped behaviour, not in `intercept_service`: only the call's context
carries the peer's certificate, and only the decoded request tells whether Get asks for the
exchanges (which needs `auditor`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from poirotd.transports.grpc.guard import release, rpc_name
from poirotd.transports.security.access import (
    AccessControl,
    AccessDeniedError,
    ClientCertificate,
    DenialReason,
    Identity,
)
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.roles import REQUIRED

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]

_caller: ContextVar[Identity | None] = ContextVar("poirotd_grpc_caller", default=None)


def caller() -> Identity | None:
    """Who the RPC being handled authenticated as; None when authentication is off. Set by
    `AuthInterceptor` in the RPC's own task, so it is right in everything the handler awaits."""
    return _caller.get()


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, access: AccessControl, denials: DenialRecorder) -> None:
        self._access = access
        self._denials = denials

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or (method in REQUIRED and REQUIRED[method] is None):
            return handler  # unknown to the server (UNIMPLEMENTED), or open to all
        authorization = _authorization(handler_call_details.invocation_metadata)
        admit = _Admission(self._access, self._denials, method, authorization)
        wrap = {
            "unary_unary": (grpc.unary_unary_rpc_method_handler, admit.unary),
            "unary_stream": (grpc.unary_stream_rpc_method_handler, admit.unary_stream),
            "stream_unary": (grpc.stream_unary_rpc_method_handler, admit.unary),
            "stream_stream": (grpc.stream_stream_rpc_method_handler, admit.unary_stream),
        }
        for kind, (make, guarded) in wrap.items():
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                return make(
                    guarded(behaviour),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler  # pragma: no cover - a handler has one of the four behaviours


class _Admission:
    """One call's check: who it is, then whether it may."""

    def __init__(
        self,
        access: AccessControl,
        denials: DenialRecorder,
        method: str,
        authorization: str | None,
    ) -> None:
        self._access = access
        self._denials = denials
        self._method = method
        self._rpc = rpc_name(method)
        self._authorization = authorization

    def unary(self, behaviour: Behaviour) -> Behaviour:
        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                await self._admit(request, context)
                return await behaviour(request, context)
            except grpc.aio.AbortError as aborted:
                release(aborted)  # a refused call is freed when it ends (see guard)
                return None

        return admitted

    def unary_stream(self, behaviour: Behaviour) -> Behaviour:
        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                await self._admit(request, context)
                async for reply in behaviour(request, context):
                    yield reply
            except grpc.aio.AbortError as aborted:
                release(aborted)

        return admitted

    async def _admit(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            identity = self._access.policy().identify(
                self._authorization, _client_certificate(context)
            )
            requirement = REQUIRED.get(self._method)
            if requirement is None:
                raise AccessDeniedError(
                    DenialReason.CLOSED,
                    f"no role may call {self._rpc}",
                    identity=identity.name,
                )
            identity.require(requirement.role_for(request), self._rpc)
            _caller.set(identity)
        except AccessDeniedError as denied:
            self._denials.record(denied, transport="grpc", call=self._rpc, peer=context.peer())
            code = (
                grpc.StatusCode.PERMISSION_DENIED
                if denied.reason.authenticated
                else grpc.StatusCode.UNAUTHENTICATED
            )
            await context.abort(code, str(denied))


def _authorization(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else bytes(value).decode(errors="replace")
    return None


def _client_certificate(context: grpc.aio.ServicerContext) -> ClientCertificate | None:
    """The verified client certificate's URI and DNS SANs, from gRPC's typed peer properties
    (its untyped x509_subject_alternative_name mixes email and IP SANs in; its common name is
    not a SAN at all); None without a client certificate."""
    auth = context.auth_context()
    if not auth.get("x509_pem_cert"):
        return None

    def values(key: str) -> list[str]:
        return [value.decode(errors="replace") for value in auth.get(key, ()) if value]

    return ClientCertificate.of(values("peer_uri"), values("peer_dns"))
