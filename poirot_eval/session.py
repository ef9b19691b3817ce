"""A case's session as the ingest items a monitored system would send: start, messages, end.

The in-process runner commits these items and replay streams them over gRPC, so both feed the
daemon the same session.
"""

from __future__ import annotations

from datetime import datetime

from poirot_eval.cases import EvalCase
from poirotd.model import AgentMessage, IngestItem, Session, SessionEnd, TelemetrySample


def session_id_of(case: EvalCase) -> str:
    """The session id the case's messages carry; a case without messages cannot be run."""
    if not case.messages:
        raise ValueError(f"case {case.case_id!r} has no messages")
    return case.messages[0].session_id


def session_items(case: EvalCase, session_id: str) -> list[IngestItem]:
    """SessionStart, every message and telemetry sample in time order (re-labelled with
    `session_id`; a sample goes before a message sent at the same instant, as the reading the
    message reports on), SessionEnd; the session spans the items' own timestamps."""
    messages = [m.model_copy(update={"session_id": session_id}) for m in case.messages]
    samples = [s.model_copy(update={"session_id": session_id}) for s in case.telemetry]
    timed: list[tuple[datetime, int, AgentMessage | TelemetrySample]] = [
        *((s.measured_at, 0, s) for s in samples),
        *((m.sent_at, 1, m) for m in messages),
    ]
    # A stable sort: messages keep their session order, samples their recorded order.
    timed.sort(key=lambda item: (item[0], item[1]))
    started = min(at for at, _, _ in timed)
    ended = max(at for at, _, _ in timed)
    return [
        Session(session_id=session_id, system=case.spec.system.name, started_at=started),
        *(item for _, _, item in timed),
        SessionEnd(session_id=session_id, ended_at=ended),
    ]
