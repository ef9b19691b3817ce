"""The prompt parts every method shares, laid out for the prefix cache.

Layout rule: every request of one agent starts with the same prefix, `agent_prefix` — the
agent's own system prompt, then its filtered session log as chat turns — and everything
method-specific follows it, so the LLM server prefills the session once per agent and reuses it
for the agent's later requests. A reader outside the session (the baseline, ECHO's analysts,
ErrorProbe's roles) gets it as one text, `session_log`; every method shows the incident under
the same heading (`incident_section`). Each method's own prompts live in its package
(poirot/prompts.py, echo/prompts.py, errorprobe/prompts.py; the baseline's in baseline.py).

Every text the system under investigation or a model wrote is quoted with the investigation's
`Spotlight` (spotlight.py), whose bounds are the same in all of its prompts; the headers around
quotes are the daemon's own. The functions default to `VERBATIM` (no quoting), which is how the
record keeps the incident; the engine always passes the investigation's spotlight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from poirotd.config.spec import AgentSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import AgentMessage, HazardEvent, MessageKind
from poirotd.protocol.spotlight import VERBATIM, Spotlight

INCIDENT_HEADING = "# The incident under review"

# ------------------------------------------------------------------ session log → chat turns


def agent_prefix(
    agent: AgentSpec,
    messages: Sequence[AgentMessage],
    incident: Incident | None = None,
    spotlight: Spotlight = VERBATIM,
) -> list[ChatMessage]:
    """The identical start of every request `agent` makes: its system prompt (with what the
    spotlight's marks mean), then its log, then what is known about the incident (why it was
    opened, hardware readings around it)."""
    system = "\n\n".join(part for part in (agent.system_prompt, spotlight.notice) if part)
    turns = [ChatMessage(role="system", content=system)]
    turns += session_turns(agent.id, messages, spotlight)
    if incident is not None:
        _append(turns, "user", f"{INCIDENT_HEADING}\n{incident_section(incident, spotlight)}")
    return turns


def session_turns(
    agent_id: str, messages: Sequence[AgentMessage], spotlight: Spotlight = VERBATIM
) -> list[ChatMessage]:
    """The session as `agent_id` lived it: what it wrote as assistant turns, the rest as user,
    each message quoted under its header (its own too: a message it wrote may carry injected
    text, which must not read as the daemon's words, nor as its own commitments).

    Only messages `in_view`; consecutive turns of one role are merged because chat templates
    expect user and assistant to alternate.
    """
    turns: list[ChatMessage] = []
    for m in messages:
        if not in_view(agent_id, m):
            continue
        own = m.kind is MessageKind.AGENT and m.sender == agent_id
        _append(turns, "assistant" if own else "user", _message(m, spotlight))
    return turns


def in_view(agent_id: str, m: AgentMessage) -> bool:
    """Whether `agent_id` saw `m`: it sent it, received it, or it was broadcast."""
    return agent_id in (m.sender, m.recipient) or not m.recipient


def session_log(messages: Sequence[AgentMessage], spotlight: Spotlight = VERBATIM) -> str:
    """The whole session as one text, for a reader outside it (the baseline)."""
    return "\n\n".join(_message(m, spotlight) for m in messages) or "(no messages)"


def _append(turns: list[ChatMessage], role: Literal["user", "assistant"], text: str) -> None:
    """Adds a turn, merged into the previous one of the same role (templates want alternation)."""
    if turns and turns[-1].role == role:
        turns[-1] = ChatMessage(role=role, content=f"{turns[-1].content}\n\n{text}")
    else:
        turns.append(ChatMessage(role=role, content=text))


def _message(m: AgentMessage, spotlight: Spotlight) -> str:
    """A session message: the daemon's header line, then the body quoted as evidence."""
    return f"{_header(m, spotlight)}\n{_body(m, spotlight)}"


def _header(m: AgentMessage, spotlight: Spotlight) -> str:
    """`[#N sender → recipient]`. An agent's id is checked against the spec at ingest; any other
    sender's name is the client's choice and is shown as such (`human "system"`)."""
    if m.kind is MessageKind.AGENT:
        source = spotlight.party(m.sender)
    elif spotlight.mode == "off":
        source = f"{m.kind.value}:{spotlight.name(m.tool_name or m.sender)}"
    else:
        source = f"{m.kind.value} {spotlight.name(m.tool_name or m.sender)}"
    recipient = spotlight.party(m.recipient) if m.recipient else "all"
    return f"[#{m.index} {source} → {recipient}]"


def _body(m: AgentMessage, spotlight: Spotlight) -> str:
    calls = f"(called tools: {', '.join(m.tool_calls)})" if m.tool_calls else ""
    body = "\n".join(part for part in (m.content, calls) if part)
    return spotlight.quote(body) if body else "(empty)"


class Incident(NamedTuple):
    """What the agents are told about the incident: why the investigation was opened (the
    Trigger reason, or the rule event that opened it) and, when the session carries telemetry,
    a summary of its latest readings as hardware evidence. All of it is quoted: a reason, a
    rule's summary (which may cite a message) and a signal's name are written by clients."""

    reason: str = ""
    trigger: HazardEvent | None = None
    telemetry: str = ""

    def texts(self) -> list[tuple[str, str]]:
        """The client-written texts it quotes, each with where it appears, for the injection
        scan."""
        summary = self.trigger.summary if self.trigger else ""
        parts = [("reason", self.reason), ("rule summary", summary), ("telemetry", self.telemetry)]
        return [(where, text) for where, text in parts if text]


def incident_section(incident: Incident, spotlight: Spotlight = VERBATIM) -> str:
    """The incident as prompts show it under their "# The incident under review" heading; with
    `VERBATIM`, as the investigation's record keeps it."""
    # A quote starts on a line of its own; verbatim, the old one-line layout is kept.
    then = " " if spotlight.mode == "off" else "\n"
    lines = [f"Reported:{then}{spotlight.quote(incident.reason)}"]
    trigger = incident.trigger
    if trigger is not None:
        summary = spotlight.quote(trigger.summary)
        lines.append(f"Rule {trigger.rule} ({trigger.severity}):{then}{summary}")
    if incident.telemetry:
        lines.append(f"Hardware telemetry (latest samples):\n{spotlight.quote(incident.telemetry)}")
    return "\n".join(lines)


# ------------------------------------------------------------------ repair (every method's)


def invalid_answer(error: str) -> str:
    """The repair turn after an answer that failed validation; names what was wrong."""
    return (
        f"Your previous reply was rejected: {error}\n"
        "Reply again with only one JSON object in the required format."
    )
