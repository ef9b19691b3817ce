"""gRPC ingest requests for the clinic, as a producer sends them (unnumbered: the client or the
test gives each its seq)."""

from __future__ import annotations

from poirotd.api.poirot.v1 import poirot_pb2 as pb


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
