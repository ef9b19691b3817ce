"""Hazard rules as they are written in the system spec under ``rules:``.

Every rule is a frozen pydantic model; the ``kind`` field picks the model. Each model checks
its own fields. ``RuleSet`` checks the list as a whole: names are unique, composites name rules
that exist and do not form a cycle. A SystemSpec field ``rules: RuleSet = ()`` gets all of these
checks with no extra code.

This module does not import ``poirotd.config``. That lets ``config.spec`` import it without an
import cycle, so the two small base definitions below repeat the ones in config.spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)

from poirotd.model import MessageKind

Severity = Literal["info", "warning", "critical"]
_SNAKE_CASE = r"^[a-z][a-z0-9_]{0,63}$"
RuleName = Annotated[str, Field(pattern=_SNAKE_CASE)]
# Component and agent ids, as SystemSpec defines them.
Identifier = Annotated[str, Field(pattern=_SNAKE_CASE)]
SignalName = Annotated[str, Field(min_length=1, max_length=128)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Rule(_Model):
    name: RuleName
    severity: Severity
    # Counted in sample time, per session: a fault that persists must not open an investigation
    # per sample, and replayed data must behave the way live data did.
    cooldown_seconds: float = Field(default=60.0, ge=0.0)
    # False: the rule raises no events of its own and is only a part of composites (e.g. "torque
    # high" that matters only while the planner reports a stop).
    emit: bool = True


class _OnSignal(_Rule):
    component: Identifier
    signal: SignalName

    @property
    def label(self) -> str:
        return f"{self.component}.{self.signal}"


class _SignalRule(_OnSignal):
    """A rule evaluated on each sample of one signal."""

    # Consecutive samples the condition must hold, so that one noisy sample does not fire.
    for_samples: int = Field(default=1, ge=1, le=100_000)


class LevelsSpec(_Model):
    """Upper/lower trigger levels with hysteresis.

    After firing on ``above``, the rule re-arms only once the value has come back to
    ``clear_above`` or lower (and to ``clear_below`` or higher after firing on ``below``). Without
    clear levels the rule re-arms as soon as the trigger condition stops holding.
    """

    above: float | None = None
    below: float | None = None
    clear_above: float | None = None
    clear_below: float | None = None

    @model_validator(mode="after")
    def _levels_consistent(self) -> Self:
        above, below = self.above, self.below
        if above is None and below is None:
            raise ValueError("set above, below or both")
        if above is not None and below is not None and below >= above:
            raise ValueError(f"below ({below}) must be less than above ({above})")
        if self.clear_above is not None:
            if above is None:
                raise ValueError("clear_above needs above")
            if self.clear_above >= above:
                raise ValueError(
                    f"clear_above ({self.clear_above}) must be less than above ({above}): the "
                    "rule re-arms once the value has fallen back to clear_above"
                )
        if self.clear_below is not None:
            if below is None:
                raise ValueError("clear_below needs below")
            if self.clear_below <= below:
                raise ValueError(
                    f"clear_below ({self.clear_below}) must be greater than below ({below}): "
                    "the rule re-arms once the value has risen back to clear_below"
                )
        low, high = self.effective_levels()[2:]
        if low > high:
            raise ValueError(
                f"the re-arm band [{low}, {high}] is empty: no value would re-arm the rule"
            )
        return self

    def effective_levels(self) -> tuple[float, float, float, float]:
        """(above, below, clear_below, clear_above) with ±inf for levels that are not set."""
        above = math.inf if self.above is None else self.above
        below = -math.inf if self.below is None else self.below
        clear_above = above if self.clear_above is None else self.clear_above
        clear_below = below if self.clear_below is None else self.clear_below
        return above, below, clear_below, clear_above


class WindowSpec(_Model):
    """A rolling window, given as a duration or as a sample count.

    A duration window holds at most ``max_window_samples`` samples (the newest), so that
    memory per stream stays bounded whatever the sample rate.
    """

    window_seconds: float | None = Field(default=None, gt=0.0)
    window_samples: int | None = Field(default=None, ge=2, le=65_536)
    min_samples: int = Field(default=10, ge=2)
    max_window_samples: int = Field(default=1024, ge=2, le=65_536)

    @model_validator(mode="after")
    def _one_window(self) -> Self:
        if (self.window_seconds is None) == (self.window_samples is None):
            raise ValueError("set exactly one of window_seconds and window_samples")
        limit = self.window_samples or self.max_window_samples
        if self.min_samples > limit:
            name = "window_samples" if self.window_samples else "max_window_samples"
            raise ValueError(f"min_samples ({self.min_samples}) exceeds {name} ({limit})")
        return self

    @property
    def window_capacity(self) -> int:
        """The most samples a window can hold."""
        return self.window_samples or self.max_window_samples


class ThresholdRule(_SignalRule, LevelsSpec):
    """Fires when the value goes above ``above`` or below ``below``."""

    kind: Literal["threshold"]


class RangeRule(_SignalRule):
    """Fires when the value leaves [min, max]. It re-arms only once the value is back inside
    by ``hysteresis``."""

    kind: Literal["range"]
    min: float
    max: float
    hysteresis: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _band_consistent(self) -> Self:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be less than max ({self.max})")
        if self.min + self.hysteresis > self.max - self.hysteresis:
            raise ValueError(
                f"hysteresis ({self.hysteresis}) leaves no band inside [{self.min}, {self.max}] "
                "in which the rule could re-arm"
            )
        return self


class RateRule(_SignalRule):
    """Fires when |Δvalue/Δt| between consecutive samples exceeds the limit."""

    kind: Literal["rate"]
    max_rate_per_second: float = Field(gt=0.0)


class ZScoreRule(_SignalRule, WindowSpec):
    """Fires when the newest sample is more than ``threshold`` standard deviations from the mean
    of the window before it. A calibration offset or a spike shows up here even while each
    value is still inside its absolute limits."""

    kind: Literal["zscore"]
    threshold: float = Field(gt=0.0)
    # Lower bound for the window's std, for example the sensor's resolution. Without it, a
    # constant signal followed by a one-LSB step gives an infinite z.
    min_std: float = Field(default=0.0, ge=0.0)


class RollingMeanRule(_SignalRule, WindowSpec, LevelsSpec):
    """Fires when the mean of the window that ends at the newest sample goes past a level. A
    slow drift or an offset fires this rule; an oscillation around a sound mean does not."""

    kind: Literal["rolling_mean"]


class StaleRule(_OnSignal):
    """Fires on ``tick`` when the signal has sent no sample for longer than the timeout.

    The timeout is counted from the stream's last sample. If the stream has never sent a
    sample, it is counted from the first time the engine saw the session.
    """

    kind: Literal["stale"]
    timeout_seconds: float = Field(gt=0.0)


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc
    return pattern


# Searched in a message's content (``re.search``).
Pattern = Annotated[str, Field(min_length=1), AfterValidator(_compiles)]


class MessagePatternRule(_Rule):
    """Fires on a message whose content matches ``pattern`` (``re.search``).

    The filter on the message kind is called ``message_kind`` because ``kind`` already picks the
    rule type.
    """

    kind: Literal["message_pattern"]
    pattern: Pattern
    sender: Identifier | None = None
    message_kind: MessageKind | None = None


class AgentFlagRule(_Rule):
    """Fires when an agent raises a hazard on its own. Only agent messages (kind ``agent``)
    count. Either form raises a flag:

    * the content contains ``marker`` (default ``[HAZARD]``); the rest of that line is the
      reason, or
    * the whole content is a JSON object with ``"hazard": true`` (the boolean);
      an optional ``"reason"`` string is the reason.
    """

    kind: Literal["agent_flag"]
    marker: str = Field(default="[HAZARD]", min_length=1)
    sender: Identifier | None = None


class MessageRepeatRule(_Rule):
    """Fires when an agent sends again what it said in one of its last ``within_messages``
    messages: a loop the agent does not notice (MAST's step repetition). Only agent messages
    (kind ``agent``) count. Two messages are the same when their text is, ignoring case and
    runs of whitespace. What each agent said is kept in memory as short digests, like the
    telemetry windows: after a restart the comparison starts again."""

    kind: Literal["message_repeat"]
    sender: Identifier | None = None
    within_messages: int = Field(default=3, ge=1, le=64)
    # Shorter messages ("OK", "Done.") repeat in sound sessions and are never compared.
    min_chars: int = Field(default=20, ge=1)


class MessageFilter(_Model):
    """Which messages a reply rule means: each field that is set must match."""

    sender: Identifier | None = None
    message_kind: MessageKind | None = None
    pattern: Pattern | None = None

    @model_validator(mode="after")
    def _narrows(self) -> Self:
        if self.sender is None and self.message_kind is None and self.pattern is None:
            raise ValueError(
                "set sender, message_kind or pattern: an empty filter means any message"
            )
        return self


class ReplyExpectedRule(_Rule):
    """Fires when a message that calls for a reply (``after``) gets none (``expect``) within
    ``within_seconds``: an order nobody reviewed, a tool call whose result never came, a session
    that ended before the answer. Time is the messages' own, so a replay fires as the live
    session did: the deadline is checked at the session's next message and when it ends (a
    session that falls silent is caught at its end, or by a ``stale`` rule). Pending replies are
    kept in memory, like the telemetry windows: after a restart, a message from before it is
    no longer waited on."""

    kind: Literal["reply_expected"]
    after: MessageFilter
    expect: MessageFilter
    within_seconds: float = Field(gt=0.0)


class _Composite(_Rule):
    rules: tuple[RuleName, ...] = Field(min_length=2)

    @field_validator("rules")
    @classmethod
    def _distinct(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({r for r in rules if rules.count(r) > 1})
        if repeated:
            raise ValueError(f"each rule may appear once; repeated: {repeated}")
        return rules


class AllRule(_Composite):
    """Fires when every listed rule's condition has held within ``within_seconds``."""

    kind: Literal["all"]
    within_seconds: float = Field(gt=0.0)


class AnyRule(_Composite):
    """Fires when any listed rule's condition holds. Use it to give a group of rules one
    severity, one cooldown and one event."""

    kind: Literal["any"]


SignalRuleSpec = ThresholdRule | RangeRule | RateRule | ZScoreRule | RollingMeanRule
MessageRuleSpec = MessagePatternRule | AgentFlagRule | MessageRepeatRule | ReplyExpectedRule
CompositeRuleSpec = AllRule | AnyRule
RuleSpec = Annotated[
    SignalRuleSpec | StaleRule | MessageRuleSpec | CompositeRuleSpec,
    Field(discriminator="kind"),
]


def _check_rule_set(rules: tuple[RuleSpec, ...]) -> tuple[RuleSpec, ...]:
    names = [rule.name for rule in rules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"rule names must be unique; repeated: {repeated}")
    children: dict[str, tuple[str, ...]] = {
        r.name: r.rules for r in rules if isinstance(r, AllRule | AnyRule)
    }
    for name, parts in children.items():
        unknown = [p for p in parts if p not in names]
        if unknown:
            raise ValueError(f"rule {name!r} combines unknown rules {unknown}; known: {names}")
    cycle = _find_cycle(children)
    if cycle:
        raise ValueError(f"composite rules form a cycle: {' -> '.join(cycle)}")
    used = {p for parts in children.values() for p in parts}
    silent = [r.name for r in rules if not r.emit and r.name not in used]
    if silent:
        raise ValueError(f"rules {silent} have emit: false but no composite uses them")
    return rules


def _find_cycle(children: dict[str, tuple[str, ...]]) -> list[str]:
    """A cycle as a list of names from a rule back to itself, or [] if the graph is acyclic."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str]:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return []
        for child in children.get(name, ()):
            found = visit(child, [*path, name])
            if found:
                return found
        done.add(name)
        return []

    for name in children:
        found = visit(name, [])
        if found:
            return found
    return []


RuleSet = Annotated[tuple[RuleSpec, ...], AfterValidator(_check_rule_set)]

_RULE_SET: TypeAdapter[tuple[RuleSpec, ...]] = TypeAdapter(RuleSet)


def parse_rules(rules: Iterable[object]) -> tuple[RuleSpec, ...]:
    """Validate rules (models or the dicts loaded from YAML) as one set.

    Raises pydantic.ValidationError.
    """
    return _RULE_SET.validate_python(tuple(rules))
