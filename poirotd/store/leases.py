"""What claiming an investigation does to it, the same on every adapter: the fencing token moves
on, and a run whose replica died (RUNNING, its lease expired) is reset to its queued form, to be
run again from the start by the claimant (as a hazard rule's run is when its daemon, alone on its
store, stops: `Store.settle_unfinished`).

A taken-over investigation is re-run, not resumed: a run's intermediate state (the LLM's
conversation, the method's working memory) lives in its replica's process, and what the record
holds of it (reports, votes so far) came from a run that never finished. The dead run's writes
stay in the audit chain; its events stay in the Watch history, followed by a new STARTED.
"""

from __future__ import annotations

from poirotd.model import Investigation, InvestigationState
from poirotd.store.port import Lease


def lease_micros(lease_seconds: float) -> int:
    """A lease's length in the stores' time unit; a lease must last."""
    if not lease_seconds > 0:
        raise ValueError(f"lease_seconds must be positive, not {lease_seconds}")
    return round(lease_seconds * 1e6)


def claimed(
    inv: Investigation, owner: str, held_by: str | None, token: int
) -> tuple[Investigation, Lease]:
    """The record to run and the new lease, given who held the investigation before (None: no
    one) under which token."""
    if inv.state is not InvestigationState.RUNNING:
        return inv, Lease(inv.investigation_id, owner, token + 1)
    taken_over = Lease(inv.investigation_id, owner, token + 1, taken_over_from=held_by or "?")
    return queued_form(inv), taken_over


def queued_form(inv: Investigation) -> Investigation:
    """The record as it was queued, before any run: what it was opened for and who joined it,
    nothing a run produced."""
    return Investigation(
        investigation_id=inv.investigation_id,
        system=inv.system,
        session_id=inv.session_id,
        state=InvestigationState.QUEUED,
        reason=inv.reason,
        method=inv.method,
        trigger=inv.trigger,
        created_at=inv.created_at,
        requested_by=inv.requested_by,
        coalesced=inv.coalesced,
        coalesced_omitted=inv.coalesced_omitted,
    )
