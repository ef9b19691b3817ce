"""Numbers the messages whose producers leave their index to the daemon: OTLP spans, agent
messages over MQTT, native messages sent with `assign_index`.

One count per daemon (the pipeline's), so two doors writing one session never collide. A
session's count starts after the highest index the store has for it (read once, then kept: as
many entries as the store has sessions, for the daemon's life) and moves past every index a
producer chose that the pipeline admitted (`observe`), so the daemon never hands out an index a
producer already used. The other way round stays the producer's contract: a producer that
chooses an index the daemon has already assigned sends, by the wire's rule that (session,
index) is unique, a resend of that message. A message is numbered before the pipeline checks
it: one it refuses (and, on the native stream, those after it in the request the refusal ends)
leaves its index unused; indexes order a session, they need not be contiguous.
"""

from __future__ import annotations

from collections.abc import Iterable

from poirotd.store import Store


class SessionIndexes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._next: dict[str, int] = {}
        self._learnt: set[str] = set()

    async def learn(self, sessions: Iterable[str]) -> None:
        """Reads where each session not read yet stands in the store; call before `take`."""
        for session_id in set(sessions) - self._learnt:
            after = 0
            if await self._store.find_session(session_id):
                stored = await self._store.session_messages(session_id)
                after = max((m.index + 1 for m in stored), default=0)
            # Another producer may have moved it while this one read the store.
            self._next[session_id] = max(self._next.get(session_id, 0), after)
            self._learnt.add(session_id)

    def observe(self, session_id: str, index: int) -> None:
        """An admitted message's index: the session's count moves past it."""
        if index >= self._next.get(session_id, 0):
            self._next[session_id] = index + 1

    def take(self, session_id: str) -> int:
        """The session's next index, counted as used."""
        index = self._next[session_id]
        self._next[session_id] = index + 1
        return index
