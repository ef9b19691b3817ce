"""Symptom-driven backward tracing: the session pruned to the causal chain of the failure.

Messages are the nodes of a dependency graph whose edges carry information forward. Message j
depends on an earlier message i when
- j is a tool's result and i made the call (it names the tool);
- i is the latest message delivered to j's sender before j (addressed to it, or broadcast by
  someone else): what j answers;
- i is j's sender's own previous message (an agent carries its state forward);
- j repeats a rare token of i (a number, a file name, an identifier seen in at most
  RARE_IN messages): j cites i's output.
From the seeds (the symptom, the session's last message, then every step a MAST tag flagged)
a breadth-first walk over incoming edges collects the messages that could have influenced them,
nearest first, up to a bound; the rest (parallel branches that never reached the symptom) is
masked. Pure functions.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from poirotd.model import AgentMessage, MessageKind

# A token cited from at most this many messages links them; commoner ones link nothing.
RARE_IN = 3
# Numbers of 3+ characters, dotted or underscored names, paths: what one message hands another.
_DISTINCT = re.compile(r"\b(?:\d[\d.,:]+\d|\w*[_./]\w+(?:[_./]\w+)*|\w*\d\w*[a-zA-Z]\w*)\b")


@dataclass(frozen=True)
class CausalChain:
    """The messages kept (session indices, in session order), where the walk started, and the
    edges it followed (dependent index, influence index)."""

    kept: tuple[int, ...]
    seeds: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]
    masked: int


def dependencies(messages: Sequence[AgentMessage]) -> dict[int, set[int]]:
    """For each message (by position), the positions of the earlier messages it depends on."""
    tokens = [set(_DISTINCT.findall(m.content)) for m in messages]
    holders: dict[str, list[int]] = {}
    for position, found in enumerate(tokens):
        for token in found:
            holders.setdefault(token, []).append(position)
    rare = {t for t, where in holders.items() if len(where) <= RARE_IN}
    graph: dict[int, set[int]] = {}
    for j, m in enumerate(messages):
        earlier = range(j - 1, -1, -1)
        influences = set()
        if m.kind is MessageKind.TOOL:
            caller = _first(i for i in earlier if _calls(messages[i], m.tool_name))
            if caller is not None:
                influences.add(caller)
        elif m.kind in (MessageKind.AGENT, MessageKind.HUMAN):
            answered = _first(i for i in earlier if _delivered_to(messages[i], m.sender))
            own = _first(i for i in earlier if messages[i].sender == m.sender)
            influences |= {i for i in (answered, own) if i is not None}
        for token in tokens[j] & rare:
            influences |= {i for i in holders[token] if i < j}
        graph[j] = influences
    return graph


def backward_trace(
    messages: Sequence[AgentMessage], tagged: Iterable[int], limit: int
) -> CausalChain:
    """The causal chain of the session's last message and the `tagged` session indices, at
    most `limit` messages (the seeds first, then by distance from them)."""
    if not messages:
        return CausalChain((), (), (), 0)
    position = {m.index: p for p, m in enumerate(messages)}
    seeds = [len(messages) - 1]
    seeds += sorted({position[i] for i in tagged if i in position} - {len(messages) - 1})
    graph = dependencies(messages)
    kept: list[int] = []
    edges: list[tuple[int, int]] = []
    queue = deque(seeds)
    seen = set(seeds)
    while queue and len(kept) < limit:
        node = queue.popleft()
        kept.append(node)
        for influence in sorted(graph[node], reverse=True):
            edges.append((messages[node].index, messages[influence].index))
            if influence not in seen:
                seen.add(influence)
                queue.append(influence)
    ordered = sorted(kept)
    indices = {messages[p].index for p in ordered}
    return CausalChain(
        kept=tuple(messages[p].index for p in ordered),
        seeds=tuple(messages[p].index for p in seeds[:limit]),
        edges=tuple((j, i) for j, i in edges if i in indices and j in indices),
        masked=len(messages) - len(ordered),
    )


def _calls(m: AgentMessage, tool: str) -> bool:
    """Whether `m` called `tool` (any tool, when the result does not name one)."""
    return bool(m.tool_calls) and (not tool or tool in m.tool_calls)


def _delivered_to(m: AgentMessage, agent: str) -> bool:
    return m.recipient == agent or (not m.recipient and m.sender != agent)


def _first(positions: Iterable[int]) -> int | None:
    return next(iter(positions), None)
