"""Agent messages over MQTT: the payload schema and its decoding. Pure; no I/O.

Agents of a robot or an exoskeleton controller that talk over MQTT publish one JSON object per
message on their topics (e.g. ``mas/doctor/out``); a ``MessageTopic`` of the input's config
subscribes to them (``mas/+/out``) and may name the sender by a topic level (``{w1}``) and the
session, and pin what a payload may not choose (`PinnedFields`). The payload, UTF-8 JSON, every
field optional but one naming the sender somewhere:

    {"session": "run-42",          # else the topic's session_id, else the input's session
     "index": 3,                   # its place in the session; without it the daemon numbers it
     "sender": "doctor",           # else the topic's sender; both given, they must agree
     "recipient": "chief",
     "kind": "agent",              # agent (default), human, system or tool
     "content": "The offset is noise; proceed.",
     "tool_calls": ["gait_test({\"side\":\"left\"})"],
     "tool_name": "gait_test",     # a tool message's tool
     "sent_at": "2026-01-05T09:00:00Z",   # ISO-8601 or Unix seconds; else when received
     "seq": 17,                    # the producer's idempotency key: a copy is stored once
     "producer": "doctor-7f3a"}    # who numbers `seq` on this topic; new on a count restart

The key is the topic's: a payload's `producer` names one of the topic's producers, never one of
another topic (`poirotd.model.scoped_producer`: ``mqtt:<topic>|<producer>``), so a payload on
the doctor's topic cannot hold a key of the chief's and have the chief's message dropped.

Anything else (not JSON, an unknown field, a wrong type, no sender or session) is a
``DecodeError`` naming what is wrong, which the input dead-letters; a payload choosing what its
route decides (another sender, or a pinned session, kind or index) is a ``RouteRefusedError``,
one of them, counted by the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwbridge.codecs import MAX_SEQ, DecodeError
from hwbridge.topics import Template, TopicFilter, topic_key
from poirotd.model import (
    MAX_PRODUCER_CHARS,
    AgentMessage,
    ItemKey,
    MessageKind,
    producer_problem,
)

# The fields a route may decide for its payloads (a metric label, with `sender`).
PINNABLE = ("session", "kind", "index", "sender")


class RouteRefusedError(DecodeError):
    """The payload chose what its route decides; `field` is which (one of PINNABLE)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PinnedFields(BaseModel):
    """What a route decides and a payload may not choose: a payload naming another value is
    refused (dead-lettered, counted by field), so a publisher on the route's topics cannot write
    into another session, pass for a human, or take an index another producer's message needs.
    The sender is pinned by the route's ``sender`` (a payload naming another is refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The route's session (its session_id, else the input's); a payload may repeat it.
    session: bool = False
    # The kind of every message; a payload may repeat it.
    kind: MessageKind | None = None
    # "daemon": the daemon numbers every message, a payload giving an index is refused;
    # "payload": a payload may give its index (then the producer must not take an index another
    # holds: a message of other content at that index is set aside as a conflict, not stored).
    index: Literal["payload", "daemon"] = "payload"


class MessagePayload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    session: str = ""
    index: int | None = Field(default=None, ge=0)
    sender: str = ""
    recipient: str = ""
    kind: MessageKind = MessageKind.AGENT
    content: str = ""
    tool_calls: tuple[str, ...] = ()
    tool_name: str = ""
    sent_at: datetime | None = None
    seq: int | None = Field(default=None, ge=1, le=MAX_SEQ)
    producer: str = Field(default="", max_length=MAX_PRODUCER_CHARS)


class ReceivedMessage(NamedTuple):
    message: AgentMessage  # index 0 when the daemon is to number it
    numbered: bool  # the payload gave its index
    payload: bytes  # as received, for a dead letter
    key: ItemKey | None = None  # the producer's idempotency key, if the payload has one


@dataclass(frozen=True)
class MessageRoute:
    """Where a topic's messages go when their payload does not say: the sender (a template of
    the filter's wildcards, or "") and the session ("": the input's); and what a payload may not
    choose (`pin`)."""

    filter: TopicFilter
    sender: Template
    session_id: str
    pin: PinnedFields

    def decode(
        self,
        payload: bytes,
        topic: str,
        captures: tuple[str, ...],
        received_at: datetime,
        default_session: str,
    ) -> ReceivedMessage:
        try:
            body = MessagePayload.model_validate_json(payload)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            raise DecodeError(f"not an agent message: {problems}") from None
        named = self.sender.render("", topic, captures)
        if body.sender and named and body.sender != named:
            raise RouteRefusedError(
                "sender", f"sender {body.sender!r} is not the topic's sender {named!r}"
            )
        sender = body.sender or named
        if not sender:
            raise DecodeError("no sender: neither the payload nor the topic names one")
        session = self._session(body, default_session)
        kind = self._kind(body)
        if body.index is not None and self.pin.index == "daemon":
            raise RouteRefusedError(
                "index", "index: this route's messages are numbered by the daemon"
            )
        message = AgentMessage(
            session_id=session,
            index=body.index or 0,
            kind=kind,
            sender=sender,
            recipient=body.recipient,
            content=body.content,
            tool_calls=body.tool_calls,
            tool_name=body.tool_name,
            sent_at=body.sent_at or received_at,
        )
        key = None
        if body.seq is not None:
            if problem := producer_problem(body.producer):
                raise DecodeError(problem)
            key = topic_key(topic, body.producer, body.seq)
        elif body.producer:
            raise DecodeError("producer needs seq")
        return ReceivedMessage(message, body.index is not None, payload, key)

    def _session(self, body: MessagePayload, default_session: str) -> str:
        routes = self.session_id or default_session
        if self.pin.session and body.session and body.session != routes:
            raise RouteRefusedError(
                "session", f"session {body.session!r}: this route's session is {routes!r}"
            )
        session = body.session or routes
        if not session:
            raise DecodeError("no session: neither the payload nor the topic names one")
        return session

    def _kind(self, body: MessagePayload) -> MessageKind:
        pinned = self.pin.kind
        if pinned is None:
            return body.kind
        if "kind" in body.model_fields_set and body.kind != pinned:
            raise RouteRefusedError(
                "kind", f"kind {body.kind.value!r}: this route's messages are {pinned.value!r}"
            )
        return pinned
