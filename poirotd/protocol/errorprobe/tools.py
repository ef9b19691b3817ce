"""The Investigator's tools: claims about the stored session that the daemon checks itself.

The Investigator may not merely say "the agent was wrong": each piece of evidence is a claim one
of these tools decides against what the store holds, never against what a model says.
- quote: message #step contains this text (whitespace and case aside; at least
  MIN_QUOTE_CHARS characters, a shorter quote proves nothing);
- telemetry: some reading of component.signal in the session satisfies `comparison threshold`
  (a rule's condition);
- tool_result: the tool call made at message #step led to a result that is missing, reports
  an error, or contains this text.
Pure functions over the session and its readings.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt

from poirotd.model import AgentMessage, Frozen, MessageKind, Reading
from poirotd.protocol.schemas import bounded_text, json_object

MIN_QUOTE_CHARS = 8
CLAIM_TEXT_MAX = 200
_ERROR = re.compile(
    r"\b(error|exception|traceback|failed|failure|not found|denied|invalid|timed? ?out)\b",
    re.IGNORECASE,
)
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


class QuoteClaim(Frozen):
    tool: Literal["quote"]
    step: StrictInt
    text: str


class TelemetryClaim(Frozen):
    tool: Literal["telemetry"]
    component: str
    signal: str
    comparison: Literal[">", ">=", "<", "<="]
    threshold: float


class ToolResultClaim(Frozen):
    tool: Literal["tool_result"]
    step: StrictInt
    expect: Literal["missing", "error", "contains"]
    text: str = ""


Claim = Annotated[QuoteClaim | TelemetryClaim | ToolResultClaim, Field(discriminator="tool")]


class CheckedClaim(Frozen):
    claim: QuoteClaim | TelemetryClaim | ToolResultClaim
    passed: bool
    # What the check found, in a line.
    detail: str


def claim_schemas(
    steps: Sequence[int], calling_steps: Sequence[int], signals: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """The tools the Investigator can use on this chain: quote any of `steps`; follow a call
    made at one of `calling_steps`; compare a telemetry signal among `signals`."""
    tools = [
        json_object(
            tool={"const": "quote"}, step={"enum": list(steps)}, text=bounded_text(CLAIM_TEXT_MAX)
        )
    ]
    if calling_steps:
        tools.append(
            json_object(
                tool={"const": "tool_result"},
                step={"enum": list(calling_steps)},
                expect={"enum": ["missing", "error", "contains"]},
                text=bounded_text(CLAIM_TEXT_MAX),
            )
        )
    if signals:
        tools.append(
            json_object(
                tool={"const": "telemetry"},
                component={"enum": sorted({c for c, _ in signals})},
                signal={"enum": sorted({s for _, s in signals})},
                comparison={"enum": list(_COMPARE)},
                threshold={"type": "number"},
            )
        )
    return tools


def check(
    claim: QuoteClaim | TelemetryClaim | ToolResultClaim,
    messages: Sequence[AgentMessage],
    readings: Sequence[Reading],
) -> CheckedClaim:
    if isinstance(claim, QuoteClaim):
        passed, detail = _quote(claim, messages)
    elif isinstance(claim, TelemetryClaim):
        passed, detail = _telemetry(claim, readings)
    else:
        passed, detail = _tool_result(claim, messages)
    return CheckedClaim(claim=claim, passed=passed, detail=detail)


def _quote(claim: QuoteClaim, messages: Sequence[AgentMessage]) -> tuple[bool, str]:
    quoted = _normal(claim.text)
    if len(quoted.replace(" ", "")) < MIN_QUOTE_CHARS:
        return False, f"a quote needs at least {MIN_QUOTE_CHARS} characters"
    message = _at(messages, claim.step)
    if message is None:
        return False, f"there is no message #{claim.step}"
    if quoted in _normal(message.content):
        return True, f"message #{claim.step} contains the quote"
    return False, f"message #{claim.step} does not contain the quote"


def _telemetry(claim: TelemetryClaim, readings: Sequence[Reading]) -> tuple[bool, str]:
    label = f"{claim.component}.{claim.signal}"
    values = [
        r.value for r in readings if (r.component, r.signal) == (claim.component, claim.signal)
    ]
    if not values:
        return False, f"the session has no readings of {label}"
    meets = _COMPARE[claim.comparison]
    hits = sum(1 for v in values if meets(v, claim.threshold))
    span = f"(min {min(values):g}, max {max(values):g})"
    condition = f"{label} {claim.comparison} {claim.threshold:g}"
    return hits > 0, f"{hits} of {len(values)} readings meet {condition} {span}"


def _tool_result(claim: ToolResultClaim, messages: Sequence[AgentMessage]) -> tuple[bool, str]:
    call = _at(messages, claim.step)
    if call is None or not call.tool_calls:
        return False, f"message #{claim.step} calls no tool"
    result = next(
        (
            m
            for m in messages
            if m.index > call.index
            and m.kind is MessageKind.TOOL
            and (not m.tool_name or m.tool_name in call.tool_calls)
        ),
        None,
    )
    if result is None:
        return claim.expect == "missing", f"no result follows the call at #{claim.step}"
    where = f"the result of the call at #{claim.step} is #{result.index}"
    if claim.expect == "missing":
        return False, where
    if claim.expect == "error":
        found = _ERROR.search(result.content)
        return bool(found), f"{where}; it {'reports' if found else 'reports no'} error"
    contains = len(_normal(claim.text)) > 0 and _normal(claim.text) in _normal(result.content)
    return contains, f"{where}; it {'contains' if contains else 'does not contain'} the text"


def _at(messages: Sequence[AgentMessage], index: int) -> AgentMessage | None:
    return next((m for m in messages if m.index == index), None)


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()
