"""Pieces every loader builds a case from: region ids, the pinned hazard space, session messages.

Benchmarks carry no timestamps and name their parts freely; the daemon wants ids that match the
spec's identifier pattern and messages with a send time. Doing both in one place keeps every
loader's cases alike, so scores across datasets compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from poirotd.config.spec import AgentSpec, ComponentSpec, PinnedHazardSpace
from poirotd.model import AgentMessage, HazardRegion, MessageKind

# Benchmarks give no send times; messages are spaced one second apart from a fixed instant so
# that a case always loads to the same bytes.
SESSION_START = datetime(2025, 1, 1, tzinfo=UTC)

_NOT_ID = re.compile(r"[^a-z0-9]+")
_MAX_ID = 64


def region_ids(names: Iterable[str]) -> dict[str, str]:
    """Map each name to a distinct id matching ``^[a-z][a-z0-9_]{0,63}$``.

    Lower-cased, each run of characters other than letters and digits becomes one ``_``
    ("C++_Expert" -> "c_expert"); an id not starting with a letter gets an ``r_`` prefix; a
    clash gets ``_2``, ``_3``... in input order.
    """
    ids: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        if name in ids:
            continue
        base = _NOT_ID.sub("_", name.lower()).strip("_") or "region"
        if not base[0].isalpha():
            base = f"r_{base}"
        base = base[:_MAX_ID]
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            suffix = f"_{n}"
            candidate = base[: _MAX_ID - len(suffix)] + suffix
        ids[name] = candidate
        taken.add(candidate)
    return ids


def pinned_space(
    agents: Sequence[AgentSpec],
    agent_descriptions: Sequence[str],
    components: Sequence[ComponentSpec],
) -> PinnedHazardSpace:
    """The space the dataset's answers are given in: agents in spec order, then components."""
    regions = [
        HazardRegion(id=a.id, name=a.name, type="agent", description=d)
        for a, d in zip(agents, agent_descriptions, strict=True)
    ]
    regions += [
        HazardRegion(id=c.id, name=c.name, type=c.type, description=c.description)
        for c in components
    ]
    return PinnedHazardSpace(regions=tuple(regions))


def message(
    case_id: str,
    index: int,
    kind: MessageKind,
    sender: str,
    content: str,
    *,
    recipient: str = "",
    tool_calls: Sequence[str] = (),
    tool_name: str = "",
) -> AgentMessage:
    """One session message of a case; the case id is the session id."""
    return AgentMessage(
        session_id=case_id,
        index=index,
        kind=kind,
        sender=sender,
        recipient=recipient,
        content=content,
        tool_calls=tuple(tool_calls),
        tool_name=tool_name,
        sent_at=SESSION_START + timedelta(seconds=index),
    )
