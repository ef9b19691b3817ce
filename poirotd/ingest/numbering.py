"""Numbers the messages whose producers leave their index to the daemon: OTLP spans, agent
messages over MQTT, native messages sent with `assign_index`.

One count per daemon (the pipeline's), so two transports writing one session never collide. A
session's count starts after the highest index the store has for it (read once, then kept: as
many entries as the store has sessions, for the daemon's life) and moves past every index a
producer chose that the pipeline admitted (`observe`), so the daemon never hands out an index a
producer already used. The other way round stays the producer's contract: a producer that
chooses an index the daemon has already assigned sends, by the wire's rule that (session,
index) is unique, a resend of that message. A message is numbered before the pipeline checks
it: one it refuses (and, on the native stream, those after it in the request the refusal ends)
leaves its index unused; indexes order a session, they need not be contiguous.

With replicas (a shared store) a count per daemon would hand two replicas the same index: the
count is the store's (`Store.reserve_message_indexes`). `learn` reserves, per session, as many
indexes as it is told messages will be numbered, at or above every index this daemon saw a
producer choose and those chosen in the same request, and past every index stored by any replica;
`take` hands them out. Across replicas, a session's daemon-assigned indexes follow the order of
the reservations, not of the messages' arrival; an index a producer chose at another replica is
numbered past once stored (one still in flight there can collide, as within one daemon an index
a producer chooses after the daemon assigned it does).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from poirotd.store import Store


class SessionIndexes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._next: dict[str, int] = {}
        self._learnt: set[str] = set()
        # A shared store's reservations not handed out yet, per session: [next, end) ranges.
        self._reserved: dict[str, deque[list[int]]] = {}

    async def learn(self, sessions: Iterable[str], chosen: Iterable[tuple[str, int]] = ()) -> None:
        """Call before `take`, with the session of each message to number and the (session,
        index) of the messages of the same request whose producer chose the index. Alone on
        the store: reads where each session not read yet stands in it. With replicas: reserves
        the indexes to take."""
        if self._store.shared:
            await self._reserve(Counter(sessions), chosen)
            return
        for session_id in set(sessions) - self._learnt:
            after = 0
            if await self._store.find_session(session_id):
                stored = await self._store.session_messages(session_id)
                after = max((m.index + 1 for m in stored), default=0)
            # Another producer may have moved it while this one read the store.
            self._next[session_id] = max(self._next.get(session_id, 0), after)
            self._learnt.add(session_id)

    async def _reserve(self, counts: Counter[str], chosen: Iterable[tuple[str, int]]) -> None:
        floors = {session_id: self._next.get(session_id, 0) for session_id in counts}
        for session_id, index in chosen:
            if session_id in floors:
                floors[session_id] = max(floors[session_id], index + 1)
        for session_id, count in counts.items():
            first = await self._store.reserve_message_indexes(
                session_id, count, floor=floors[session_id]
            )
            ranges = self._reserved.setdefault(session_id, deque())
            ranges.append([first, first + count])

    def observe(self, session_id: str, index: int) -> None:
        """An admitted message's index: the session's count (with replicas, the floor of its
        next reservation) moves past it."""
        if index >= self._next.get(session_id, 0):
            self._next[session_id] = index + 1

    def take(self, session_id: str) -> int:
        """The session's next index, counted as used."""
        if self._store.shared:
            return self._take_reserved(session_id)
        index = self._next[session_id]
        self._next[session_id] = index + 1
        return index

    def _take_reserved(self, session_id: str) -> int:
        ranges = self._reserved.get(session_id)
        if not ranges:
            raise RuntimeError(f"session {session_id!r}: an index taken that was not learnt")
        span = ranges[0]
        index = span[0]
        span[0] += 1
        if span[0] == span[1]:
            ranges.popleft()
            if not ranges:
                del self._reserved[session_id]
        self.observe(session_id, index)
        return index
