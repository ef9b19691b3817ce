"""Numbers the messages whose producers leave their index to the daemon: OTLP spans, agent
messages over MQTT, native messages sent with `assign_index`.

One count per daemon (the pipeline's), so two doors writing one session never collide. A
session's count starts after the highest index the store has for it (read once, then kept: as
many entries as the store has sessions, for the daemon's life). A session is numbered by the
daemon or by its producer, not both, or indexes may collide (and a colliding message is taken
for a resend of the first). A message is numbered before the pipeline checks it: one it refuses
(and, on the native stream, those after it in the request the refusal ends) leaves its index
unused; indexes order a session, they need not be contiguous.
"""

from __future__ import annotations

from collections.abc import Iterable

from poirotd.store import Store


class SessionIndexes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._next: dict[str, int] = {}

    async def learn(self, sessions: Iterable[str]) -> None:
        """Reads where each session not counted yet stands; call before `take`."""
        for session_id in set(sessions) - self._next.keys():
            after = 0
            if self._store.has_session(session_id):
                stored = await self._store.session_messages(session_id)
                after = max((m.index + 1 for m in stored), default=0)
            # Another producer may have learnt it while this one read the store.
            self._next.setdefault(session_id, after)

    def take(self, session_id: str) -> int:
        """The session's next index, counted as used."""
        index = self._next[session_id]
        self._next[session_id] = index + 1
        return index
