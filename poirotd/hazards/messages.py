"""Message rules: match one agent message and say in one line why it matched.

Summaries quote at most a short excerpt. The full message is already in the session log, and an
event is exported to metrics and gRPC watchers.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque

from poirotd.hazards.spec import (
    AgentFlagRule,
    MessagePatternRule,
    MessageRepeatRule,
    MessageRuleSpec,
)
from poirotd.model import AgentMessage, MessageKind

EXCERPT_CHARS = 80


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _from_agent(message: AgentMessage, sender: str | None) -> bool:
    """An agent's own message (not a tool's, a person's or the system's), from `sender` if set."""
    return message.kind is MessageKind.AGENT and sender in (None, message.sender)


class PatternMatcher:
    def __init__(self, rule: MessagePatternRule) -> None:
        self._rule = rule
        self._regex = re.compile(rule.pattern)

    def match(self, message: AgentMessage) -> str | None:
        rule = self._rule
        if rule.sender is not None and message.sender != rule.sender:
            return None
        if rule.message_kind is not None and message.kind is not rule.message_kind:
            return None
        found = self._regex.search(message.content)
        if found is None:
            return None
        return (
            f"message #{message.index} from {message.sender} matches {rule.pattern!r}: "
            f"{_excerpt(found.group(0))!r}"
        )


class FlagMatcher:
    def __init__(self, rule: AgentFlagRule) -> None:
        self._rule = rule

    def match(self, message: AgentMessage) -> str | None:
        if not _from_agent(message, self._rule.sender):
            return None
        reason = self._reason(message.content)
        if reason is None:
            return None
        head = f"agent {message.sender} flagged a hazard in message #{message.index}"
        return f"{head}: {_excerpt(reason)}" if reason else head

    def _reason(self, content: str) -> str | None:
        """The flag's reason ("" when none is given), or None when the message raises no flag."""
        marker = self._rule.marker
        at = content.find(marker)
        if at >= 0:
            return content[at + len(marker) :].split("\n", 1)[0].strip()
        if '"hazard"' not in content:  # first: searching copies nothing, stripping would
            return None
        body = content.strip()
        if not body.startswith("{"):
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("hazard") is not True:
            return None
        reason = data.get("reason")
        return reason.strip() if isinstance(reason, str) else ""


class RepeatMatcher:
    """Keeps, per session and agent, digests of the agent's last ``within_messages`` messages:
    16 bytes each, so the memory a session holds is bounded by its agents, not by its text."""

    def __init__(self, rule: MessageRepeatRule) -> None:
        self._rule = rule
        self._said: dict[str, dict[str, deque[tuple[bytes, int]]]] = {}

    def match(self, message: AgentMessage) -> str | None:
        rule = self._rule
        if not _from_agent(message, rule.sender):
            return None
        text = " ".join(message.content.split()).casefold()
        if len(text) < rule.min_chars:
            return None
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        agents = self._said.setdefault(message.session_id, {})
        said = agents.get(message.sender)
        if said is None:
            said = agents[message.sender] = deque(maxlen=rule.within_messages)
        earlier = next((index for seen, index in said if seen == digest), None)
        if earlier == message.index:  # the same message delivered again is no repeat
            return None
        said.append((digest, message.index))
        if earlier is None:
            return None
        return (
            f"message #{message.index} from {message.sender} repeats its message #{earlier}: "
            f"{_excerpt(message.content)!r}"
        )

    def forget(self, session_id: str) -> None:
        self._said.pop(session_id, None)


Matcher = PatternMatcher | FlagMatcher | RepeatMatcher


def matcher_for(rule: MessageRuleSpec) -> Matcher:
    if isinstance(rule, MessagePatternRule):
        return PatternMatcher(rule)
    if isinstance(rule, MessageRepeatRule):
        return RepeatMatcher(rule)
    return FlagMatcher(rule)
