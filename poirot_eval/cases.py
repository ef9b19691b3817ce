"""One benchmark case as the daemon sees it: a system spec, a session, and the known answer.

Every loader (BLAME, Who&When, TracerTraj) produces `EvalCase`s; the runner and the scorer only
ever see this type, so a new dataset is one new loader.
"""

from __future__ import annotations

from typing import Literal

from poirotd.config.spec import SystemSpec
from poirotd.model import AgentMessage, Frozen

# "whowhen" is Who&When's Algorithm-Generated subset, "whowhen-hand-crafted" its Hand-Crafted one.
Dataset = Literal["blame-cortex", "blame-trading", "whowhen", "whowhen-hand-crafted", "tracertraj"]


class GroundTruth(Frozen):
    """What caused the failure, as the dataset states it, in terms of the case's hazard space."""

    # Region ids of the faulty component(s): one for Who&When and TracerTraj, one or more for
    # BLAME (its exact-vector match compares the whole set).
    regions: tuple[str, ...]
    # Session index of the message where the failure began (Who&When, TracerTraj); None for BLAME.
    step: int | None = None


class EvalCase(Frozen):
    dataset: Dataset
    case_id: str
    # Pins the hazard space, so predictions and truth index the same regions.
    spec: SystemSpec
    # The session as the attributor may see it, in session order (indices 0..n-1).
    messages: tuple[AgentMessage, ...]
    truth: GroundTruth


# What a one-case JSON file holds (docs/evaluation.md's "Case and result formats" has every field).
CASE_SHAPE = (
    'a one-case JSON file {"dataset": DATASET, "case_id": str, "spec": SYSTEM SPEC (as its YAML, '
    'in JSON), "messages": [{"session_id", "index", "kind", "sender", "content", "sent_at", ...}], '
    '"truth": {"regions": [REGION ID], "step": int | null}} (poirotd eval export writes one)'
)
