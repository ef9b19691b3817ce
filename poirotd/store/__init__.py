"""Durable storage: sessions, investigations, events and the audit of every LLM exchange, every
write chained into a tamper-evident log (`poirotd.audit` checks and exports it)."""

from poirotd.store.sqlite import (
    GENESIS_HASH,
    AlreadyConfirmedError,
    IngestItem,
    Store,
    UnknownInvestigationError,
    UnknownSessionError,
    canonical_json,
    entry_hash,
)

__all__ = [
    "GENESIS_HASH",
    "AlreadyConfirmedError",
    "IngestItem",
    "Store",
    "UnknownInvestigationError",
    "UnknownSessionError",
    "canonical_json",
    "entry_hash",
]
