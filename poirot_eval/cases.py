"""One benchmark case as the daemon sees it: a system spec, a session, and the known answer.

Every loader (BLAME, Who&When, TracerTraj) produces `EvalCase`s; the runner and the scorer only
ever see this type, so a new dataset is one new loader.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from poirotd.campaigns.labelled import GroundTruth, LabelledCase

__all__ = ["CASE_SHAPE", "Dataset", "EvalCase", "GroundTruth"]

# "whowhen" is Who&When's Algorithm-Generated subset, "whowhen-hand-crafted" its Hand-Crafted one.
Dataset = Literal["blame-cortex", "blame-trading", "whowhen", "whowhen-hand-crafted", "tracertraj"]


class EvalCase(LabelledCase):
    """A labelled case of a known dataset; unlike the daemon's canaries, the harness refuses
    fields it does not know."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: Dataset


# What a one-case JSON file holds (the README's "Case and result formats" has every field).
CASE_SHAPE = (
    'a one-case JSON file {"dataset": DATASET, "case_id": str, "spec": SYSTEM SPEC (as its YAML, '
    'in JSON), "messages": [{"session_id", "index", "kind", "sender", "content", "sent_at", ...}], '
    '"truth": {"regions": [REGION ID], "step": int | null}} (poirotd eval export writes one)'
)
