"""A store that cannot be used now (its server stopped or restarts, its disk is full) is an
outage, told apart from the daemon's own faults: the adapters raise StoreUnreachable, an
Unavailable (clients are told to retry, never INTERNAL), and keep the store's `Availability`,
so the outage is logged once when it begins and once when it ends, gauged and reported by
health, while the callers that meet it on every poll stay quiet.

The kinds are a short, bounded set (a gauge's label): disk_full, io_error, connection_lost,
busy, out_of_resources.
"""

from __future__ import annotations

import sqlite3

import psycopg

from poirotd.errors import Unavailable
from poirotd.observability.outages import Availability

FAULT_KINDS = ("disk_full", "io_error", "connection_lost", "busy", "out_of_resources")

_SQLITE_KINDS = {
    sqlite3.SQLITE_FULL: "disk_full",
    sqlite3.SQLITE_IOERR: "io_error",
    sqlite3.SQLITE_CANTOPEN: "io_error",
    sqlite3.SQLITE_READONLY: "io_error",
    sqlite3.SQLITE_BUSY: "busy",
    sqlite3.SQLITE_LOCKED: "busy",
    sqlite3.SQLITE_NOMEM: "out_of_resources",
}


class StoreUnreachable(Unavailable):
    """The store cannot be used now; `kind` says why (one of FAULT_KINDS)."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message, reason="store_unavailable")
        self.kind = kind


def sqlite_fault(exc: sqlite3.Error) -> str | None:
    """The kind of outage a SQLite error is (its primary result code), None for any other
    error (a constraint, corruption, a bug: not to be waited out)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else _SQLITE_KINDS.get(code & 0xFF)


def postgres_fault(exc: psycopg.OperationalError) -> str:
    """The kind of outage a PostgreSQL operational error is: its SQLSTATE class, or a lost
    connection when the server said nothing (it went away)."""
    state = exc.sqlstate or ""
    if state == "53100":
        return "disk_full"
    if state.startswith("53"):
        return "out_of_resources"
    if state.startswith("58"):
        return "io_error"
    if state in ("55P03", "40P01"):  # lock not available, deadlock
        return "busy"
    return "connection_lost"


class StoreFaults:
    """The store's availability as its adapter meets it. An outage that began on a failed write
    ends at the next write that succeeds, not at a read (a full disk still serves reads); one
    that began on a read, at the next success."""

    def __init__(self) -> None:
        self.availability = Availability("store")
        self._writes_failed = False

    def unreachable(self, kind: str, exc: Exception, *, writing: bool) -> StoreUnreachable:
        """The error to raise for `exc`, and the outage noted. The error's message, which a
        client may read, names the kind only: the server's own words (its address) are logged."""
        detail = " ".join(str(exc).split())[:300]
        self._writes_failed = self._writes_failed or writing
        self.availability.failed(kind, f"{type(exc).__name__}: {detail}")
        doing = "write to" if writing else "read from"
        return StoreUnreachable(f"cannot {doing} the store now ({kind}); retry later", kind=kind)

    def succeeded(self, *, writing: bool) -> None:
        if writing or not self._writes_failed:
            self._writes_failed = False
            self.availability.answered()
