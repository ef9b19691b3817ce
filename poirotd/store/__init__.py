"""Durable storage behind one port (`Store`): sessions, investigations, events and the audit of
every LLM exchange, every write chained into a tamper-evident log (`poirotd.store.audit` checks and
exports it). SQLite (`SqliteStore`) is the embedded default; PostgreSQL (`PostgresStore`) is
for several daemons over one database."""

from poirotd.store.chain import GENESIS_HASH, canonical_json, entry_hash
from poirotd.store.port import (
    Admission,
    Admit,
    Admitted,
    AlreadyConfirmedError,
    Lease,
    LeaseLostError,
    QueueView,
    SessionSummary,
    Settled,
    Store,
    UnknownInvestigationError,
    UnknownSessionError,
)
from poirotd.store.postgres import PostgresStore
from poirotd.store.sqlite import SqliteStore

__all__ = [
    "GENESIS_HASH",
    "Admission",
    "Admit",
    "Admitted",
    "AlreadyConfirmedError",
    "Lease",
    "LeaseLostError",
    "PostgresStore",
    "QueueView",
    "SessionSummary",
    "Settled",
    "SqliteStore",
    "Store",
    "UnknownInvestigationError",
    "UnknownSessionError",
    "canonical_json",
    "entry_hash",
]
