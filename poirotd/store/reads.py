"""The port's reads that are the same query on every adapter: written once, with `?` placeholders,
over the one method an adapter provides (`_query`, on its read connection). What an adapter reads
its own way (a session's messages and newest samples, where SQLite also reads the rows older
schemas left) stays in it, and so do the expressions that differ (`_CONFIRMED`, `_TRIGGERED`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from poirotd.model import (
    AgentReputation,
    CampaignSeed,
    DiagnosisMemoryEntry,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    LLMExchange,
    Session,
)
from poirotd.store.chain import Row
from poirotd.store.common import (
    check_limit,
    investigations_page,
    investigations_page_query,
    newest_verified_first,
    sessions_page,
    sessions_page_query,
)
from poirotd.store.parked_logs import OWNED, ParkedLogEvent, parked_from_rows
from poirotd.store.port import SessionSummary
from poirotd.store.records import event_from_row, from_micros


class StoreReads(ABC):
    # SQL: the investigation's record has a confirmed outcome.
    _CONFIRMED = "json_extract(record, '$.confirmed') IS NOT NULL"
    # SQL: a hazard rule opened the investigation (its record has a trigger).
    _TRIGGERED = "json_extract(record, '$.trigger') IS NOT NULL"
    # SQL: the investigation is a canary's (the field is left out of real ones' records).
    _CANARY = "json_extract(record, '$.canary') IS NOT NULL"
    # SQL: the investigation's method (records from before methods existed ran poirot).
    _METHOD = "coalesce(json_extract(record, '$.method'), 'poirot')"
    # SQL: a session's start, in milliseconds since the epoch (julianday counts milliseconds:
    # exact once rounded; the ISO text itself does not sort, its offsets and fractions vary).
    _STARTED_MS = (
        "CAST(round((julianday(json_extract(record, '$.started_at')) - 2440587.5) * 86400000)"
        " AS INTEGER)"
    )

    @abstractmethod
    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Runs one read statement (`?` placeholders) on the adapter's read connection."""

    async def parked_log_events(self, owner: str) -> list[ParkedLogEvent]:
        return parked_from_rows(await self._query(OWNED, (owner,)))

    async def get_session(self, session_id: str) -> Session | None:
        rows = await self._query("SELECT record FROM sessions WHERE session_id = ?", (session_id,))
        return Session.model_validate_json(rows[0][0]) if rows else None

    async def session_summary(self, session_id: str) -> SessionSummary | None:
        session = await self.get_session(session_id)
        return None if session is None else (await self._summaries([session]))[0]

    async def list_sessions(
        self, *, limit: int = 50, page_token: str | None = None
    ) -> tuple[list[SessionSummary], str | None]:
        """Newest started first (`sessions_page_query`)."""
        sql, params = sessions_page_query(limit, page_token, "?", self._STARTED_MS)
        sessions, token = sessions_page(await self._query(sql, params), limit)
        return await self._summaries(sessions), token

    async def _summaries(self, sessions: Sequence[Session]) -> list[SessionSummary]:
        """Each session with its counts: two grouped counts over the page's sessions."""
        if not sessions:
            return []
        ids = [s.session_id for s in sessions]
        messages = await self._counts_by_session("agent_messages", ids)
        investigations = await self._counts_by_session("investigations", ids)
        return [
            SessionSummary(s, messages.get(s.session_id, 0), investigations.get(s.session_id, 0))
            for s in sessions
        ]

    async def _counts_by_session(self, table: str, ids: Sequence[str]) -> dict[str, int]:
        marks = ", ".join("?" * len(ids))
        rows = await self._query(
            f"SELECT session_id, count(*) FROM {table} WHERE session_id IN ({marks})"
            " GROUP BY session_id",
            ids,
        )
        return {str(session_id): int(count) for session_id, count in rows}

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None:
        rows = await self._query(
            "SELECT record FROM hazard_spaces WHERE system = ? AND version = ?", (system, version)
        )
        return HazardSpace.model_validate_json(rows[0][0]) if rows else None

    async def latest_hazard_space(self, system: str) -> HazardSpace | None:
        """The space put last (even an older version put again)."""
        rows = await self._query(
            "SELECT record FROM hazard_spaces WHERE system = ? ORDER BY put_seq DESC LIMIT 1",
            (system,),
        )
        return HazardSpace.model_validate_json(rows[0][0]) if rows else None

    async def get_investigation(self, investigation_id: str) -> Investigation | None:
        rows = await self._query(
            "SELECT record FROM investigations WHERE investigation_id = ?", (investigation_id,)
        )
        return Investigation.model_validate_json(rows[0][0]) if rows else None

    async def list_investigations(
        self,
        *,
        session_id: str | None = None,
        state: InvestigationState | None = None,
        method: str | None = None,
        limit: int = 50,
        page_token: str | None = None,
        canaries: bool = False,
    ) -> tuple[list[Investigation], str | None]:
        """Newest first (`investigations_page_query`)."""
        by_method = None if method is None else (self._METHOD, method)
        sql, params = investigations_page_query(
            session_id, state, by_method, limit, page_token, "?", (self._CANARY, canaries)
        )
        return investigations_page(await self._query(sql, params), limit)

    async def count_investigations(self, state: InvestigationState) -> int:
        rows = await self._query(
            "SELECT count(*) FROM investigations WHERE state = ?", (state.value,)
        )
        return int(rows[0][0])

    async def oldest_waiting_hazard(self) -> datetime | None:
        """The creation time of the oldest DEFERRED or QUEUED investigation a rule opened."""
        ((oldest,),) = await self._query(
            "SELECT min(created_us) FROM investigations"
            f" WHERE state IN (?, ?) AND {self._TRIGGERED}",
            (InvestigationState.DEFERRED.value, InvestigationState.QUEUED.value),
        )
        return None if oldest is None else from_micros(int(oldest))

    async def reputations(self, system: str) -> dict[str, AgentReputation]:
        """The stored reputation of each agent of `system` that has one, by agent id."""
        rows = await self._query(
            "SELECT record FROM reputations WHERE system = ? ORDER BY agent_id", (system,)
        )
        reputations = [AgentReputation.model_validate_json(record) for (record,) in rows]
        return {r.agent_id: r for r in reputations}

    async def campaign_seed(self, system: str) -> CampaignSeed | None:
        """The fault campaign's seed in force for `system` (the latest applied), if any."""
        rows = await self._query("SELECT record FROM campaign_seeds WHERE system = ?", (system,))
        return CampaignSeed.model_validate_json(rows[0][0]) if rows else None

    async def confirmed_investigations(
        self, system: str, *, limit: int = 500
    ) -> list[Investigation]:
        """The system's newest `limit` investigations with a confirmed outcome, oldest first
        (by creation)."""
        check_limit(limit)
        rows = await self._query(
            f"SELECT record FROM investigations WHERE system = ? AND {self._CONFIRMED}"
            " ORDER BY created_us DESC, investigation_id DESC LIMIT ?",
            (system, limit),
        )
        return [Investigation.model_validate_json(record) for (record,) in reversed(rows)]

    async def memory_entries(
        self, system: str, *, include_deleted: bool = False
    ) -> list[DiagnosisMemoryEntry]:
        """The system's entries, most recently verified first (deleted ones only if asked)."""
        rows = await self._query("SELECT record FROM diagnosis_memory WHERE system = ?", (system,))
        entries = (DiagnosisMemoryEntry.model_validate_json(record) for (record,) in rows)
        return newest_verified_first(entries, include_deleted)

    async def _memory_entry(self, system: str, entry_id: str) -> DiagnosisMemoryEntry | None:
        rows = await self._query(
            "SELECT record FROM diagnosis_memory WHERE system = ? AND entry_id = ?",
            (system, entry_id),
        )
        return DiagnosisMemoryEntry.model_validate_json(rows[0][0]) if rows else None

    async def events_after(
        self, after_event_id: int, *, investigation_id: str | None = None, limit: int = 500
    ) -> list[InvestigationEvent]:
        check_limit(limit)
        sql = "SELECT event_id, investigation_id, record FROM events WHERE event_id > ?"
        params: list[Any] = [after_event_id]
        if investigation_id is not None:
            sql += " AND investigation_id = ?"
            params.append(investigation_id)
        rows = await self._query(sql + " ORDER BY event_id LIMIT ?", (*params, limit))
        return [event_from_row(row) for row in rows]

    async def latest_event_id(self) -> int:
        """The newest stored event's id (0 if none): where a follower of the store starts."""
        ((latest,),) = await self._query("SELECT coalesce(max(event_id), 0) FROM events", ())
        return int(latest)

    async def exchanges(self, investigation_id: str) -> list[LLMExchange]:
        rows = await self._query(
            "SELECT record FROM exchanges WHERE investigation_id = ? ORDER BY id",
            (investigation_id,),
        )
        return [LLMExchange.model_validate_json(record) for (record,) in rows]

    async def chain_head(self) -> tuple[int, str] | None:
        rows = await self._query("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else None
