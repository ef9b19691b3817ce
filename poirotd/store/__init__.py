"""Durable storage: sessions, investigations, events and the audit of every LLM exchange."""

from poirotd.store.sqlite import (
    IngestItem,
    Store,
    UnknownInvestigationError,
    UnknownSessionError,
)

__all__ = ["IngestItem", "Store", "UnknownInvestigationError", "UnknownSessionError"]
