"""A case's session as the ingest items a monitored system would send: start, messages, end.

The in-process runner commits these items and replay streams them over gRPC, so both feed the
daemon the same session.
"""

from __future__ import annotations

from poirot_eval.cases import EvalCase
from poirotd.model import IngestItem, Session, SessionEnd


def session_id_of(case: EvalCase) -> str:
    """The session id the case's messages carry; a case without messages cannot be run."""
    if not case.messages:
        raise ValueError(f"case {case.case_id!r} has no messages")
    return case.messages[0].session_id


def session_items(case: EvalCase, session_id: str) -> list[IngestItem]:
    """SessionStart, every message in session order (re-labelled with `session_id`), SessionEnd;
    the session spans the messages' own timestamps."""
    messages = [m.model_copy(update={"session_id": session_id}) for m in case.messages]
    started = min(m.sent_at for m in case.messages)
    ended = max(m.sent_at for m in case.messages)
    return [
        Session(session_id=session_id, system=case.spec.system.name, started_at=started),
        *messages,
        SessionEnd(session_id=session_id, ended_at=ended),
    ]
