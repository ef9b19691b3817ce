"""The store port: what the ingest pipeline, the investigations and Watch ask of durable storage.

Every adapter (SQLite, the embedded default; PostgreSQL, which several daemons may share) keeps
the same promises: a write that returned is committed; writes are chained into the audit log in
the order they commit, one total order even when several daemons write one database.

Sessions: `has_session` answers from memory, because ingest asks it for every item; it never says
yes wrongly (a stored session is never removed), but over a shared database it may say no to a
session another daemon started. `find_session` is the answer that counts: memory, else the
database, remembering what it finds. Ingest calls it for the sessions of a batch that
`has_session` misses, before it validates the batch (`IngestPipeline.find_sessions`); whoever
refuses a request for an unknown session asks it first. `commit_ingest` itself looks up the
sessions its memory lacks in its transaction, so a batch is refused only for a session no daemon
stored.

Replicas (several daemons over one shared store, `Store.shared`) coordinate only through it: an
investigation is run by the replica holding its `Lease`, whose writes are fenced by the lease's
token; an investigation is admitted (queued, deferred or coalesced into the session's open one)
in one transaction with what it was decided on, so a session's trigger seen by several replicas
opens one investigation, and a deferred one is queued by one replica; daemon-assigned message
indexes are reserved in the store.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeAlias

from poirotd.model import (
    AccessDenial,
    AgentMessage,
    AgentReputation,
    CampaignSeed,
    CommitItem,
    ConfirmedOutcome,
    DiagnosisMemoryEntry,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    ItemKey,
    LLMExchange,
    Reading,
    Session,
)
from poirotd.store.faults import StoreFaults
from poirotd.store.idempotency import LeftOut
from poirotd.store.parked_logs import NO_PARKING, ParkedLogEvent, Parking

# Seconds an ingest item's idempotency key is kept after its commit (POIROTD_IDEMPOTENCY_WINDOW_
# SECONDS): a copy arriving later is stored again.
DEFAULT_IDEMPOTENCY_WINDOW = 3600.0
# Given the confirmed history of a system (every investigation with a confirmed outcome, the one
# just confirmed included) and its stored reputations, the reputations to store.
Reassess: TypeAlias = Callable[
    [Sequence[Investigation], dict[str, AgentReputation]], list[AgentReputation]
]
# Given a memory entry as stored (None: there is none), the entry to store (None: leave it).
MemoryUpdate: TypeAlias = Callable[[DiagnosisMemoryEntry | None], DiagnosisMemoryEntry | None]


@dataclass(frozen=True)
class QueueView:
    """What admitting a new investigation is decided on, read in the transaction that stores the
    decision: of replicas admitting at once, each decides on what the one before stored."""

    # QUEUED investigations (every replica's) and DEFERRED ones.
    queued: int
    deferred: int
    # Of the QUEUED ones, those the candidate's requester asked for (0 for a hazard rule's).
    queued_by_requester: int
    # What the candidate would join: its session's oldest deferred, queued or running
    # investigation by the same method; else, for a hazard rule's, the investigation a hazard
    # of the session opened less than the cooldown from this one (any state).
    open: Investigation | None


class Admission(enum.StrEnum):
    QUEUED = "queued"
    DEFERRED = "deferred"
    # Joined `QueueView.open`: no investigation opened, the candidate's reason kept on that one.
    COALESCED = "coalesced"


# Given the view, how to admit the candidate; raises (and nothing is stored) to refuse it.
Admit: TypeAlias = Callable[[QueueView], Admission]


@dataclass(frozen=True)
class Admitted:
    admission: Admission
    # As stored: the candidate (queued or deferred), or the investigation it joined.
    investigation: Investigation


class UnknownSessionError(ValueError):
    """An ingest item refers to a session that was neither committed nor started earlier in its
    batch; the whole batch is refused, nothing of it is stored."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is not known; start it first")
        self.session_id = session_id


class UnknownInvestigationError(ValueError):
    """An event or exchange refers to an investigation that was never saved."""

    def __init__(self, investigation_id: str) -> None:
        super().__init__(f"investigation {investigation_id!r} is not known; save it first")
        self.investigation_id = investigation_id


class AlreadyConfirmedError(ValueError):
    """The investigation's outcome was confirmed before, with other regions, and the new one was
    not marked as superseding it: an accidental second confirmation changes nothing."""

    def __init__(self, investigation_id: str, confirmed: ConfirmedOutcome) -> None:
        super().__init__(
            f"investigation {investigation_id!r} was already confirmed with "
            f"{list(confirmed.region_ids)} at {confirmed.at.isoformat()}; to correct it, "
            "confirm again with supersede set and a note saying why"
        )
        self.confirmed = confirmed


class LeaseLostError(RuntimeError):
    """A write under a lease the investigation no longer has: another replica claimed it after
    this lease expired (its token is newer). Nothing of the write is stored."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(
            f"investigation {lease.investigation_id!r}: the lease of {lease.owner!r} "
            f"(token {lease.token}) was taken over"
        )
        self.lease = lease


@dataclass(frozen=True)
class SessionSummary:
    """A stored session and how much it holds: what an operator lists sessions by."""

    session: Session
    # Agent messages stored, and investigations opened over the session (any state).
    messages: int
    investigations: int


@dataclass(frozen=True)
class Settled:
    """The ids `Store.settle_unfinished` marked INTERRUPTED, and those it queued again."""

    interrupted: list[str]
    requeued: list[str]


@dataclass(frozen=True)
class Lease:
    """A replica's hold on the investigation it runs, until the store's clock passes the lease's
    end (renewed by the runner's heartbeat). `token`, a fencing token, grows with every claim of
    the investigation: a write under an older token is refused (LeaseLostError), so a replica
    that stalled past its lease can never finish an investigation another one took over."""

    investigation_id: str
    owner: str
    token: int
    # The replica whose expired lease this claim took over ("" for a queued investigation).
    taken_over_from: str = ""


class Store(Protocol):
    """Sessions, hazard spaces, investigations, their events and LLM exchanges, each write chained
    into the audit log. Every method but `has_session` is a coroutine."""

    # True when other processes (replicas) write the same store: the daemon then claims work,
    # numbers messages and follows Watch events through the store rather than in memory.
    shared: bool
    # Whether the store can be used now: its adapter raises StoreUnreachable (an Unavailable)
    # when it cannot, and keeps `faults.availability` (`poirotd.store.faults`).
    faults: StoreFaults

    async def close(self) -> None:
        """Lets already submitted work finish, then releases the store; idempotent."""

    # ingest
    async def commit_ingest(
        self,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> LeftOut:
        """Stores the batch in one transaction and returns after it is durable (the ack point),
        with the `parking` changes to the parked log events (`poirotd.store.parked_logs`).
        `keys[i]` is item i's idempotency key (a telemetry batch carries its rows' own): an
        item whose key the store holds, or that an earlier item of the batch has, is left out,
        and so is a message whose session and index are held. Held by the same content, it is
        a copy (a duplicate); by other content, a conflict, stored in `ingest_conflicts` (and
        chained) instead of the session. Returns what was left out.
        UnknownSessionError (nothing stored) when an item's session is neither stored nor
        started earlier in the batch."""

    async def parked_log_events(self, owner: str) -> list[ParkedLogEvent]:
        """The log events `owner` parked and did not release, oldest first."""

    async def take_over_parked_log_events(
        self, owner: str, owned_before_us: int, now_us: int
    ) -> list[ParkedLogEvent]:
        """Parks for `owner`, as owned from `now_us`, the events other owners have held since
        before `owned_before_us` (a replica gone: a live one places or rejects its events within
        their wait) and returns them as they were parked, oldest first; in one transaction, so
        of replicas taking over at once each row goes to one."""

    def has_session(self, session_id: str) -> bool:
        """From memory: True for a session this store committed or found; False may be wrong
        over a shared database (another daemon may have started it)."""

    async def find_session(self, session_id: str) -> bool:
        """Whether the session is stored: `has_session`, else the database (a session found is
        remembered, so `has_session` says yes from then on)."""

    async def get_session(self, session_id: str) -> Session | None: ...

    async def session_summary(self, session_id: str) -> SessionSummary | None: ...

    async def list_sessions(
        self, *, limit: int = 50, page_token: str | None = None
    ) -> tuple[list[SessionSummary], str | None]:
        """Newest started first, keyset-paginated by an opaque token; ValueError for a bad
        token."""

    async def session_messages(self, session_id: str) -> list[AgentMessage]: ...

    async def newest_readings(self, session_id: str, *, limit: int = 10_000) -> list[Reading]: ...

    async def reserve_message_indexes(self, session_id: str, count: int, *, floor: int = 0) -> int:
        """The first of `count` consecutive indexes for the session's daemon-numbered messages,
        at or above `floor`, past every index stored for it and every one reserved before (by
        any replica); the next reservation starts after them."""

    # hazard spaces
    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None: ...

    async def put_hazard_space(self, space: HazardSpace) -> None: ...

    async def latest_hazard_space(self, system: str) -> HazardSpace | None: ...

    # investigations
    async def save_investigation(self, inv: Investigation, *, lease: Lease | None = None) -> None:
        """Upserts the record. Under a lease, only while the lease is the investigation's
        current one, else LeaseLostError (the completion write of a replica that lost it); and
        the triggers coalesced into the stored record are kept (the run's copy of the record
        dates from its claim, they may have joined since)."""

    async def finish_investigation(
        self, inv: Investigation, event: InvestigationEvent, *, lease: Lease | None = None
    ) -> InvestigationEvent:
        """Saves the record that ends the run (final, or a hazard's DEFERRED again for want of
        a model) and appends the event announcing it (returned with its id) in one transaction,
        fenced like `save_investigation`: a run that stops between the two never leaves a
        finished record that no event announces."""

    async def admit_investigation(
        self, inv: Investigation, admit: Admit, *, cooldown: timedelta | None = None
    ) -> Admitted:
        """Reads the `QueueView` of a new investigation `inv` (its trigger and `cooldown`, in
        sample time, say which hazard openings it is held off by) and stores what `admit`
        decides, in one transaction: `inv` QUEUED, for any replica to claim, or DEFERRED; or
        `inv` coalesced into the view's open investigation (a `CoalescedTrigger` added to it).
        What `admit` raises propagates, with nothing stored."""

    async def queue_deferred(self, capacity: int) -> list[Investigation]:
        """Queues the oldest DEFERRED investigations while fewer than `capacity` are QUEUED, in
        one transaction (of replicas freeing queue slots at once, one queues each); returns
        those queued, as stored."""

    async def oldest_waiting_hazard(self) -> datetime | None:
        """When the oldest hazard rule's investigation that has not started yet (DEFERRED or
        QUEUED) was opened; None when none waits."""

    async def count_investigations(self, state: InvestigationState) -> int: ...

    async def claim_investigation(
        self, owner: str, lease_seconds: float
    ) -> tuple[Investigation, Lease] | None:
        """Claims for `owner`, until the store's clock + lease_seconds, the oldest QUEUED
        investigation nobody holds, else the oldest RUNNING one whose lease expired (its replica
        died): that one is reset to its queued form (what the dead run produced is left in the
        audit chain) and re-run from the start. None when there is nothing to claim."""

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> bool:
        """Extends the lease to the store's clock + lease_seconds; False when it was lost."""

    async def hand_back_lease(self, lease: Lease) -> None:
        """Ends the lease now (a draining replica's run it stops): another replica may claim the
        investigation at once, and the others are told so."""

    # other replicas' writes
    def change_mark(self) -> int:
        """A mark of the writes other processes made known so far (events stored, investigations
        queued, leases moved): take it before reading the store, then `wait_for_change`."""

    async def wait_for_change(self, since: int) -> None:
        """Returns once another process made a write known after `since` (a `change_mark`): a
        hint to read the store again, never the only one. Callers bound the wait
        (asyncio.timeout): a store that cannot tell never returns, a lost notice costs the
        bound."""

    async def get_investigation(self, investigation_id: str) -> Investigation | None: ...

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
        """Newest first, keyset-paginated by an opaque token; ValueError for a bad token. Real
        investigations only, or with `canaries` the canaries' only."""

    async def settle_unfinished(self, reason: str, at: datetime) -> Settled:
        """What a daemon alone on its store leaves when it stops, or finds when it starts: every
        QUEUED or RUNNING investigation a Trigger call opened is marked INTERRUPTED (with
        `reason`, at `at`); a hazard rule's is kept QUEUED (a RUNNING one reset to its queued
        form, as a takeover does) with no lease, to run once a worker claims it. DEFERRED ones
        stay deferred: a hazard's investigation is never dropped."""

    async def confirm_outcome(
        self,
        investigation_id: str,
        outcome: ConfirmedOutcome,
        reassess: Reassess,
        *,
        supersede: bool = False,
    ) -> tuple[Investigation, bool]:
        """Records the true cause and the reputations `reassess` derives, in one transaction.
        Other regions than the confirmed ones replace them (kept in `superseded`) with
        `supersede`, else raise AlreadyConfirmedError; the same regions change nothing."""

    async def reputations(self, system: str) -> dict[str, AgentReputation]: ...

    async def put_campaign_seed(self, seed: CampaignSeed) -> None:
        """Stores a fault campaign's seed for its system, replacing the one before (which the
        audit chain keeps); confirmed reputations are left as they are."""

    async def campaign_seed(self, system: str) -> CampaignSeed | None: ...

    async def confirmed_investigations(
        self, system: str, *, limit: int = 500
    ) -> list[Investigation]:
        """The system's newest `limit` investigations with a confirmed outcome, oldest first."""

    # ErrorProbe's verified memory
    async def memory_entries(
        self, system: str, *, include_deleted: bool = False
    ) -> list[DiagnosisMemoryEntry]:
        """The system's memory entries, most recently verified first."""

    async def update_memory_entry(
        self, system: str, entry_id: str, update: MemoryUpdate
    ) -> DiagnosisMemoryEntry | None:
        """Stores what `update` makes of the entry as stored, read and written in one
        transaction (two updates never read the same version); returns what was stored."""

    async def delete_memory_entry(
        self, system: str, entry_id: str, at: datetime
    ) -> DiagnosisMemoryEntry | None:
        """Marks the entry deleted at `at` (it stays in the audit, never retrieved again);
        returns it, or None when there is no such entry."""

    # events and exchanges
    async def append_event(
        self, event: InvestigationEvent, *, lease: Lease | None = None
    ) -> InvestigationEvent:
        """Stores the event under the next event id, returned in the copy (fenced like
        `save_investigation`). Ids become visible in increasing order: a reader that has seen
        every event up to N never later finds a new one at or below N."""

    async def events_after(
        self, after_event_id: int, *, investigation_id: str | None = None, limit: int = 500
    ) -> list[InvestigationEvent]: ...

    async def latest_event_id(self) -> int:
        """The newest stored event's id, 0 if there is none."""

    async def record_exchange(
        self, investigation_id: str, exchange: LLMExchange, *, lease: Lease | None = None
    ) -> None: ...

    async def exchanges(self, investigation_id: str) -> list[LLMExchange]: ...

    # the audit chain
    async def record_access_denial(self, denial: AccessDenial) -> None:
        """Keeps a call a transport refused (authentication, roles) in the chain."""

    async def chain_head(self) -> tuple[int, str] | None:
        """The seq and hash of the chain's latest entry; None while the chain is empty."""
