"""The ensemble: combining members' scores with hazard-aware weights and learnt reliability, and a
run of several methods over one session against a scripted backend."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from poirotd.config.spec import EchoSpec, EnsembleSpec, ReputationSpec
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import Attribution, ConfirmedOutcome, Investigation, InvestigationState
from poirotd.protocol.engine import InvestigationEngine, ProtocolOutcome
from poirotd.protocol.ensemble import combine, member_weight, method_reliabilities
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.method import Case
from poirotd.protocol.poirot.hazard_space import pinned_hazard_space
from poirotd.protocol.spotlight import VERBATIM
from tests.support.methods import analysis
from tests.support.protocol import SESSION, MemoryCache, make_spec, stepped_vote

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def attribution(scores: Sequence[float], decision: Sequence[int], step: int | None) -> Attribution:
    top = tuple(j for j, s in enumerate(scores) if s == max(scores) and s > 0)
    return Attribution(
        scores=tuple(scores),
        top=top,
        tie=len(top) > 1,
        decision=tuple(decision),
        rule="x",
        beta=0.0,
        step=step,
    )


def case(**ensemble: Any) -> Case:
    spec = make_spec(ensemble=EnsembleSpec(**ensemble))
    space = pinned_hazard_space(spec)
    assert space is not None
    return Case(
        spec=spec, space=space, messages=SESSION, incident=None, spotlight=VERBATIM, betas={}
    )


def test_a_member_that_blames_fewer_regions_weighs_more() -> None:
    one = attribution((0, 0, 0, 1), (0, 0, 0, 1), None)
    three = attribution((1, 1, 0, 1), (1, 1, 0, 1), None)
    assert member_weight(0.25, one, 4) == pytest.approx(0.25 + 0.5 * (1 - 1 / 4))
    assert member_weight(0.25, three, 4) == pytest.approx(0.25 + 0.5 * (1 - 3 / 4))
    assert member_weight(0.1, attribution((0, 0, 0, 0), (0, 0, 0, 0), None), 4) == 0.6


def test_scores_are_scaled_per_member_then_summed_with_the_weights() -> None:
    poirot = attribution((0.0, 0.5, 0.0, 1.5), (0, 0, 0, 1), 6)  # scaled: 0, 1/3, 0, 1
    echo = attribution((0.8, 0.0, 0.0, 0.2), (1, 0, 0, 0), 3)  # scaled: 1, 0, 0, 0.25
    silent = attribution((0.0, 0.0, 0.0, 0.0), (0, 0, 0, 0), None)  # adds nothing
    combined = combine(case(), [(0.6, poirot), (0.5, echo), (0.9, silent)])
    assert combined.scores == pytest.approx((0.5, 0.2, 0.0, 0.6 + 0.125))
    assert (combined.top, combined.decision, combined.tie) == ((3,), (0, 0, 0, 1), False)
    assert combined.step == 6, "the step with the most member weight"
    assert combined.rule == "ensemble(argmax)"
    assert combined.beta == pytest.approx((0.6 + 0.5 + 0.9) / 3)


def confirmed(
    method: str, decision: Sequence[int], truth: Sequence[int], **findings: Any
) -> Investigation:
    return Investigation(
        investigation_id=f"{method}-{decision}",
        system="cortex",
        session_id="s1",
        state=InvestigationState.SUCCEEDED,
        reason="x",
        method=method,
        created_at=T0,
        attribution=attribution(decision, decision, None),
        findings=findings,
        confirmed=ConfirmedOutcome(region_ids=("exo",), decision=tuple(truth), at=T0),
    )


def test_reliability_is_learnt_from_confirmed_outcomes_like_beta() -> None:
    settings = ReputationSpec(enabled=True, initial=0.25, learning_rate=0.5)
    truth = (0, 0, 0, 1)
    member = {"method": "echo", "attribution": {"decision": [0, 0, 0, 1]}}
    history = [
        confirmed("baseline", (0, 0, 0, 1), truth),  # right: 0.25 -> 0.375
        confirmed("baseline", (1, 0, 0, 1), truth),  # half right: -> 0.375 + (0.25-0.375)/2
        confirmed("ensemble", (0, 0, 0, 1), truth, members=[member]),  # echo right
    ]
    rho = method_reliabilities(settings, history)
    assert rho == pytest.approx({"baseline": 0.3125, "echo": 0.375})
    assert method_reliabilities(settings.model_copy(update={"enabled": False}), history) == {}


# ------------------------------------------------------------------ through the engine


class Members:
    """Answers the baseline's vote and ECHO's analyses."""

    def __init__(self, echo: str | None = None) -> None:
        self.echo = echo
        self.backend = ScriptedBackend(self)
        self.events: list[ProtocolEvent] = []

    def __call__(self, messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        assert schema is not None
        if "conclusion" in schema["properties"]:
            return self.echo or json.dumps(analysis(("doctor",), 0.9, 3))
        return stepped_vote(6)  # the baseline blames the exoskeleton

    async def sink(self, event: ProtocolEvent) -> None:
        self.events.append(event)


async def ensemble(
    members: Members, reliabilities: dict[str, float] | None = None
) -> ProtocolOutcome:
    spec = make_spec(
        echo=EchoSpec(analysts=1, roles=("general",)),
        ensemble=EnsembleSpec(members=("baseline", "echo")),
    )
    engine = InvestigationEngine(spec, members.backend, MemoryCache())
    return await engine.run(SESSION, members.sink, method="ensemble", reliabilities=reliabilities)


async def test_the_ensemble_runs_its_members_and_keeps_each_result() -> None:
    members = Members()
    outcome = await ensemble(members, {"echo": 0.5})
    # baseline: exo, weight 0.25 + 0.375; echo: doctor, weight 0.5 + 0.375.
    assert outcome.attribution.scores == pytest.approx((0.875, 0.0, 0.0, 0.625))
    assert outcome.attribution.decision == (1, 0, 0, 0)
    assert [v.agent_id for v in outcome.votes] == ["", "echo.general"]
    found = outcome.findings
    assert found["method"] == "ensemble"
    baseline, echo = found["members"]
    assert (baseline["method"], baseline["reliability"], baseline["error"]) == (
        "baseline",
        0.25,
        "",
    )
    assert echo["weight"] == pytest.approx(0.875)
    assert echo["findings"]["consensus"]["regions"] == ["doctor"]
    assert baseline["attribution"]["decision"] == [0, 0, 0, 1]
    assert len(members.backend.calls) == 2


async def test_a_failed_member_is_recorded_and_left_out() -> None:
    members = Members(echo="not an analysis")
    outcome = await ensemble(members)
    assert outcome.attribution.decision == (0, 0, 0, 1), "the baseline alone"
    echo = outcome.findings["members"][1]
    assert "no analyst cast a valid vote" in echo["error"] and echo["attribution"] is None
    assert any(lack.startswith("ensemble member echo failed") for lack in outcome.lacks)


async def test_the_ensemble_fails_only_when_every_member_does() -> None:
    class Broken(Members):
        def __call__(self, messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
            return "nothing useful"

    with pytest.raises(ProtocolError, match=r"every member failed: baseline: .*; echo: "):
        await ensemble(Broken())
