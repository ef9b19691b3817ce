"""gRPC ingest requests for the clinic, as a producer sends them (unnumbered: the client or the
test gives each its seq)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from poirotd.api.poirot.v1 import poirot_pb2 as pb

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
# A rule over the clinic's exoskeleton that `motor_temp` readings over 70 make fire.
OVERHEAT: dict[str, Any] = {
    "kind": "threshold",
    "name": "exo_overheat",
    "severity": "critical",
    "component": "exo",
    "signal": "motor_temp_c",
    "above": 70.0,
    "cooldown_seconds": 600,
}


def start(session_id: str = "s1", system: str = "clinic") -> pb.IngestRequest:
    return pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system=system))


def message(
    index: int,
    sender: str = "doctor",
    session_id: str = "s1",
    content: str = "hello",
    kind: pb.MessageKind.ValueType = pb.MESSAGE_KIND_AGENT,
    recipient: str = "",
) -> pb.IngestRequest:
    return pb.IngestRequest(
        agent_message=pb.AgentMessage(
            session_id=session_id,
            index=index,
            kind=kind,
            sender=sender,
            recipient=recipient,
            content=content,
        )
    )


def session(n: int = 4, session_id: str = "s1") -> list[pb.IngestRequest]:
    """A session start and `n` messages, the clinic's agents speaking in turn."""
    senders = ["doctor", "chief", "physio"]
    return [start(session_id)] + [
        message(i, senders[i % 3], session_id, f"turn {i}") for i in range(n)
    ]


def motor_temp(seconds: float, value: float, session_id: str = "s1") -> pb.IngestRequest:
    """A reading of the exoskeleton's motor temperature, `seconds` after T0."""
    at = Timestamp()
    at.FromDatetime(T0 + timedelta(seconds=seconds))
    return pb.IngestRequest(
        telemetry=pb.TelemetrySample(
            session_id=session_id,
            component="exo",
            signal="motor_temp_c",
            value=value,
            measured_at=at,
        )
    )
