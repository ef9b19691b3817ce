"""Where an attribution's span goes among the session's traces. Pure (no I/O): the exporter reads
the session and its messages, this decides.

A session whose messages came over OTLP (the receiver started it: label input=otlp) has its
trace in the same backend the attribution goes to, so the span joins it, as a child of the span
it evaluates: the span of the message where the fault first shows (the attribution's step), else
the span of the session's last message, the incident's end (the GenAI conventions parent an
evaluation on the operation it evaluates). The session's other traces (one per conversation
turn, say) are linked. A session whose messages came another way starts a trace of its own, with
links to the spans its messages name, if any (a gRPC producer may give them): poirotd never
writes into a trace it did not receive.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poirotd.model import AgentMessage

# Links one span carries at most: the SDK's default limit (a session of thousands of turns
# still gives one bounded span).
MAX_LINKS = 128
_TRACE_ID_HEX = 32
_SPAN_ID_HEX = 16
# What a link is to, as its `poirot.link.reason` attribute.
EVALUATED = "evaluated_span"
SESSION_TRACE = "session_trace"


@dataclass(frozen=True)
class SpanRef:
    trace_id: bytes
    span_id: bytes


@dataclass(frozen=True)
class Link:
    to: SpanRef
    reason: str


@dataclass(frozen=True)
class Placement:
    trace_id: bytes
    # The span evaluated, as the parent (b"": a root span, in a trace of its own).
    parent_span_id: bytes
    links: tuple[Link, ...]

    @property
    def in_session_trace(self) -> bool:
        return bool(self.parent_span_id)


def place(
    labels: Mapping[str, str], messages: Sequence[AgentMessage], step: int | None
) -> Placement:
    """The placement of the attribution of a session with these labels and messages (in index
    order); `step`: the attribution's session index where the fault first shows, if any."""
    spans = [ref for m in messages if (ref := _span_of(m)) is not None]
    at_step = next((m for m in messages if m.index == step), None) if step is not None else None
    evaluated = (_span_of(at_step) if at_step is not None else None) or (
        spans[-1] if spans else None
    )
    # The latest span of each trace, the evaluated span's own trace first.
    latest: dict[bytes, SpanRef] = {}
    for ref in reversed(spans):
        latest.setdefault(ref.trace_id, ref)
    if evaluated is not None and labels.get("input") == "otlp":
        others = [ref for trace, ref in latest.items() if trace != evaluated.trace_id]
        links = tuple(Link(ref, SESSION_TRACE) for ref in others[:MAX_LINKS])
        return Placement(evaluated.trace_id, evaluated.span_id, links)
    refs: list[Link] = []
    if evaluated is not None:
        refs.append(Link(evaluated, EVALUATED))
        refs += [
            Link(ref, SESSION_TRACE) for trace, ref in latest.items() if trace != evaluated.trace_id
        ]
    return Placement(new_trace_id(), b"", tuple(refs[:MAX_LINKS]))


def new_trace_id() -> bytes:
    return secrets.token_bytes(16)


def new_span_id() -> bytes:
    return secrets.token_bytes(8)


def _span_of(message: AgentMessage) -> SpanRef | None:
    """The span a message names, if it names a valid one (16 and 8 bytes, not all zeros)."""
    trace, span = message.trace_id, message.span_id
    if len(trace) != _TRACE_ID_HEX or len(span) != _SPAN_ID_HEX:
        return None
    try:
        ref = SpanRef(bytes.fromhex(trace), bytes.fromhex(span))
    except ValueError:
        return None
    if not any(ref.trace_id) or not any(ref.span_id):
        return None
    return ref
