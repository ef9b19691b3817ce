"""A campaign plan as the user writes it (YAML): which faults to inject and how to validate them.

Each fault is applied to every source session it fits; a fault names where it strikes (a step,
or an agent's n-th message; a component's signal and a window) and, optionally, the check that
must fire for a variant to be kept (a hazard rule in the spec's own syntax, or a spec rule's
name). Without a check, any of the spec's rules must fire on the variant and not on its source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from poirot_eval.case_files import CaseFileError, describe
from poirot_eval.cases import FollowUp
from poirotd.hazards.spec import RuleSpec
from poirotd.protocol.errorprobe.mast import mode_ids

# Deterministic agent operators: no LLM needed, so a campaign runs on any model.
DeterministicOperator = Literal[
    "drop_tool_result",
    "change_number",
    "reverse_decision",
    "repeat_step",
    "withhold_message",
    "end_early",
]
# Written by the LLM from the manipulator prompt: the agent's message replaced by a faulty one
# (response corruption), or the agent told something else before it spoke (prompt injection).
LLMOperator = Literal["llm_response", "llm_prompt"]
HardwareOperator = Literal["offset", "gain", "stuck", "dropout", "spike", "drift", "noise", "delay"]
FeedOperator = Literal["stale_price", "price_spike", "crossed_book"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleCheck(_Model):
    """The variant is kept when the spec's rule of this name fires on it (and not on the
    source)."""

    rule: str = Field(min_length=1)


# A check: a spec rule by name, or a rule of the campaign's own (any kind the spec takes).
Check = RuleCheck | RuleSpec


class AgentFault(_Model):
    operator: DeterministicOperator | LLMOperator
    # Where it strikes: a session index, or the `nth` message of `sender` that the operator can
    # change (0 = its first). One of the two.
    step: int | None = Field(default=None, ge=0)
    sender: str | None = None
    nth: int = Field(default=0, ge=0)
    # The MAST mode the fault enacts; required for the LLM operators (the manipulator aims at
    # it), a deterministic operator has its own (see agent_faults.DEFAULT_MODES).
    mode: str | None = None
    # change_number: which number of the message (0 = first), and what it becomes: `value`, or
    # the number times `factor`.
    number: int = Field(default=0, ge=0)
    factor: float = 10.0
    value: float | None = None
    # llm_*: what the fault should make the agent do, in the campaign's words (optional).
    instruction: str = ""
    check: Check | None = None

    @model_validator(mode="after")
    def _placed(self) -> Self:
        if (self.step is None) == (self.sender is None):
            raise ValueError("give exactly one of step and sender")
        if self.mode is not None and self.mode not in mode_ids():
            raise ValueError(f"unknown MAST mode {self.mode!r}; known: {', '.join(mode_ids())}")
        if self.operator in ("llm_response", "llm_prompt") and self.mode is None:
            raise ValueError(f"{self.operator} needs the MAST mode it aims at (mode: MAST-n)")
        return self

    @property
    def is_llm(self) -> bool:
        return self.operator in ("llm_response", "llm_prompt")


class SignalFault(_Model):
    """A fault on a declared signal of a component, in a window of the session: from
    `start_fraction` of the session's span, for `duration_s` (None: to the end)."""

    operator: HardwareOperator | FeedOperator
    component: str = Field(min_length=1)
    # The signal corrupted; for the feed operators the instrument ("ACME": its ACME.price,
    # ACME.bid, ACME.ask and ACME.spread signals).
    signal: str = Field(min_length=1)
    start_fraction: float = Field(default=0.5, ge=0.0, lt=1.0)
    duration_s: float | None = Field(default=None, gt=0.0)
    # offset, spike, drift (per second), noise (standard deviation), delay (seconds), gain (the
    # factor), price_spike (relative: 0.1 = 10 % up).
    magnitude: float = 0.0
    # stuck: the value the sensor holds (None: the value it read at onset).
    value: float | None = None
    seed: int = 0
    check: Check | None = None

    @model_validator(mode="after")
    def _meaningful(self) -> Self:
        needs = {"offset", "spike", "drift", "noise", "delay", "gain", "price_spike"}
        if self.operator in needs and self.magnitude == 0.0:
            raise ValueError(f"{self.operator} needs a non-zero magnitude")
        return self

    @property
    def kind(self) -> Literal["hardware", "feed"]:
        return (
            "feed"
            if self.operator in ("stale_price", "price_spike", "crossed_book")
            else ("hardware")
        )


Fault = Annotated[AgentFault | SignalFault, Field(union_mode="left_to_right")]


class CampaignPlan(_Model):
    name: str = Field(default="campaign", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    follow_up: FollowUp = "truncate"
    faults: tuple[Fault, ...] = Field(min_length=1)


PLAN_SHAPE = (
    "a YAML campaign plan {name, follow_up: truncate|keep|reenact, faults: [{operator, step | "
    "sender, mode, check, ...} or {operator, component, signal, start_fraction, duration_s, "
    "magnitude, check}]} (docs/campaigns.md)"
)


def read_plan(path: Path) -> CampaignPlan:
    """The plan in `path`; CaseFileError naming the file and what is wrong."""
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseFileError(f"{path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise CaseFileError(f"{path}: not valid YAML ({exc})") from exc
    try:
        return CampaignPlan.model_validate(raw)
    except ValidationError as exc:
        raise CaseFileError(f"{path}: {describe(exc)}; expected {PLAN_SHAPE}") from exc
