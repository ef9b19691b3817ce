"""gRPC Investigations: trigger, query and watch investigations; a thin skin over the core."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from poirotd.api import convert
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import InvalidArgument, ServiceError
from poirotd.investigations.service import InvestigationService
from poirotd.protocol.reputation import confirmed_beta
from poirotd.transports.grpc.clients import ClientLimits, client_identity
from poirotd.transports.grpc.status import abort

_MAX_PAGE = 500
_DEFAULT_PAGE = 50


class InvestigationsServicer(pb_grpc.InvestigationsServicer):
    def __init__(self, service: InvestigationService, limits: ClientLimits) -> None:
        self._service = service
        self._limits = limits

    async def Trigger(
        self, request: pb.TriggerRequest, context: grpc.aio.ServicerContext
    ) -> pb.Investigation:
        client = client_identity(context)
        try:
            if self._limits.triggers is not None:  # first: refused triggers cost a token too
                self._limits.triggers.take(client)
            investigation = await self._service.trigger(
                request.session_id,
                request.reason,
                method=request.method or "poirot",
                requested_by=client,
            )
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.Trigger", error)
        return convert.investigation(investigation)

    async def Get(
        self, request: pb.GetInvestigationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Investigation:
        try:
            investigation = await self._service.get(request.investigation_id)
            exchanges = (
                await self._service.exchanges(request.investigation_id)
                if request.include_exchanges
                else []
            )
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.Get", error)
        return convert.investigation(investigation, exchanges)

    async def List(
        self, request: pb.ListInvestigationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListInvestigationsResponse:
        try:
            if request.page_size > _MAX_PAGE:
                raise InvalidArgument(f"page_size is at most {_MAX_PAGE}", reason="invalid")
            found, token = await self._service.list(
                session_id=request.session_id or None,
                state=convert.state_from_pb(request.state),
                page_size=request.page_size or _DEFAULT_PAGE,
                page_token=request.page_token or None,
                method=request.method or None,
                canaries=request.canaries,
            )
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.List", error)
        return pb.ListInvestigationsResponse(
            investigations=[convert.investigation(i) for i in found], next_page_token=token or ""
        )

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InvestigationEvent]:
        if request.system and request.system != self._service.spec.system.name:
            return
        try:
            held = self._limits.watchers.hold(client_identity(context))
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.Watch", error)
        events = self._service.watch(
            after_event_id=request.after_event_id,
            investigation_id=request.investigation_id or None,
            component=request.component,
            min_score=request.min_score,
        )
        try:
            with held:
                async for event in events:
                    yield convert.event(event)
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.Watch", error)

    async def GetHazardSpace(
        self, request: pb.GetHazardSpaceRequest, context: grpc.aio.ServicerContext
    ) -> pb.HazardSpace:
        try:
            space = await self._service.hazard_space()
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.GetHazardSpace", error)
        return convert.hazard_space(space)

    async def ConfirmOutcome(
        self, request: pb.ConfirmOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConfirmOutcomeResponse:
        try:
            record, newly = await self._service.confirm_outcome(
                request.investigation_id,
                list(request.region_ids),
                request.note,
                supersede=request.supersede,
            )
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.ConfirmOutcome", error)
        assert record.confirmed is not None, "confirm_outcome returns the confirmed record"
        response = pb.ConfirmOutcomeResponse(
            confirmed=convert.confirmed_outcome(record.confirmed),
            newly_confirmed=newly,
            betas=await self._agent_betas(),
        )
        if newly and record.superseded:  # this call replaced the latest of them
            response.superseded.CopyFrom(convert.confirmed_outcome(record.superseded[-1]))
        return response

    async def GetReputation(
        self, request: pb.GetReputationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReputationResponse:
        return await self._reputation()

    async def SeedReputation(
        self, request: pb.SeedReputationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReputationResponse:
        try:
            await self._service.seed_reputation(request.source, convert.campaign_outcomes(request))
        except ServiceError as error:
            await abort(context, self._service.metrics, "Investigations.SeedReputation", error)
        return await self._reputation()

    async def _reputation(self) -> pb.GetReputationResponse:
        """β and reliabilities in use, each beside its confirmed and its campaign value."""
        spec = self._service.spec
        seed = await self._service.campaign_seed()
        response = pb.GetReputationResponse(
            reputation_enabled=spec.protocol.reputation.enabled,
            betas=await self._agent_betas(),
            campaign_weight=spec.protocol.reputation.campaign_weight,
            reliability_campaign_weight=spec.protocol.ensemble.reliability.campaign_weight,
        )
        for view in await self._service.reliabilities():
            entry = response.reliabilities.add(
                method=view.method,
                reliability=view.reliability,
                confirmed_reliability=view.confirmed,
                confirmations=view.confirmations,
            )
            if view.campaign is not None:
                entry.campaign.CopyFrom(convert.campaign_value(view.campaign))
        if seed is not None:
            response.campaign_source = seed.source
            response.campaign_seeded_at.CopyFrom(convert.timestamp(seed.seeded_at))
            response.campaign_cases = seed.cases
        return response

    async def _agent_betas(self) -> list[pb.AgentBeta]:
        spec = self._service.spec
        reputations = await self._service.reputations()
        seed = await self._service.campaign_seed()
        confirmed = {a: confirmed_beta(spec, reputations.get(a))[0] for a in spec.agent_ids}
        return convert.agent_betas(
            await self._service.betas(),
            reputations,
            confirmed,
            seed.agents if seed is not None else {},
        )
