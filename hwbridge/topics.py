"""Topic routing: MQTT filters with wildcards, and name templates filled from what they matched.

Kept free of any MQTT client so the same routes serve TCP feeds and tests, and so matching obeys
the MQTT 3.1.1 rules (section 4.7) rather than one client library's reading of them.
"""

from __future__ import annotations

import functools
import string
from typing import Generic, Protocol, TypeVar

from hwbridge.codecs import Codec, DecodeError
from poirotd.model import ItemKey, producer_problem, scoped_producer

# Distinct (field, topic, captures) a route remembers its names for, and topics a router
# remembers its route for.
_RENDER_CACHE = 4096


class TopicFilter:
    """An MQTT topic filter; ``match`` returns the levels its wildcards matched, or None."""

    def __init__(self, text: str) -> None:
        levels = text.split("/")
        if not text or any(
            ("#" in level and (level != "#" or i != len(levels) - 1))
            or ("+" in level and level != "+")
            for i, level in enumerate(levels)
        ):
            raise ValueError(
                f"invalid MQTT topic filter {text!r}: '+' must fill a whole level and '#' "
                "must be the whole last level"
            )
        self.text = text
        self._levels = levels
        self.wildcards = sum(level in ("+", "#") for level in levels)

    def match(self, topic: str) -> tuple[str, ...] | None:
        levels = topic.split("/")
        # Wildcards in the first level never match topics of the broker's own $-space.
        if topic.startswith("$") and self._levels[0] in ("+", "#"):
            return None
        captures: list[str] = []
        for i, pattern in enumerate(self._levels):
            if pattern == "#":
                # "a/#" also matches "a" itself (the parent level), capturing "".
                captures.append("/".join(levels[i:]))
                return tuple(captures)
            if i >= len(levels):
                return None
            if pattern == "+":
                captures.append(levels[i])
            elif pattern != levels[i]:
                return None
        return tuple(captures) if len(levels) == len(self._levels) else None


class Template:
    """``{w1}``..``{wN}`` (wildcard captures), ``{field}`` and ``{topic}``; nothing else."""

    def __init__(self, text: str, wildcards: int) -> None:
        allowed = {"field", "topic", *(f"w{i}" for i in range(1, wildcards + 1))}
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        except ValueError as exc:
            raise ValueError(f"invalid template {text!r}: {exc}") from exc
        unknown = sorted(set(names) - allowed)
        if unknown:
            raise ValueError(f"template {text!r} uses {unknown}; allowed here: {sorted(allowed)}")
        self.text = text

    def render(self, field: str, topic: str, captures: tuple[str, ...]) -> str:
        values = {f"w{i}": capture for i, capture in enumerate(captures, start=1)}
        return self.text.format_map({"field": field, "topic": topic, **values})


class Route:
    """Where a topic's readings go: the component and signal names, and how to decode it."""

    def __init__(self, topic_filter: TopicFilter, component: str, signal: str, codec: Codec):
        self.filter = topic_filter
        self.component = Template(component, topic_filter.wildcards)
        self.signal = Template(signal, topic_filter.wildcards)
        self.codec = codec
        # Looked up once per reading, from few distinct inputs: one cache for both names.
        self.names = functools.lru_cache(maxsize=_RENDER_CACHE)(self._names)

    def _names(self, field: str, topic: str, captures: tuple[str, ...]) -> tuple[str, str]:
        """(component, signal) for a reading of `field` on `topic`."""
        return (
            self.component.render(field, topic, captures),
            self.signal.render(field, topic, captures),
        )


class Filtered(Protocol):
    """A route of any kind: telemetry (Route) or agent messages (messages.MessageRoute)."""

    @property
    def filter(self) -> TopicFilter: ...


RouteT = TypeVar("RouteT", bound=Filtered)


class Router(Generic[RouteT]):
    """First matching route wins, in configuration order."""

    def __init__(self, routes: list[RouteT]) -> None:
        self.routes = routes
        # Resolved once per delivery, from few distinct topics.
        self.resolve = functools.lru_cache(maxsize=_RENDER_CACHE)(self._resolve)

    def _resolve(self, topic: str) -> tuple[RouteT, tuple[str, ...]] | None:
        for route in self.routes:
            captures = route.filter.match(topic)
            if captures is not None:
                return route, captures
        return None


def topic_key(topic: str, producer: str, seq: int, transport: str = "mqtt") -> ItemKey:
    """A payload's key, scoped by the topic it came on (or the TCP feed's name, transport
    "tcp"): its `producer` ("": the topic's one) is one of that topic's. DecodeError when the
    name with its topic is longer than a transport takes."""
    key = ItemKey(scoped_producer(f"{transport}:{topic}", producer), seq)
    if problem := producer_problem(key.producer):
        raise DecodeError(f"the producer's name with its topic: {problem}")
    return key
