"""The one table of what each call needs: a role per gRPC method and HTTP endpoint.

A method that is not in the table is refused to everyone: a new RPC is closed until it is given
a role here. Health and reflection are open, so probes and tools work without credentials.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Role(enum.StrEnum):
    INGEST = "ingest"  # write messages and telemetry (Ingest.Stream; OTLP export)
    # investigations, events, hazard space, reputation, sessions' counts and telemetry; no
    # prompts or answers, no message of a session
    READER = "reader"
    OPERATOR = "operator"  # start investigations, confirm their outcomes
    # what a reader sees, and the LLM exchanges (prompts and answers) and sessions' messages
    AUDITOR = "auditor"
    METRICS = "metrics"  # scrape /metrics


# Roles a role includes: an auditor reads everything a reader does.
INCLUDED: Mapping[Role, frozenset[Role]] = {Role.AUDITOR: frozenset({Role.READER})}


@dataclass(frozen=True)
class Requirement:
    role: Role
    # A request field that, when set, asks for a further role: (field, role).
    raised_by: tuple[str, Role] | None = None

    def role_for(self, request: Any) -> Role:
        """The role this request needs (a request that does not decode needs the base role; the
        guard refuses it next)."""
        if self.raised_by is not None and getattr(request, self.raised_by[0], False) is True:
            return self.raised_by[1]
        return self.role


# None: open to anyone.
REQUIRED: Mapping[str, Requirement | None] = {
    "/poirot.v1.Ingest/Stream": Requirement(Role.INGEST),
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export": Requirement(Role.INGEST),
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export": Requirement(Role.INGEST),
    "/poirot.v1.Investigations/Trigger": Requirement(Role.OPERATOR),
    "/poirot.v1.Investigations/ConfirmOutcome": Requirement(Role.OPERATOR),
    "/poirot.v1.Investigations/SeedReputation": Requirement(Role.OPERATOR),
    "/poirot.v1.Investigations/Get": Requirement(
        Role.READER, raised_by=("include_exchanges", Role.AUDITOR)
    ),
    "/poirot.v1.Investigations/List": Requirement(Role.READER),
    "/poirot.v1.Investigations/Watch": Requirement(Role.READER),
    "/poirot.v1.Investigations/GetHazardSpace": Requirement(Role.READER),
    "/poirot.v1.Investigations/GetReputation": Requirement(Role.READER),
    # A session's messages are the agents' own text, which the exchanges quote: auditors only.
    "/poirot.v1.Sessions/List": Requirement(Role.READER),
    "/poirot.v1.Sessions/Get": Requirement(
        Role.READER, raised_by=("include_messages", Role.AUDITOR)
    ),
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": None,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": None,
    "GET /metrics": Requirement(Role.METRICS),
    "POST /v1/traces": Requirement(Role.INGEST),
    "POST /v1/logs": Requirement(Role.INGEST),
    # The page (poirotd.transports.page): what Get and Watch show; the exchanges and the
    # session's messages, as Get and Sessions.Get show them to auditors; ConfirmOutcome.
    "GET /page": Requirement(Role.READER),
    "GET /page/exchanges": Requirement(Role.AUDITOR),
    "POST /page/confirm": Requirement(Role.OPERATOR),
}
