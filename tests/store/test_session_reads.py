"""What an operator reads of the stored sessions (`list_sessions`, `session_summary`) and the
method filter of `list_investigations`, on both adapters (`store_db`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta, timezone

import pytest

from poirotd.model import InvestigationState, SessionEnd
from poirotd.store import SessionSummary, Store
from tests.support.store import T0, investigation, message, session
from tests.support.stores import StoreDb

NEW_YORK = timezone(timedelta(hours=-5))


@pytest.fixture
async def store(store_db: StoreDb) -> AsyncIterator[Store]:
    s = await store_db.open()
    yield s
    await s.close()


async def all_pages(store: Store, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page, token = await store.list_sessions(limit=limit, page_token=token)
        pages.append([summary.session.session_id for summary in page])
        if token is None:
            return pages


async def test_sessions_list_newest_started_first_whatever_the_offset_or_fraction(
    store: Store,
) -> None:
    """As text, 07:00-05:00 sorts before 12:00Z and 12:00:00Z after 12:00:00.5Z: the order is
    by the instant, the id breaking ties, and pages neither skip nor repeat."""
    starts = {
        "a": T0,
        "b": T0.replace(microsecond=0) + timedelta(seconds=1),  # 12:00:01Z, no fraction
        "c": (T0 + timedelta(hours=1)).astimezone(NEW_YORK),  # 08:00:00.123456-05:00
        "d": T0 + timedelta(milliseconds=500),  # 12:00:00.623456Z
        "e": T0 + timedelta(milliseconds=500),  # same instant as d
    }
    for sid, at in starts.items():
        await store.commit_ingest([session(sid, started_at=at)])
    assert await all_pages(store, 2) == [["c", "b"], ["e", "d"], ["a"]]
    assert await all_pages(store, 50) == [["c", "b", "e", "d", "a"]]


async def test_a_summary_counts_messages_of_every_commit_and_the_investigations(
    store: Store,
) -> None:
    end = T0 + timedelta(minutes=5)
    await store.commit_ingest([session("s1", labels={"ward": "3"}), message(0), message(1)])
    await store.commit_ingest([message(2), message(1)])  # a resent message is stored once
    await store.commit_ingest([session("s2")])
    await store.commit_ingest([SessionEnd(session_id="s1", ended_at=end)])
    for n in range(3):
        await store.save_investigation(investigation(f"i{n}", sid="s1"))

    summary = await store.session_summary("s1")
    assert summary is not None
    assert (summary.messages, summary.investigations) == (3, 3)
    assert summary.session.ended_at == end and summary.session.labels == {"ward": "3"}
    assert await store.session_summary("nope") is None
    listed, _ = await store.list_sessions()
    assert {s.session.session_id: (s.messages, s.investigations) for s in listed} == {
        "s1": (3, 3),
        "s2": (0, 0),
    }
    assert isinstance(listed[0], SessionSummary)


async def test_a_page_token_carries_the_longest_session_id(store: Store) -> None:
    long_ids = ["\U0001f9e0" * 256, "z" * 256]
    for sid in long_ids:
        await store.commit_ingest([session(sid)])
    first, token = await store.list_sessions(limit=1)
    assert token is not None
    rest, last = await store.list_sessions(limit=1, page_token=token)
    assert {first[0].session.session_id, rest[0].session.session_id} == set(long_ids)
    assert last is None
    with pytest.raises(ValueError, match="invalid page token"):
        await store.list_sessions(page_token="garbage")


async def test_investigations_list_by_method(store: Store) -> None:
    await store.save_investigation(investigation("p1"))
    await store.save_investigation(
        investigation("b1", created_at=T0 + timedelta(seconds=1)).model_copy(
            update={"method": "baseline"}
        )
    )
    by_baseline, _ = await store.list_investigations(method="baseline")
    assert [i.investigation_id for i in by_baseline] == ["b1"]
    by_poirot, _ = await store.list_investigations(method="poirot", state=InvestigationState.QUEUED)
    assert [i.investigation_id for i in by_poirot] == ["p1"]
    assert (await store.list_investigations(method="echo"))[0] == []
