"""ErrorProbe's verified memory: failure patterns learnt only from diagnoses that were verified.

The gate: a diagnosis enters memory when ConfirmOutcome confirms its investigation blamed the
right region, or when its evidence checks all passed (at least one) at an Arbiter confidence of
at least `commit_confidence`. Anything else stays in the investigation's findings, pending a
confirmation; a model's say-so never reaches memory.

An entry is keyed by its signature (MAST mode, agent blamed, tool involved) within a system:
verifying the same pattern again reinforces it (frequency, recency, the latest recipe) rather
than adding a twin. Retrieval scores an entry against each query signature (the MAST tags of
the session being diagnosed): similarity = 0 unless the modes match, else 0.6 + 0.25 if the
agents match + 0.15 if the tools match; entries below the threshold are never offered. Those left
are ranked by similarity times quality, the mean of recency (halved every `half_life_days`),
frequency (1 - 2^-frequency) and impact ((confirmed + 1) / (confirmed + refuted + 2)).
Confirmations move impact: an entry a confirmed diagnosis used or made counts the confirmation
as agreeing when the diagnosis blamed a confirmed region, else as refuting it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from poirotd.config.spec import DiagnosisMemorySpec
from poirotd.model import DiagnosisMemoryEntry, Frozen, Investigation, MemorySignature
from poirotd.store.port import MemoryUpdate

# Investigation ids an entry remembers (for idempotent commits and confirmations).
_KEPT_IDS = 50
_SIMILAR_MODE, _SIMILAR_AGENT, _SIMILAR_TOOL = 0.6, 0.25, 0.15


class DiagnosisMemory(Protocol):
    """The part of the store memory lives in."""

    async def memory_entries(
        self, system: str, *, include_deleted: bool = False
    ) -> list[DiagnosisMemoryEntry]: ...

    async def update_memory_entry(
        self, system: str, entry_id: str, update: MemoryUpdate
    ) -> DiagnosisMemoryEntry | None: ...


class Diagnosis(Frozen):
    """ErrorProbe's verdict as memory sees it (kept in the investigation's findings)."""

    signature: MemorySignature
    region: str
    step: int | None
    claim: str
    recipe: str
    confidence: float
    # Whether the chosen hypothesis had evidence and every check of it passed.
    verified: bool


@dataclass(frozen=True)
class Recalled:
    entry: DiagnosisMemoryEntry
    similarity: float
    score: float


def entry_id_of(system: str, signature: MemorySignature) -> str:
    basis = "\x1f".join((system, signature.mode, signature.agent, signature.tool))
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def similarity(query: MemorySignature, signature: MemorySignature) -> float:
    if query.mode != signature.mode:
        return 0.0
    return (
        _SIMILAR_MODE
        + _SIMILAR_AGENT * (query.agent == signature.agent)
        + _SIMILAR_TOOL * (query.tool == signature.tool)
    )


def quality(entry: DiagnosisMemoryEntry, now: datetime, half_life_days: float) -> float:
    age_days = max(0.0, (now - entry.last_verified_at).total_seconds() / 86_400)
    recency: float = 0.5 ** (age_days / half_life_days)
    frequency: float = 1 - 0.5**entry.frequency
    impact = (entry.confirmed + 1) / (entry.confirmed + entry.refuted + 2)
    return (recency + frequency + impact) / 3


def recall(
    entries: Iterable[DiagnosisMemoryEntry],
    queries: Sequence[MemorySignature],
    settings: DiagnosisMemorySpec,
    now: datetime,
) -> list[Recalled]:
    """The best `settings.retrieve` live entries at or above the similarity threshold."""
    found = []
    for entry in entries:
        if entry.deleted_at is not None:
            continue
        sim = max((similarity(q, entry.signature) for q in queries), default=0.0)
        if sim >= settings.similarity_threshold and sim > 0:
            score = sim * quality(entry, now, settings.half_life_days)
            found.append(Recalled(entry, sim, score))
    found.sort(key=lambda r: (-r.score, r.entry.entry_id))
    return found[: settings.retrieve]


def committed(
    entry: DiagnosisMemoryEntry | None,
    system: str,
    diagnosis: Diagnosis,
    investigation_id: str,
    verified_by: Literal["evidence", "confirmed"],
    now: datetime,
) -> DiagnosisMemoryEntry | None:
    """`entry` reinforced by the diagnosis (a new entry when there is none, or the operator
    deleted it); None when this investigation already committed to it."""
    if entry is not None and entry.deleted_at is None:
        if investigation_id in entry.sources:
            return None
        return entry.model_copy(
            update={
                "recipe": diagnosis.recipe or entry.recipe,
                "example_claim": diagnosis.claim,
                "example_step": diagnosis.step,
                "verified_by": verified_by,
                "frequency": entry.frequency + 1,
                "last_verified_at": now,
                "sources": _bounded((*entry.sources, investigation_id)),
            }
        )
    return DiagnosisMemoryEntry(
        entry_id=entry_id_of(system, diagnosis.signature),
        system=system,
        signature=diagnosis.signature,
        recipe=diagnosis.recipe,
        example_claim=diagnosis.claim,
        example_step=diagnosis.step,
        verified_by=verified_by,
        frequency=1,
        created_at=now,
        last_verified_at=now,
        sources=(investigation_id,),
    )


def judged(
    entry: DiagnosisMemoryEntry | None, investigation_id: str, agreed: bool
) -> DiagnosisMemoryEntry | None:
    """`entry` with a confirmation counted (once per investigation)."""
    if entry is None or entry.deleted_at is not None or investigation_id in entry.judged:
        return None
    counter = "confirmed" if agreed else "refuted"
    return entry.model_copy(
        update={
            counter: getattr(entry, counter) + 1,
            "judged": _bounded((*entry.judged, investigation_id)),
        }
    )


def retrieved(entry: DiagnosisMemoryEntry | None) -> DiagnosisMemoryEntry | None:
    """`entry` with one more retrieval counted."""
    if entry is None or entry.deleted_at is not None:
        return None
    return entry.model_copy(update={"retrieved": entry.retrieved + 1})


async def learn_from_confirmation(memory: DiagnosisMemory, investigation: Investigation) -> None:
    """What a confirmed outcome teaches memory: the ErrorProbe diagnosis of the investigation (or
    of its ensemble's ErrorProbe member) enters memory when it blamed a confirmed region, and
    every entry it used or made counts the confirmation. Idempotent per investigation."""
    confirmed = investigation.confirmed
    findings = errorprobe_findings(investigation.findings)
    if confirmed is None or findings is None or "diagnosis" not in findings:
        return
    diagnosis = Diagnosis.model_validate(findings["diagnosis"])
    agreed = diagnosis.region in confirmed.region_ids
    system, iid = investigation.system, investigation.investigation_id
    used = [r["entry_id"] for r in findings.get("memory", {}).get("recalled", [])]
    if agreed:
        made = entry_id_of(system, diagnosis.signature)
        await memory.update_memory_entry(
            system,
            made,
            lambda e: committed(e, system, diagnosis, iid, "confirmed", confirmed.at),
        )
        used.append(made)
    elif findings.get("memory", {}).get("committed"):
        used.append(findings["memory"]["committed"])
    for entry_id in dict.fromkeys(used):
        await memory.update_memory_entry(system, entry_id, lambda e: judged(e, iid, agreed))


def errorprobe_findings(findings: dict[str, Any]) -> dict[str, Any] | None:
    """ErrorProbe's findings within an investigation's: its own, or its ensemble member's."""
    if findings.get("method") == "errorprobe":
        return findings
    for member in findings.get("members", ()):
        if member.get("method") == "errorprobe" and member.get("findings"):
            found: dict[str, Any] = member["findings"]
            return found
    return None


def _bounded(ids: tuple[str, ...]) -> tuple[str, ...]:
    return ids[-_KEPT_IDS:]
