"""One benchmark case as the daemon sees it: a system spec, a session, and the known answer.

Every loader (BLAME, Who&When, TracerTraj) produces `EvalCase`s; the runner and the scorer only
ever see this type, so a new dataset is one new loader.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from poirotd.campaigns.labelled import GroundTruth as Label
from poirotd.campaigns.labelled import LabelledCase
from poirotd.model import Frozen

# The published benchmarks a data folder holds. "whowhen" is Who&When's Algorithm-Generated
# subset, "whowhen-hand-crafted" its Hand-Crafted one.
Benchmark = Literal[
    "blame-cortex", "blame-trading", "whowhen", "whowhen-hand-crafted", "tracertraj"
]
# What a case belongs to: a benchmark, or "campaign" for a variant `poirotd campaign` wrote (its
# source and fault are in `truth.fault`).
Dataset = Literal[Benchmark, "campaign"]
# What an injected fault is: an agent's message corrupted (response) or what it was told altered
# before it spoke (prompt), a hardware sensor's signal or a market-data feed's quotes corrupted.
FaultKind = Literal["agent_response", "agent_prompt", "hardware", "feed"]
# What follows the fault in a variant: nothing (truncate), the original turns (keep), or turns
# written again by the LLM from each agent's instructions and the altered history (reenact).
FollowUp = Literal["truncate", "keep", "reenact"]


class InjectedFault(Frozen):
    """How a campaign variant was made: enough to say what a method should have found and to
    group scores by fault. Absent from benchmark cases, whose faults the datasets describe."""

    kind: FaultKind
    # The operator that made it (e.g. "change_number", "llm_response", "offset", "crossed_book").
    operator: str
    # The MAST mode the fault enacts ("MAST-3"), when it is an agent fault aimed at one.
    mode: str | None = None
    # hardware and feed faults: the component and signal(s) corrupted, and when it began.
    component: str = ""
    signals: tuple[str, ...] = ()
    onset: datetime | None = None
    follow_up: FollowUp = "keep"
    # Where the variant comes from: "<dataset>:<case id>" ("campaign:store-<session id>" for a
    # session of the daemon's store).
    source: str = ""
    # The rule (spec or campaign check) that fired on the variant and not on its source.
    hazard: str = ""
    # The operator's parameters as the plan gave them, and the text it changed (short).
    parameters: dict[str, str | float | int | bool] = Field(default_factory=dict)
    before: str = ""
    after: str = ""


class GroundTruth(Label):
    """The label as the harness reads it: a campaign variant's also names the fault injected.
    Unlike the daemon's canaries, the harness refuses fields it does not know."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Campaign variants only: the fault injected (None for the benchmarks' own cases).
    fault: InjectedFault | None = None


class EvalCase(LabelledCase):
    """A labelled case of a known dataset, as every loader makes it and the runner reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: Dataset
    truth: GroundTruth


# What a one-case JSON file holds (the README's "Case and result formats" has every field).
CASE_SHAPE = (
    'a one-case JSON file {"dataset": DATASET, "case_id": str, "spec": SYSTEM SPEC (as its YAML, '
    'in JSON), "messages": [{"session_id", "index", "kind", "sender", "content", "sent_at", ...}], '
    '"truth": {"regions": [REGION ID], "step": int | null, "fault": {...} (optional)}, '
    '"telemetry": [{"session_id", "component", "signal", "value", "measured_at"}] (optional)} '
    "(poirotd eval export and poirotd campaign write one)"
)
