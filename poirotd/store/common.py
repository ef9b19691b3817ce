"""What every store adapter decides alike, apart from its SQL: which sessions a batch needs, how a
commit's messages and samples become blocks, the newest samples of a session from its blocks, how
an admission, an outcome confirmation, the end of a daemon's unfinished work or a memory deletion
changes a record, and the page tokens of `list_investigations`."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import TypeAlias, TypeVar

from pydantic import TypeAdapter

from poirotd.model import (
    MAX_INTEGER,
    AgentMessage,
    CoalescedTrigger,
    CommitItem,
    ConfirmedOutcome,
    DiagnosisMemoryEntry,
    Investigation,
    InvestigationState,
    Reading,
    Session,
    TelemetryBatch,
    TelemetrySample,
    row_of,
)
from poirotd.store.leases import queued_form
from poirotd.store.port import Admission, AlreadyConfirmedError, MemoryUpdate
from poirotd.store.records import MessageBlock, TelemetryBlock, message_row_of, micros

_T = TypeVar("_T")
_Item = TypeVar("_Item", AgentMessage, TelemetrySample)


# ------------------------------------------------------------ ingest


def unknown_sessions(items: Sequence[CommitItem], known: Callable[[str], bool]) -> list[str]:
    """The sessions items refer to that are neither `known` nor started earlier in the batch,
    in the order first met."""
    started: set[str] = set()
    unknown: dict[str, None] = {}
    for item in items:
        if isinstance(item, Session):
            started.add(item.session_id)
        elif item.session_id not in started and not known(item.session_id):
            unknown.setdefault(item.session_id)
    return list(unknown)


def message_blocks(messages: Sequence[AgentMessage]) -> list[MessageBlock]:
    """The messages as one block per session, each in arrival order."""
    # Built from validated messages: constructed, not validated again.
    return [
        MessageBlock.model_construct(session_id=session_id, messages=rows)
        for session_id, rows in _rows_by_session(messages, message_row_of).items()
    ]


def telemetry_blocks(items: Sequence[CommitItem]) -> list[TelemetryBlock]:
    """The samples as one block per session, each in arrival order; a telemetry batch is a
    block of its own (its rows are the block's)."""
    samples = [item for item in items if isinstance(item, TelemetrySample)]
    # Built from validated samples and rows: constructed, not validated again.
    blocks = [
        TelemetryBlock.model_construct(session_id=session_id, samples=rows)
        for session_id, rows in _rows_by_session(samples, row_of).items()
    ]
    blocks += [
        TelemetryBlock.model_construct(session_id=item.session_id, samples=item.rows)
        for item in items
        if isinstance(item, TelemetryBatch) and item.rows
    ]
    return blocks


def _rows_by_session(items: Sequence[_Item], row_of: Callable[[_Item], _T]) -> dict[str, list[_T]]:
    """Each item's row in a block, grouped by session, in arrival order."""
    by_session: dict[str, list[_T]] = {}
    for item in items:
        by_session.setdefault(item.session_id, []).append(row_of(item))
    return by_session


# A sample's place in time, then in arrival order: (measured_us, 0, row id, 0) for a schema-3
# row, which came before every block, and (measured_us, 1, block id, position) in a block.
SampleKey: TypeAlias = tuple[int, int, int, int]


class NewestReadings:
    """The `limit` newest samples of a session, gathered from its blocks read newest first
    (by last_us, then id): a block older than all of the `limit` newest samples so far holds
    none of them, so reading stops there (`wants`). Records are decoded by `json.loads`, not
    validated: the store wrote them from validated samples, and `verify` checks they were not
    altered."""

    def __init__(self, limit: int, older: Iterable[tuple[SampleKey, Reading]] = ()) -> None:
        """`older`: samples stored one per row, before blocks existed."""
        self._limit = limit
        self._newest = list(older)

    def wants(self, block_id: int, last_us: int) -> bool:
        newest, limit = self._newest, self._limit
        if len(newest) < limit:
            return True
        newest.sort(key=itemgetter(0))
        del newest[:-limit]
        return (last_us, 1, block_id) >= newest[0][0][:3]

    def add(self, block_id: int, record: str) -> None:
        for position, (component, signal, value, text) in enumerate(json.loads(record)["samples"]):
            at = datetime.fromisoformat(text)
            key = (micros(at), 1, block_id, position)
            self._newest.append((key, Reading(component, signal, value, at)))

    def oldest_first(self) -> list[Reading]:
        self._newest.sort(key=itemgetter(0))
        return [reading for _, reading in self._newest[-self._limit :]]


# ------------------------------------------------------------ record changes


def confirmation(
    inv: Investigation, outcome: ConfirmedOutcome, supersede: bool
) -> Investigation | None:
    """The record with `outcome` confirmed; None when the same regions were confirmed before.
    Other regions replace an earlier confirmation (kept in `superseded`) only with `supersede`;
    else AlreadyConfirmedError."""
    superseded = inv.superseded
    if inv.confirmed is not None:
        if inv.confirmed.region_ids == outcome.region_ids:
            return None
        if not supersede:
            raise AlreadyConfirmedError(inv.investigation_id, inv.confirmed)
        superseded = (*superseded, inv.confirmed)
    return inv.model_copy(update={"confirmed": outcome, "superseded": superseded})


# The states a worker claims from (a RUNNING one once its lease expired).
CLAIMABLE = (InvestigationState.QUEUED.value, InvestigationState.RUNNING.value)
# The states a new trigger of the session joins rather than opening another investigation.
UNFINISHED = (InvestigationState.DEFERRED.value, *CLAIMABLE)


def open_of_method(unfinished: Iterable[Investigation], method: str) -> Investigation | None:
    """Of a session's unfinished investigations, oldest first, the first by `method`."""
    return next((inv for inv in unfinished if inv.method == method), None)


def admitted(inv: Investigation, admission: Admission) -> Investigation:
    """The new investigation as stored when queued or deferred."""
    state = InvestigationState(admission.value)
    return inv if inv.state is state else inv.model_copy(update={"state": state})


def coalesced(into: Investigation, candidate: Investigation) -> Investigation:
    """`into` with the candidate's trigger joined to it."""
    trigger = candidate.trigger
    return into.joined_by(
        CoalescedTrigger(
            reason=candidate.reason,
            rule=trigger.rule if trigger is not None else "",
            at=trigger.at if trigger is not None else candidate.created_at,
            state=into.state,
            requested_by=candidate.requested_by,
        )
    )


_COALESCED = TypeAdapter(tuple[CoalescedTrigger, ...])


def with_stored_coalesced(inv: Investigation, stored: str | None, omitted: object) -> Investigation:
    """A run's copy of the record with the coalesced triggers the store holds (`stored`: their
    JSON array, None when there are none; `omitted`: the stored count beyond them)."""
    joined = _COALESCED.validate_json(stored) if stored else ()
    beyond = int(str(omitted)) if omitted is not None else 0
    if (joined, beyond) == (inv.coalesced, inv.coalesced_omitted):
        return inv
    return inv.model_copy(update={"coalesced": joined, "coalesced_omitted": beyond})


def settled(inv: Investigation, reason: str, at: datetime) -> Investigation:
    """What `Store.settle_unfinished` makes of a QUEUED or RUNNING investigation: a hazard
    rule's is queued again (nothing it ran is kept), a Trigger call's is INTERRUPTED."""
    if inv.trigger is not None:
        return queued_form(inv)
    return inv.model_copy(
        update={"state": InvestigationState.INTERRUPTED, "error": reason, "finished_at": at}
    )


def checked_memory_update(
    system: str, entry_id: str, entry: DiagnosisMemoryEntry | None
) -> DiagnosisMemoryEntry | None:
    """What a memory update returned, refused when it names another entry."""
    if entry is not None and (entry.system, entry.entry_id) != (system, entry_id):
        raise ValueError(
            f"a memory update for {system}/{entry_id} returned {entry.system}/{entry.entry_id}"
        )
    return entry


def tombstone(at: datetime) -> MemoryUpdate:
    """The update that marks an entry deleted at `at`, once (a second delete changes nothing)."""

    def deleted(entry: DiagnosisMemoryEntry | None) -> DiagnosisMemoryEntry | None:
        if entry is None or entry.deleted_at is not None:
            return None
        return entry.model_copy(update={"deleted_at": at})

    return deleted


def newest_verified_first(
    entries: Iterable[DiagnosisMemoryEntry], include_deleted: bool
) -> list[DiagnosisMemoryEntry]:
    kept = [e for e in entries if include_deleted or e.deleted_at is None]
    return sorted(kept, key=lambda e: (e.last_verified_at, e.entry_id), reverse=True)


# ------------------------------------------------------------ reads


def investigations_page_query(
    session_id: str | None,
    state: InvestigationState | None,
    method: tuple[str, str] | None,
    limit: int,
    page_token: str | None,
    mark: str,
    canaries: tuple[str, bool] = ("FALSE", False),
) -> tuple[str, list[object]]:
    """The query of `list_investigations` (newest first: created_at, then id, descending) with
    `mark` as its placeholder; `method` is the adapter's SQL for a record's method and the one
    wanted, `canaries` its SQL for "the record is a canary's" and whether those are wanted
    (only them) or not (only real investigations). It reads one row past the page, to tell
    whether another follows. Keyset pagination: the opaque token is the last row's key, so pages
    neither skip nor repeat rows when new ones arrive."""
    check_limit(limit)
    is_canary, wanted = canaries
    where: list[str] = [is_canary if wanted else f"NOT {is_canary}"]
    params: list[object] = []
    if session_id is not None:
        where.append(f"session_id = {mark}")
        params.append(session_id)
    if state is not None:
        where.append(f"state = {mark}")
        params.append(state.value)
    if method is not None:
        where.append(f"{method[0]} = {mark}")
        params.append(method[1])
    if page_token:
        where.append(f"(created_us, investigation_id) < ({mark}, {mark})")
        params.extend(decode_page_token(page_token))
    sql = (
        f"SELECT created_us, investigation_id, record FROM investigations"
        f" WHERE {' AND '.join(where)}"
        f" ORDER BY created_us DESC, investigation_id DESC LIMIT {mark}"
    )
    return sql, [*params, limit + 1]


def investigations_page(
    rows: Sequence[tuple[int, str, str]], limit: int
) -> tuple[list[Investigation], str | None]:
    """The page and the next page's token from what `investigations_page_query` read."""
    page = [Investigation.model_validate_json(record) for _, _, record in rows[:limit]]
    token = encode_page_token(*rows[limit - 1][:2]) if len(rows) > limit else None
    return page, token


def sessions_page_query(
    limit: int, page_token: str | None, mark: str, started_ms: str
) -> tuple[str, list[object]]:
    """The query of `list_sessions` (newest started first, then by id, descending), like
    `investigations_page_query`; `started_ms` is the adapter's SQL for a record's start time in
    milliseconds, computed per row (sessions have no column of it: the listing reads every
    session's record once)."""
    check_limit(limit)
    key = f"{started_ms} AS started_ms"
    where, params = "TRUE", list[object]()
    if page_token:
        where = f"({started_ms}, session_id) < ({mark}, {mark})"
        params.extend(decode_page_token(page_token))
    sql = (
        f"SELECT started_ms, session_id, record FROM (SELECT {key}, session_id, record"
        f" FROM sessions WHERE {where}) AS s ORDER BY started_ms DESC, session_id DESC"
        f" LIMIT {mark}"
    )
    return sql, [*params, limit + 1]


def sessions_page(
    rows: Sequence[tuple[int, str, str]], limit: int
) -> tuple[list[Session], str | None]:
    """The page and the next page's token from what `sessions_page_query` read."""
    page = [Session.model_validate_json(record) for _, _, record in rows[:limit]]
    token = encode_page_token(*rows[limit - 1][:2]) if len(rows) > limit else None
    return page, token


# Our tokens: base64 of [micros or millis, an id] in UTF-8: about 70 characters for an
# investigation's 32-hex id, at most 1,400 for a session id (256 characters, ingest's bound, of at
# most 4 bytes each).
_PAGE_TOKEN_CHARS = 1400


def check_limit(limit: int) -> None:
    # SQLite reads a negative LIMIT as "no limit": refuse it rather than return everything.
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")


def encode_page_token(key: int, row_id: str) -> str:
    """A page's last row as the next page's token: its sort key (a time) and its id."""
    text = json.dumps([key, row_id], separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


def decode_page_token(token: str) -> tuple[int, str]:
    """Bounded before it is parsed: a token is ours, at most `_PAGE_TOKEN_CHARS`."""
    if len(token) > _PAGE_TOKEN_CHARS:
        raise ValueError("invalid page token")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        key = json.loads(raw)
    except ValueError:  # covers binascii, unicode and JSON errors
        raise ValueError("invalid page token") from None
    match key:
        case [int() as sort_key, str() as row_id] if (
            not isinstance(sort_key, bool) and abs(sort_key) <= MAX_INTEGER
        ):
            return sort_key, row_id
        case _:
            raise ValueError("invalid page token")
