"""Phase I: the N error regions votes are cast over.

Built once per system description, not per incident: an operator-pinned space wins, then the
cache keyed by `SystemSpec.description_version()`, and only then one LLM call, whose result is
cached so that every later investigation of the same description votes over the same axes.

The ids come from the spec, never from the model: every declared agent and component is a region
under its own id, and the model writes their error signatures. It may also propose parts of a
component as regions of their own, under ids derived from the component's
("d2w_exoskeleton.ankle_sensor"), within the spec's bounds. Whatever else it writes is dropped,
counted and noted in the space, so a metric label, an alert or a ConfirmOutcome only ever names a
region the operator can find in the spec.
"""

from __future__ import annotations

import hashlib
import json
from typing import Protocol

import structlog

from poirotd.config.spec import SystemSpec, is_slug
from poirotd.model import DroppedRegion, DropReason, HazardRegion, HazardSpace, Phase
from poirotd.protocol.errors import AnswerFailedError
from poirotd.protocol.events import HazardSpaceBuilt
from poirotd.protocol.poirot import prompts
from poirotd.protocol.poirot.schemas import HazardSpaceAnswer, hazard_space_format
from poirotd.protocol.run import CallSite, RunContext

log = structlog.get_logger(__name__)

_PROPOSED_MAX = 80


class HazardSpaceCache(Protocol):
    """Where built hazard spaces are kept (the store implements it)."""

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None: ...

    async def put_hazard_space(self, space: HazardSpace) -> None: ...


async def resolve_hazard_space(
    spec: SystemSpec, cache: HazardSpaceCache, run: RunContext
) -> HazardSpace:
    """The hazard space for `spec`: pinned, cached, or built (then cached and announced).

    Built by the LLM, or from the spec alone when the LLM gives no valid answer within the retry
    bound: either way over the same ids, and cached, so a model that cannot answer is asked once
    per system description, not once per investigation.
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
    except AnswerFailedError as exc:
        log.warning(
            "hazard space from the LLM invalid; using the spec's declared regions",
            system=spec.system.name,
            reason=str(exc),
        )
        space = declared_space(spec, version)
    else:
        space = space_from_answer(spec, version, answer)
    await cache.put_hazard_space(space)
    await run.emit(HazardSpaceBuilt(hazard_space=space))
    return space


def declared_space(spec: SystemSpec, version: str) -> HazardSpace:
    """The regions the operator declared (agents, then components) with the spec's own words,
    for when the LLM gives no valid hazard space: an investigation still gets an attribution,
    over a space recorded as source "spec"."""
    regions = [agent_region(a.id, a.name) for a in spec.agents]
    regions += [
        HazardRegion(id=c.id, name=c.name, type=c.type, description=c.description)
        for c in spec.components
    ]
    return HazardSpace(
        system=spec.system.name, version=version, regions=tuple(regions), source="spec"
    )


def space_from_answer(spec: SystemSpec, version: str, answer: HazardSpaceAnswer) -> HazardSpace:
    """The declared regions in spec order, described as the model described them (the spec's
    words where it did not), then the sub-regions that pass: a component as parent, a slug, no
    repeat, within the bounds. Every other proposal is dropped with its reason."""
    dropped: list[DroppedRegion] = []

    def drop(proposed: str, reason: DropReason) -> None:
        dropped.append(DroppedRegion(proposed=proposed[:_PROPOSED_MAX], reason=reason))

    declared = declared_space(spec, version).regions
    descriptions: dict[str, str] = {}
    for text in (*answer.agent_regions, *answer.component_regions):
        if text.id not in spec.region_ids:
            drop(text.id, "not_in_spec")
        elif text.id in descriptions:
            drop(text.id, "duplicate")
        elif text.description.strip():
            descriptions[text.id] = text.description
    regions = [
        r.model_copy(update={"description": descriptions.get(r.id, r.description)})
        for r in declared
    ]
    types = {c.id: c.type for c in spec.components}
    per_parent = dict.fromkeys(types, 0)
    for sub in answer.sub_regions:
        region_id = f"{sub.parent}.{sub.slug}"
        if sub.parent not in types:
            drop(region_id, "not_in_spec")
        elif not is_slug(sub.slug):
            drop(region_id, "bad_slug")
        elif any(r.id == region_id for r in regions):
            drop(region_id, "duplicate")
        elif (
            per_parent[sub.parent] >= spec.protocol.max_sub_regions_per_component
            or len(regions) - len(declared) >= spec.protocol.max_sub_regions
        ):
            drop(region_id, "over_limit")
        else:
            per_parent[sub.parent] += 1
            regions.append(
                HazardRegion(
                    id=region_id,
                    name=sub.name.strip() or sub.slug,
                    type=types[sub.parent],
                    description=sub.description,
                )
            )
    return HazardSpace(
        system=spec.system.name,
        version=version,
        regions=tuple(regions),
        source="llm",
        dropped=tuple(dropped),
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
