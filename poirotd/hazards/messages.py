"""Message rules: match one agent message and say in one line why it matched.

Summaries quote at most a short excerpt. The full message is already in the session log, and an
event is exported to metrics and gRPC watchers.
"""

from __future__ import annotations

import json
import re

from poirotd.hazards.spec import AgentFlagRule, MessagePatternRule, MessageRuleSpec
from poirotd.model import AgentMessage, MessageKind

EXCERPT_CHARS = 80


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


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
        rule = self._rule
        if message.kind is not MessageKind.AGENT:
            return None
        if rule.sender is not None and message.sender != rule.sender:
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


def matcher_for(rule: MessageRuleSpec) -> PatternMatcher | FlagMatcher:
    if isinstance(rule, MessagePatternRule):
        return PatternMatcher(rule)
    return FlagMatcher(rule)
