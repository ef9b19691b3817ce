"""Agent messages over MQTT: the payload schema and its decoding. Pure; no I/O.

Agents of a robot or an exoskeleton controller that talk over MQTT publish one JSON object per
message on their topics (e.g. ``mas/doctor/out``); a ``MessageTopic`` of the input's config
subscribes to them (``mas/+/out``) and may name the sender by a topic level (``{w1}``) and the
session. The payload, UTF-8 JSON, every field optional but one naming the sender somewhere:

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
``DecodeError`` naming what is wrong, which the input dead-letters.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

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
    the filter's wildcards, or "") and the session ("": the input's)."""

    filter: TopicFilter
    sender: Template
    session_id: str

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
            raise DecodeError(f"sender {body.sender!r} is not the topic's sender {named!r}")
        sender = body.sender or named
        if not sender:
            raise DecodeError("no sender: neither the payload nor the topic names one")
        session = body.session or self.session_id or default_session
        if not session:
            raise DecodeError("no session: neither the payload nor the topic names one")
        message = AgentMessage(
            session_id=session,
            index=body.index or 0,
            kind=body.kind,
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
