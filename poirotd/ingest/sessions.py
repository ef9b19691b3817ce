"""Sessions the transports start implicitly: OTLP spans and agent messages over MQTT name sessions
that no producer started. A message of a session the store does not have is preceded by the
session's start (at the message's time, labelled with the input) in the same batch.
"""

from __future__ import annotations

from datetime import datetime

from poirotd.model import Session
from poirotd.store import Store


class ImplicitSessions:
    def __init__(self, store: Store, system: str, input_name: str) -> None:
        self._store = store
        self._system = system
        self._input = input_name

    def start(
        self, handled: set[str], session_id: str, at: datetime, trace_id: str = ""
    ) -> Session | None:
        """The start to send before a message of `session_id`, unless the batch (`handled`:
        the sessions it met so far) or the store has it. Until its start is stored, every batch
        starts the session again (a no-op once stored): an earlier batch's start may still wait
        for its commit, or have failed."""
        if session_id in handled:
            return None
        handled.add(session_id)
        if self._store.has_session(session_id):
            return None
        labels = {"input": self._input, **({"trace_id": trace_id} if trace_id else {})}
        return Session(session_id=session_id, system=self._system, started_at=at, labels=labels)
