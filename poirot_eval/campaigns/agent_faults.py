"""Deterministic agent faults: each changes one thing in a session and nothing else.

They need no LLM, so a campaign runs on any model (the embedded one included). Every operator
takes the session's messages and the index it strikes, and returns the altered session with
the truth it implies: the faulty agent, the step where the failure shows, and the text before
and after. Messages are renumbered 0..n-1 after an operator removes or inserts one, so the
variant is a session the daemon takes; every other message keeps its content, sender, kind,
recipient and send time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from poirotd.model import AgentMessage, MessageKind

# The MAST mode each operator enacts (docs/campaigns.md says why each).
DEFAULT_MODES: dict[str, str | None] = {
    "drop_tool_result": "MAST-12",  # the agent goes on without the result it asked for
    "change_number": None,  # a wrong figure is not a coordination failure mode of its own
    "reverse_decision": "MAST-10",  # it decides against what the inputs it got support
    "repeat_step": "MAST-3",  # step repetition
    "withhold_message": "MAST-9",  # information withholding
    "end_early": "MAST-11",  # premature termination
}


class NotApplicableError(ValueError):
    """The operator cannot strike this message (no number in it, no decision to reverse...);
    the variant is dropped with this reason."""


@dataclass(frozen=True)
class Injection:
    messages: tuple[AgentMessage, ...]
    # Index, in `messages`, of the message where the failure shows.
    step: int
    # The agent at fault.
    region: str
    before: str
    after: str
    # Whether the operator ended the session itself (nothing may follow the fault).
    ends_session: bool = False


# Numbers as written: an optional sign, digits, an optional decimal part.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
# Decision words and their opposites, both ways; whole words, first one found is reversed.
_OPPOSITES = {
    "approve": "reject",
    "approved": "rejected",
    "approves": "rejects",
    "buy": "sell",
    "long": "short",
    "accept": "decline",
    "accepted": "declined",
    "suitable": "unsuitable",
    "safe": "unsafe",
    "recommend": "advise against",
    "yes": "no",
    "increase": "decrease",
}
_REVERSE = {**_OPPOSITES, **{v: k for k, v in _OPPOSITES.items()}}
_DECISION = re.compile(
    r"\b(" + "|".join(sorted(map(re.escape, _REVERSE), key=len, reverse=True)) + r")\b",
    re.IGNORECASE,
)


def renumbered(messages: Sequence[AgentMessage]) -> tuple[AgentMessage, ...]:
    """Indexes 0..n-1 in order; a message whose index is already right is kept as it is."""
    return tuple(
        m if m.index == i else m.model_copy(update={"index": i}) for i, m in enumerate(messages)
    )


def can_strike(operator: str, message: AgentMessage) -> bool:
    """Whether `operator` applies to `message` (used to find an agent's n-th target)."""
    if operator == "drop_tool_result":
        return message.kind is MessageKind.TOOL
    if message.kind is not MessageKind.AGENT:
        return False
    if operator == "change_number":
        return bool(_NUMBER.search(message.content))
    if operator == "reverse_decision":
        return bool(_DECISION.search(message.content))
    return bool(message.content.strip()) or operator in ("repeat_step", "end_early")


def change_number(
    messages: Sequence[AgentMessage], t: int, *, number: int, factor: float, value: float | None
) -> Injection:
    """The `number`-th number of agent message t becomes `value` (or itself times `factor`)."""
    target = _agent_at(messages, t)
    found = list(_NUMBER.finditer(target.content))
    if len(found) <= number:
        raise NotApplicableError(f"message {t} has {len(found)} numbers, not a number {number}")
    match = found[number]
    old = float(match.group())
    new = value if value is not None else old * factor
    if new == old:
        raise NotApplicableError(f"number {match.group()} of message {t} would not change")
    text = _format_like(new, match.group())
    content = target.content[: match.start()] + text + target.content[match.end() :]
    return _replaced(messages, t, content, before=match.group(), after=text)


def reverse_decision(messages: Sequence[AgentMessage], t: int) -> Injection:
    """The first decision word of agent message t (approve, buy, suitable, ...) becomes its
    opposite (reject, sell, unsuitable, ...), keeping its capitalisation."""
    target = _agent_at(messages, t)
    match = _DECISION.search(target.content)
    if match is None:
        raise NotApplicableError(
            f"message {t} states no decision this operator knows how to reverse"
        )
    word = match.group()
    opposite = _REVERSE[word.lower()]
    if word[0].isupper():
        opposite = opposite[0].upper() + opposite[1:]
    if word.isupper():
        opposite = opposite.upper()
    content = target.content[: match.start()] + opposite + target.content[match.end() :]
    return _replaced(messages, t, content, before=word, after=opposite)


def repeat_step(messages: Sequence[AgentMessage], t: int) -> Injection:
    """Agent message t is sent again right after itself (same content, a millisecond later)."""
    target = _agent_at(messages, t)
    again = target.model_copy(update={"sent_at": target.sent_at + timedelta(milliseconds=1)})
    altered = renumbered([*messages[: t + 1], again, *messages[t + 1 :]])
    return Injection(altered, t + 1, target.sender, before="", after=target.content)


def withhold_message(messages: Sequence[AgentMessage], t: int) -> Injection:
    """Agent message t is never sent: the session goes on without it. The failure shows at the
    message that came next, which now holds index t."""
    target = _agent_at(messages, t)
    if t + 1 >= len(messages):
        raise NotApplicableError(
            f"message {t} is the last: withholding it leaves nothing to show it"
        )
    altered = renumbered([*messages[:t], *messages[t + 1 :]])
    return Injection(altered, t, target.sender, before=target.content, after="")


def drop_tool_result(messages: Sequence[AgentMessage], t: int) -> Injection:
    """Tool result t never reaches the agent that asked for it; the agent's next message (now
    at index t) is where the failure shows, and that agent is at fault for going on without it."""
    target = messages[t]
    if target.kind is not MessageKind.TOOL:
        raise NotApplicableError(f"message {t} is a {target.kind.value} message, not a tool result")
    caller = target.recipient
    following = [i for i in range(t + 1, len(messages)) if messages[i].sender == caller]
    if not caller or not following:
        raise NotApplicableError(
            f"no later message of the agent that called the tool of message {t}"
        )
    altered = renumbered([*messages[:t], *messages[t + 1 :]])
    return Injection(altered, following[0] - 1, caller, before=target.content, after="")


def end_early(messages: Sequence[AgentMessage], t: int) -> Injection:
    """The session ends with agent message t: everything after it is gone."""
    target = _agent_at(messages, t)
    if t + 1 >= len(messages):
        raise NotApplicableError(f"message {t} is the last already")
    return Injection(
        tuple(messages[: t + 1]), t, target.sender, before="", after="", ends_session=True
    )


def replace_content(messages: Sequence[AgentMessage], t: int, content: str) -> Injection:
    """Agent message t says `content` instead (what the LLM operators write)."""
    target = _agent_at(messages, t)
    if content.strip() == target.content.strip():
        raise NotApplicableError(f"the new text of message {t} is the old one")
    return _replaced(messages, t, content, before=target.content, after=content)


def _replaced(
    messages: Sequence[AgentMessage], t: int, content: str, *, before: str, after: str
) -> Injection:
    target = messages[t]
    altered = (*messages[:t], target.model_copy(update={"content": content}), *messages[t + 1 :])
    return Injection(tuple(altered), t, target.sender, before=before, after=after)


def _agent_at(messages: Sequence[AgentMessage], t: int) -> AgentMessage:
    if t >= len(messages):
        raise NotApplicableError(f"the session has {len(messages)} messages, no message {t}")
    target = messages[t]
    if target.kind is not MessageKind.AGENT:
        raise NotApplicableError(f"message {t} is a {target.kind.value} message, not an agent's")
    return target


def _format_like(value: float, original: str) -> str:
    """`value` written as the original was: an integer stays an integer when it can."""
    if "." not in original and value == int(value):
        return str(int(value))
    decimals = len(original.partition(".")[2]) or 1
    return f"{value:.{decimals}f}"


# Operators that take (messages, t) alone.
SIMPLE: dict[str, Callable[[Sequence[AgentMessage], int], Injection]] = {
    "reverse_decision": reverse_decision,
    "repeat_step": repeat_step,
    "withhold_message": withhold_message,
    "drop_tool_result": drop_tool_result,
    "end_early": end_early,
}
