"""The wire form of "when" (vote and attribution steps) and of the context-budget records."""

from __future__ import annotations

from datetime import UTC, datetime

from poirotd.api import convert
from poirotd.model import Attribution, ContextCut, Investigation, InvestigationState, Vote

CUT = ContextCut(agent_id="doctor", index=2, action="shortened", chars_before=9000, chars_after=950)


def test_steps_are_present_only_when_known() -> None:
    assert convert.vote(Vote(agent_id="a", location=(1,), step=0)).step == 0
    assert convert.vote(Vote(agent_id="a", location=(1,), step=0)).HasField("step")
    assert not convert.vote(Vote(agent_id="a", location=(1,))).HasField("step")
    attribution = Attribution(scores=(1.0,), top=(0,), tie=False, decision=(1,), rule="x", beta=0)
    assert not convert.attribution(attribution).HasField("step")
    assert convert.attribution(attribution.model_copy(update={"step": 4})).step == 4


def test_context_cuts_and_method_reach_the_record() -> None:
    record = Investigation(
        investigation_id="i",
        system="clinic",
        session_id="s",
        state=InvestigationState.SUCCEEDED,
        reason="r",
        method="baseline",
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        context_cuts=(CUT,),
    )
    message = convert.investigation(record)
    assert message.method == "baseline"
    (cut,) = message.context_cuts
    assert (cut.agent_id, cut.index, cut.action) == ("doctor", 2, "shortened")
    assert (cut.chars_before, cut.chars_after) == (9000, 950)
