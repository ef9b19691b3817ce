"""Durable storage: sessions, investigations, events and the audit of every LLM exchange, every
write chained into a tamper-evident log (`poirotd.store.audit` checks and exports it)."""

from poirotd.store.chain import GENESIS_HASH, canonical_json, entry_hash
from poirotd.store.sqlite import (
    AlreadyConfirmedError,
    Store,
    UnknownInvestigationError,
    UnknownSessionError,
)

__all__ = [
    "GENESIS_HASH",
    "AlreadyConfirmedError",
    "Store",
    "UnknownInvestigationError",
    "UnknownSessionError",
    "canonical_json",
    "entry_hash",
]
