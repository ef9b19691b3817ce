"""Message rules: match one agent message and say in one line why it matched.

Summaries quote at most a short excerpt. The full message is already in the session log, and an
event is exported to metrics and gRPC watchers.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import deque

from poirotd.hazards.spec import (
    AgentFlagRule,
    MessageFilter,
    MessagePatternRule,
    MessageRepeatRule,
    MessageRuleSpec,
    ReplyExpectedRule,
)
from poirotd.model import AgentMessage, MessageKind

EXCERPT_CHARS = 80


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _from_agent(message: AgentMessage, sender: str | None) -> bool:
    """An agent's own message (not a tool's, a person's or the system's), from `sender` if set."""
    return message.kind is MessageKind.AGENT and sender in (None, message.sender)


class _Filter:
    """A MessageFilter, its pattern compiled once."""

    def __init__(self, spec: MessageFilter) -> None:
        self._spec = spec
        self._regex = re.compile(spec.pattern) if spec.pattern is not None else None

    def found(self, message: AgentMessage) -> str | None:
        """None when the message does not match; else the text the pattern found ("" when the
        filter has no pattern)."""
        spec = self._spec
        if spec.sender not in (None, message.sender):
            return None
        if spec.message_kind not in (None, message.kind):
            return None
        if self._regex is None:
            return ""
        hit = self._regex.search(message.content)
        return None if hit is None else hit.group(0)

    def matches(self, message: AgentMessage) -> bool:
        return self.found(message) is not None

    def describe(self) -> str:
        spec = self._spec
        words = [f"{spec.message_kind.value} message" if spec.message_kind else "message"]
        if spec.sender:
            words.append(f"from {spec.sender}")
        if spec.pattern:
            words.append(f"matching {spec.pattern!r}")
        return " ".join(words)


class PatternMatcher:
    def __init__(self, rule: MessagePatternRule) -> None:
        self._pattern = rule.pattern
        self._filter = _Filter(
            MessageFilter(sender=rule.sender, message_kind=rule.message_kind, pattern=rule.pattern)
        )

    def match(self, message: AgentMessage) -> str | None:
        found = self._filter.found(message)
        if found is None:
            return None
        return (
            f"message #{message.index} from {message.sender} matches {self._pattern!r}: "
            f"{_excerpt(found)!r}"
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
        if said and message.index <= said[-1][1]:  # delivered again: the rules run before
            return None  # the store drops copies
        earlier = next((index for seen, index in said if seen == digest), None)
        said.append((digest, message.index))
        if earlier is None:
            return None
        return (
            f"message #{message.index} from {message.sender} repeats its message #{earlier}: "
            f"{_excerpt(message.content)!r}"
        )

    def forget(self, session_id: str) -> None:
        self._said.pop(session_id, None)


class ReplyWatch:
    """The message each session waits on a reply to (the first unanswered one), with its
    deadline. A later matching reply answers it; a session's later message past the deadline,
    or its end, fires the rule.

    The rules run before the store drops copies, so a message delivered again must change
    nothing: a call older than the session's newest reply is already answered, and a reply
    answers only calls that came before it."""

    def __init__(self, rule: ReplyExpectedRule) -> None:
        self._rule = rule
        self._after = _Filter(rule.after)
        self._expect = _Filter(rule.expect)
        self._waiting: dict[str, tuple[float, int, str]] = {}  # session -> deadline, index, sender
        self._answered: dict[str, int] = {}  # session -> index of its newest reply

    def match(self, message: AgentMessage) -> str | None:
        """The summary of a reply found overdue at this message, if one is."""
        session, t, index = message.session_id, message.sent_at.timestamp(), message.index
        overdue = self._overdue(session, t, f"within {self._rule.within_seconds:g} s")
        waiting = self._waiting.get(session)
        if self._expect.matches(message):
            self._answered[session] = max(index, self._answered.get(session, -1))
            if waiting is not None and waiting[1] < index:
                del self._waiting[session]
        elif (
            waiting is None
            and index > self._answered.get(session, -1)
            and self._after.matches(message)
        ):
            self._waiting[session] = (t + self._rule.within_seconds, index, message.sender)
        return overdue

    def ended(self, session_id: str) -> str | None:
        """The summary of a reply still awaited when the session ended, deadline or not."""
        return self._overdue(session_id, math.inf, "before the session ended")

    def forget(self, session_id: str) -> None:
        self._waiting.pop(session_id, None)
        self._answered.pop(session_id, None)

    def _overdue(self, session: str, t: float, when: str) -> str | None:
        waiting = self._waiting.get(session)
        if waiting is None or t <= waiting[0]:
            return None
        del self._waiting[session]
        _, index, sender = waiting
        return f"message #{index} from {sender} got no reply ({self._expect.describe()}) {when}"


Matcher = PatternMatcher | FlagMatcher | RepeatMatcher | ReplyWatch


def matcher_for(rule: MessageRuleSpec) -> Matcher:
    if isinstance(rule, MessagePatternRule):
        return PatternMatcher(rule)
    if isinstance(rule, MessageRepeatRule):
        return RepeatMatcher(rule)
    if isinstance(rule, ReplyExpectedRule):
        return ReplyWatch(rule)
    return FlagMatcher(rule)
