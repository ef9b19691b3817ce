"""Phase I: the N error regions votes are cast over.

Built once per system description, not per incident: an operator-pinned space wins, then the
cache keyed by `SystemSpec.description_version()`, and only then one LLM call, whose result is
cached so that every later investigation of the same description votes over the same axes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Protocol

import structlog

from poirotd.config.spec import SystemSpec
from poirotd.model import HazardRegion, HazardSpace, Phase
from poirotd.protocol import prompts
from poirotd.protocol.errors import AnswerFailed, ProtocolError
from poirotd.protocol.run import CallSite, RunContext
from poirotd.protocol.schemas import hazard_space_format

log = structlog.get_logger(__name__)


class HazardSpaceCache(Protocol):
    """Where built hazard spaces are kept (the store implements it)."""

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None: ...

    async def put_hazard_space(self, space: HazardSpace) -> None: ...


async def resolve_hazard_space(
    spec: SystemSpec, cache: HazardSpaceCache, run: RunContext
) -> HazardSpace:
    """The hazard space for `spec`: pinned, cached, or built by the LLM (then cached).

    Raises ProtocolError when the LLM gives no valid space within the retry bound.
    """
    pinned = pinned_hazard_space(spec)
    if pinned is not None:
        return pinned
    version = spec.description_version()
    cached = await cache.get_hazard_space(spec.system.name, version)
    if cached is not None:
        return cached
    try:
        answer = await run.until_valid(
            CallSite(Phase.HAZARD_SPACE, "", "hazard_space"),
            prompts.hazard_space_request(spec),
            hazard_space_format(spec),
            max_tokens=spec.protocol.hazard_space_max_tokens,
            retries=spec.protocol.invalid_json_retries,
        )
    except AnswerFailed as exc:
        return _declared_space(spec, version, reason=str(exc))
    space = HazardSpace(
        system=spec.system.name, version=version, regions=answer.error_regions, source="llm"
    )
    await cache.put_hazard_space(space)
    return space


def _declared_space(spec: SystemSpec, version: str, *, reason: str) -> HazardSpace:
    """The regions the operator declared (agents, then components), for when the LLM gives no
    valid hazard space: an investigation still gets an attribution, over a space recorded as
    source "spec". It is not cached, so the next investigation asks the LLM again."""
    if not spec.components:
        raise ProtocolError(
            f"could not build the hazard space of system {spec.system.name!r}: {reason}. "
            "Pin it instead: list the regions under `hazard_space.regions` in the system spec "
            "(agents first, in spec order), or declare the system's components."
        )
    log.warning(
        "hazard space from the LLM invalid; using the spec's declared regions",
        system=spec.system.name,
        reason=reason,
    )
    regions = [agent_region(a.id, a.name) for a in spec.agents]
    regions += [
        HazardRegion(id=c.id, name=c.name, type=c.type, description=c.description)
        for c in spec.components
    ]
    return HazardSpace(
        system=spec.system.name, version=version, regions=tuple(regions), source="spec"
    )


def agent_region(agent_id: str, name: str) -> HazardRegion:
    """An agent's region when no Phase I description is available."""
    return HazardRegion(
        id=agent_id,
        name=name,
        type="agent",
        description=(
            f"Error signature: {name} produces output that contradicts its own inputs or "
            f"departs from its role. Normal behaviour: {name} acts as its role prescribes."
        ),
    )


def pinned_hazard_space(spec: SystemSpec) -> HazardSpace | None:
    """The operator's hazard space from the spec, if one is pinned there."""
    if spec.hazard_space is None:
        return None
    regions = spec.hazard_space.regions
    return HazardSpace(
        system=spec.system.name, version=_pinned_version(regions), regions=regions, source="pinned"
    )


def _pinned_version(regions: tuple[HazardRegion, ...]) -> str:
    """A content hash, so an edited pin is a new version in the audit trail."""
    basis = json.dumps([r.model_dump() for r in regions], sort_keys=True)
    return "pinned-" + hashlib.sha256(basis.encode()).hexdigest()[:16]
