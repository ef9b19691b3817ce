"""One benchmark case as the daemon sees it: a system spec, a session, and the known answer.

Every loader (BLAME, Who&When, TracerTraj) produces `EvalCase`s; the runner and the scorer only
ever see this type, so a new dataset is one new loader.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from poirotd.config.spec import SystemSpec
from poirotd.model import AgentMessage, Frozen, TelemetrySample

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


class GroundTruth(Frozen):
    """What caused the failure, as the dataset states it, in terms of the case's hazard space."""

    # Region ids of the faulty component(s): one for Who&When and TracerTraj, one or more for
    # BLAME (its exact-vector match compares the whole set).
    regions: tuple[str, ...]
    # Session index of the message where the failure began (Who&When, TracerTraj); None for BLAME.
    step: int | None = None
    # Campaign variants only: the fault injected (None for the benchmarks' own cases).
    fault: InjectedFault | None = None


class EvalCase(Frozen):
    dataset: Dataset
    case_id: str
    # Pins the hazard space, so predictions and truth index the same regions.
    spec: SystemSpec
    # The session as the attributor may see it, in session order (indices 0..n-1).
    messages: tuple[AgentMessage, ...]
    truth: GroundTruth
    # Samples of the session's components (hardware, feeds), in time order; the benchmarks have
    # none, a campaign's hardware and feed variants do. They reach the daemon with the messages.
    telemetry: tuple[TelemetrySample, ...] = ()


# What a one-case JSON file holds (docs/evaluation.md's "Case and result formats" has every field).
CASE_SHAPE = (
    'a one-case JSON file {"dataset": DATASET, "case_id": str, "spec": SYSTEM SPEC (as its YAML, '
    'in JSON), "messages": [{"session_id", "index", "kind", "sender", "content", "sent_at", ...}], '
    '"truth": {"regions": [REGION ID], "step": int | null, "fault": {...} (optional)}, '
    '"telemetry": [{"session_id", "component", "signal", "value", "measured_at"}] (optional)} '
    "(poirotd eval export and poirotd campaign write one)"
)
