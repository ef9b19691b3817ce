"""`caller()`: the identity an RPC authenticated as, for code the handler runs (per-client
limits), right under concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore
from poirotd.transports.grpc.auth import AuthInterceptor, caller
from poirotd.transports.security.access import AccessControl
from poirotd.transports.security.denials import DenialRecorder
from tests.support.pki import Pki


async def test_each_rpc_sees_its_own_caller(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({"a": ("alice", ["reader"]), "b": ("bob", ["reader"])}, {})
    store = await SqliteStore.open(tmp_path / "db.sqlite")
    denials = DenialRecorder(
        store, Metrics("clinic"), asyncio.get_running_loop(), window_seconds=60, max_summaries=16
    )
    interceptor = AuthInterceptor(AccessControl(pki.auth_file), denials)

    async def reputation(
        request: pb.GetReputationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReputationResponse:
        before = caller()
        await asyncio.sleep(0.05)  # the other call runs meanwhile
        after = caller()
        assert before is not None and after is not None
        return pb.GetReputationResponse(
            betas=[pb.AgentBeta(agent_id=f"{before.name}/{after.name}")]
        )

    handler = grpc.unary_unary_rpc_method_handler(
        reputation,
        request_deserializer=pb.GetReputationRequest.FromString,
        response_serializer=pb.GetReputationResponse.SerializeToString,
    )
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "poirot.v1.Investigations", {"GetReputation": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        target = f"127.0.0.1:{port}"
        async with PoirotClient(target, token="a") as alice, PoirotClient(target, token="b") as bob:
            replies = await asyncio.gather(alice.reputation(), bob.reputation())
        assert [r.betas[0].agent_id for r in replies] == ["alice/alice", "bob/bob"]
        assert caller() is None  # nothing leaks out of the RPCs' own tasks
    finally:
        await server.stop(0)
        await store.close()
