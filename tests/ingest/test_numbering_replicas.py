"""Daemon-assigned message indexes with two replicas on one PostgreSQL store: each replica's
`SessionIndexes` reserves its indexes in the store, so the two never hand out the same one, and
both number past what a producer chose, in the same request or stored by the other replica."""

from __future__ import annotations

import asyncio

from poirotd.ingest.numbering import SessionIndexes
from poirotd.store import PostgresStore
from tests.support.store import message, session


async def test_two_replicas_never_assign_the_same_index(postgres_url: str) -> None:
    a = await PostgresStore.open(postgres_url, where="a")
    b = await PostgresStore.open(postgres_url, where="b")
    try:
        await a.commit_ingest([session(), message(0), message(3)])
        left, right = SessionIndexes(a), SessionIndexes(b)

        async def number(indexes: SessionIndexes, requests: int) -> list[int]:
            taken = []
            for _ in range(requests):
                await indexes.learn(["s1"] * 4)
                taken += [indexes.take("s1") for _ in range(4)]
                await asyncio.sleep(0)
            return taken

        got_left, got_right = await asyncio.gather(number(left, 25), number(right, 25))
        taken = got_left + got_right
        assert len(set(taken)) == len(taken) == 200
        assert min(taken) == 4  # past the stored index 3
        assert got_left == sorted(got_left) and got_right == sorted(got_right)

        # A producer's own index in the same request is numbered past, before it is stored...
        await left.learn(["s1"], chosen=[("s1", 1000)])
        assert left.take("s1") == 1001
        # ...and one another replica stored is too.
        await b.commit_ingest([message(2000)])
        await left.learn(["s1"])
        assert left.take("s1") == 2001
    finally:
        await a.close()
        await b.close()
