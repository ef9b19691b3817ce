"""Where a campaign's clean sessions come from: eval cases, or the daemon's store.

A store session becomes a case with no truth (a clean session: by default one that never had an
investigation, i.e. no incident), the spec the daemon serves, its messages and its telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from poirot_eval.cases import EvalCase, GroundTruth
from poirot_eval.selection import resolve_case
from poirotd.config.spec import SystemSpec
from poirotd.model import TelemetrySample
from poirotd.store.port import Store

# Telemetry read per store session (its newest readings): a campaign's sessions stay small.
MAX_READINGS = 10_000


def from_refs(refs: Sequence[str], data_dir: Path) -> list[EvalCase]:
    """Each `DATASET:CASE_ID` or one-case JSON file, in order (ValueError naming a bad one)."""
    return [resolve_case(ref, data_dir) for ref in refs]


async def from_store(
    store: Store,
    spec: SystemSpec,
    *,
    since: datetime | None,
    until: datetime | None,
    with_incidents: bool,
    limit: int | None,
) -> list[EvalCase]:
    """The spec's system's sessions started in [since, until), oldest first; those with an
    investigation only with `with_incidents`; at most `limit`."""
    chosen = []
    token: str | None = None
    while True:
        page, token = await store.list_sessions(limit=200, page_token=token)
        for summary in page:
            session = summary.session
            if session.system != spec.system.name or not summary.messages:
                continue
            if since is not None and session.started_at < since:
                continue
            if until is not None and session.started_at >= until:
                continue
            if summary.investigations and not with_incidents:
                continue
            chosen.append(session.session_id)
        if token is None:
            break
    chosen.reverse()  # the store lists newest first
    cases = []
    for session_id in chosen[:limit]:
        messages = await store.session_messages(session_id)
        readings = await store.newest_readings(session_id, limit=MAX_READINGS)
        telemetry = tuple(
            TelemetrySample(
                session_id=session_id,
                component=r.component,
                signal=r.signal,
                value=r.value,
                measured_at=r.measured_at,
            )
            for r in sorted(readings, key=lambda r: r.measured_at)
        )
        cases.append(
            EvalCase(
                dataset="campaign",
                case_id=f"store-{session_id}",
                spec=spec,
                messages=tuple(messages),
                truth=GroundTruth(regions=()),
                telemetry=telemetry,
            )
        )
    return cases
