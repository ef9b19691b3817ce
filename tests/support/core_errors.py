"""grpc's own client-side error that can stand in for the server's status."""

from __future__ import annotations

import grpc


def client_core_error(error: grpc.aio.AioRpcError) -> bool:
    """grpc's asyncio client reports its own INTERNAL, not the server's status, when it is still
    writing as the server ends the call (grpc/grpc#36066; docs/operating/shutdown.md). The daemon's
    own INTERNAL (the guard interceptor's) names an error id, never this text."""
    return bool(
        error.code() == grpc.StatusCode.INTERNAL and error.details() == "Internal error from Core"
    )
