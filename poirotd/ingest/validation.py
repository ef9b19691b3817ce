"""Checks each ingested item against the system spec before it is stored.

One validator per client stream: it remembers the stream's last seq and the sessions the stream
opened that may not be committed yet, so a session start and its first messages can share a batch.
"""

from __future__ import annotations

import math

from poirotd.config import SystemSpec
from poirotd.errors import InvalidArgument, NotFound, ResourceExhausted
from poirotd.model import AgentMessage, IngestItem, MessageKind, Session, TelemetrySample
from poirotd.store import Store


class IngestValidator:
    def __init__(self, spec: SystemSpec, store: Store, *, max_item_bytes: int) -> None:
        self._spec = spec
        self._store = store
        self.max_item_bytes = max_item_bytes
        self._agents = frozenset(spec.agent_ids)
        self._parties = self._agents | {c.id for c in spec.components}
        self._last_seq = 0
        self._opened: set[str] = set()

    def check(self, seq: int, item: IngestItem, size_bytes: int) -> None:
        """Raises a ServiceError naming the item's seq and what is wrong with it. `size_bytes` is
        the item's size, or a bound on it within the limit (the size of its batch)."""
        if seq <= self._last_seq:
            raise InvalidArgument(
                f"seq {seq}: seq must increase within a stream (last was {self._last_seq})",
                reason="invalid",
            )
        if size_bytes > self.max_item_bytes:
            raise ResourceExhausted(
                f"seq {seq}: item is {size_bytes} bytes, the limit is {self.max_item_bytes}",
                reason="oversized",
            )
        if not item.session_id:
            raise InvalidArgument(f"seq {seq}: session_id is empty", reason="invalid")
        if isinstance(item, Session):
            self._check_session(seq, item)
        else:
            self._check_known_session(seq, item.session_id)
            if isinstance(item, AgentMessage):
                self._check_message(seq, item)
            elif isinstance(item, TelemetrySample):
                self._check_telemetry(seq, item)
        self._last_seq = seq

    def _check_session(self, seq: int, session: Session) -> None:
        if session.system != self._spec.system.name:
            raise InvalidArgument(
                f"seq {seq}: session {session.session_id!r} is for system {session.system!r}, "
                f"this daemon monitors {self._spec.system.name!r}",
                reason="unknown_system",
            )
        self._opened.add(session.session_id)

    def _check_known_session(self, seq: int, session_id: str) -> None:
        if session_id not in self._opened and not self._store.has_session(session_id):
            raise NotFound(
                f"seq {seq}: session {session_id!r} is not known; send session_start first",
                reason="unknown_session",
            )

    def _check_message(self, seq: int, message: AgentMessage) -> None:
        if message.kind is MessageKind.AGENT and message.sender not in self._agents:
            raise InvalidArgument(
                f"seq {seq}: sender {message.sender!r} is not an agent of system "
                f"{self._spec.system.name!r} (agents: {', '.join(self._spec.agent_ids)})",
                reason="unknown_agent",
            )
        if message.kind is MessageKind.TOOL:
            if not message.tool_name:
                raise InvalidArgument(
                    f"seq {seq}: a tool message needs tool_name", reason="invalid"
                )
            # Empty recipient: a shared executor's output broadcast to a group chat.
            if message.recipient and message.recipient not in self._agents:
                raise InvalidArgument(
                    f"seq {seq}: tool result recipient {message.recipient!r} is not an agent "
                    f"(agents: {', '.join(self._spec.agent_ids)})",
                    reason="unknown_agent",
                )
        if message.recipient and message.recipient not in self._parties:
            raise InvalidArgument(
                f"seq {seq}: recipient {message.recipient!r} is neither an agent nor a component "
                f"of system {self._spec.system.name!r}",
                reason="unknown_agent",
            )

    def _check_telemetry(self, seq: int, sample: TelemetrySample) -> None:
        if sample.component not in self._parties:
            raise InvalidArgument(
                f"seq {seq}: telemetry component {sample.component!r} is not declared in the spec",
                reason="unknown_component",
            )
        if not sample.signal:
            raise InvalidArgument(f"seq {seq}: telemetry signal is empty", reason="invalid")
        if not math.isfinite(sample.value):
            raise InvalidArgument(
                f"seq {seq}: telemetry value {sample.value} is not a finite number",
                reason="invalid",
            )
