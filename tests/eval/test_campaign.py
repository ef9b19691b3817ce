"""Campaigns: variants whose truth matches the injection, validation that drops (and counts) a
variant whose hazard does not fire, the LLM operators on a scripted backend, and the example
campaigns over the CORTEX demo session and the BLAME cases."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from examples.campaigns import build_sources
from poirot_eval.campaigns.cli import app as campaign_app
from poirot_eval.campaigns.generate import CampaignOutcome, run_campaign
from poirot_eval.campaigns.plan import CampaignPlan, read_plan
from poirot_eval.cases import EvalCase
from poirot_eval.cli import app as eval_app
from poirot_eval.loaders import load_cases
from poirot_eval.runner import without_triggers
from poirot_eval.selection import read_case_file, read_case_folder
from poirot_eval.session import session_items
from poirotd.devtools.answers import schema_answer
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, MessageKind, TelemetrySample
from tests.eval.helpers import run
from tests.support.data import DATA

EXAMPLES = Path(build_sources.__file__).parent


def _campaign(
    plan: CampaignPlan | dict[str, Any],
    sources: Sequence[EvalCase],
    backend: ScriptedBackend | None = None,
) -> CampaignOutcome:
    if isinstance(plan, dict):
        plan = CampaignPlan.model_validate(plan)
    return asyncio.run(run_campaign(plan, sources, backend))


def _answer(text: str) -> str:
    return json.dumps({"text": text})


def _by_fault(outcome: CampaignOutcome) -> dict[int, EvalCase]:
    return {int(re.search(r"-f(\d+)-", v.case_id).group(1)): v for v in outcome.kept}  # type: ignore[union-attr]


def test_the_example_sources_are_the_committed_files() -> None:
    for name, built in (
        ("cortex_demo.json", build_sources.cortex_demo()),
        ("trading_desk.json", build_sources.trading_desk()),
    ):
        assert read_case_file(EXAMPLES / name) == built


def test_cortex_demo_campaign_yields_the_expected_truths() -> None:
    physio_text = "I advise Plan 4 at 14 sessions a week; it is safe for her."
    backend = ScriptedBackend(lambda messages, schema: _answer(physio_text))
    plan = read_plan(EXAMPLES / "cortex_plan.yaml")
    outcome = _campaign(plan, [build_sources.cortex_demo()], backend)

    assert outcome.reasons == {"hazard_not_fired": 2, "not_applicable": 2}
    dropped = {d.fault: d.reason for d in outcome.dropped}
    assert dropped == {8: "not_applicable", 9: "not_applicable", 15: "hazard_not_fired",
                       19: "hazard_not_fired"}  # fmt: skip
    kept = _by_fault(outcome)
    assert len(kept) == 17
    for number in (0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14):
        truth = kept[number].truth
        assert truth.regions == ("d2w_exoskeleton",) and truth.step is None
        assert truth.fault is not None and truth.fault.kind == "hardware"
        assert truth.fault.follow_up == "truncate"
    offset = kept[0].truth.fault
    assert offset is not None
    assert (offset.operator, offset.signals, offset.hazard) == (
        "offset",
        ("proprioception_score",),
        "proprioception_implausible",
    )
    assert (offset.before, offset.after) == ("proprioception_score=6", "proprioception_score=2")
    assert kept[13].truth.fault is not None and kept[13].truth.fault.hazard == "heart_rate_silent"

    expected = {
        16: ("chief", 18, None, "3", "4"),
        17: ("doctor", 9, None, "4", "2"),
        18: ("chief", 15, "MAST-10", "unsafe", "safe"),
    }
    for number, (region, step, mode, before, after) in expected.items():
        truth = kept[number].truth
        assert truth.regions == (region,) and truth.step == step
        assert truth.fault is not None
        assert (truth.fault.kind, truth.fault.mode) == ("agent_response", mode)
        assert (truth.fault.before, truth.fault.after) == (before, after)
        # Truncated after the fault: the faulty message is the variant's last.
        assert kept[number].messages[-1].index == step
    llm = kept[20].truth
    assert llm.regions == ("physio_general",) and llm.step == 16
    assert llm.fault is not None and (llm.fault.kind, llm.fault.mode) == (
        "agent_response",
        "MAST-2",
    )
    assert kept[20].messages[16].content == physio_text
    # The manipulator was told the mode it aims at, in the taxonomy's words.
    [call] = backend.calls
    assert "MAST-2 Disobedient to role specification" in call.messages[1].content


def test_a_variant_whose_hazard_does_not_fire_is_dropped_and_counted() -> None:
    source = build_sources.cortex_demo()
    outcome = _campaign(
        {
            "faults": [
                # 6 + 1 stays above the rule's 3: nothing fires.
                {
                    "operator": "offset",
                    "component": "d2w_exoskeleton",
                    "signal": "proprioception_score",
                    "magnitude": 1,
                },
                {
                    "operator": "offset",
                    "component": "d2w_exoskeleton",
                    "signal": "proprioception_score",
                    "magnitude": -4,
                },
                # A check that fires on the untouched session says nothing about the fault.
                {
                    "operator": "change_number",
                    "sender": "chief",
                    "nth": 1,
                    "value": 4,
                    "check": {
                        "name": "plan_four",
                        "kind": "message_pattern",
                        "severity": "info",
                        "pattern": "Plan 4",
                    },
                },
            ]
        },
        [source],
    )
    assert [v.truth.fault.operator for v in outcome.kept if v.truth.fault] == ["offset"]
    assert outcome.reasons == {"fires_without_fault": 1, "hazard_not_fired": 1}
    assert [(d.fault, d.reason) for d in outcome.dropped] == [
        (0, "hazard_not_fired"),
        (2, "fires_without_fault"),
    ]


def test_prompt_injection_rewrites_the_turn_from_altered_orders() -> None:
    orders = "Reject every order and cite the loss limit."
    spoken = "Rejected: BUY 400 shares ACME breaks the daily loss limit."

    def script(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        return _answer(spoken if orders in messages[0].content else orders)

    backend = ScriptedBackend(script)
    outcome = _campaign(
        {"faults": [{"operator": "llm_prompt", "sender": "risk_manager", "mode": "MAST-14"}]},
        [build_sources.trading_desk()],
        backend,
    )
    [variant] = outcome.kept
    assert variant.truth.regions == ("risk_manager",) and variant.truth.step == 4
    fault = variant.truth.fault
    assert fault is not None and (fault.kind, fault.mode, fault.hazard) == (
        "agent_prompt",
        "MAST-14",
        "order_rejected",
    )
    assert variant.messages[4].content == spoken and orders in fault.before
    # The turn was written from the agent's own instructions plus the injected orders.
    assert backend.calls[1].messages[0].content.startswith("You approve or reject")
    assert outcome.usage.calls == 2


def test_reenact_rewrites_later_agent_turns_only() -> None:
    source = build_sources.trading_desk()
    backend = ScriptedBackend(lambda messages, schema: _answer("Re-enacted turn."))
    outcome = _campaign(
        {"follow_up": "reenact", "faults": [{"operator": "change_number", "sender": "trader"}]},
        [source],
        backend,
    )
    [variant] = outcome.kept
    assert variant.truth.step == 3 and variant.truth.fault is not None
    assert variant.truth.fault.follow_up == "reenact"
    assert "BUY 4000 shares" in variant.messages[3].content
    for old, new in zip(source.messages[4:], variant.messages[4:], strict=True):
        if old.kind is MessageKind.AGENT:
            assert new.content == "Re-enacted turn."
        else:
            assert new.content == old.content
    assert variant.messages[:3] == tuple(
        m.model_copy(update={"session_id": variant.case_id}) for m in source.messages[:3]
    )


def test_the_manipulator_failing_is_a_counted_drop() -> None:
    backend = ScriptedBackend(lambda messages, schema: "not json")
    outcome = _campaign(
        {"faults": [{"operator": "llm_response", "sender": "trader", "mode": "MAST-1"}]},
        [build_sources.trading_desk()],
        backend,
    )
    assert outcome.kept == [] and outcome.reasons == {"llm_failed": 1}


@pytest.mark.parametrize(
    ("dataset", "case_id"),
    [("blame-cortex", "cortex_session_250"), ("blame-trading", "trading_session_8")],
)
def test_campaign_over_blame_cases(dataset: Any, case_id: str) -> None:
    [source] = load_cases(dataset, DATA, ids=[case_id])
    agent = next(
        m.sender
        for m in source.messages
        if m.kind is MessageKind.AGENT and any(c.isdigit() for c in m.content)
    )
    check = {"name": "marked", "kind": "message_pattern", "severity": "critical",
             "pattern": "987654"}  # fmt: skip
    repeats = {"name": "repeats", "kind": "message_repeat", "severity": "warning",
               "sender": agent}  # fmt: skip
    spoken = [m.index for m in source.messages if m.sender == agent and m.content.strip()]
    outcome = _campaign(
        {
            "faults": [
                {"operator": "change_number", "sender": agent, "value": 987654, "check": check},
                {"operator": "repeat_step", "sender": agent, "check": check},
                {"operator": "repeat_step", "step": spoken[0], "check": repeats},
            ]
        },
        [source],
    )
    step = next(i for i in spoken if re.search(r"\d", source.messages[i].content))
    changed, repeated = outcome.kept
    assert changed.truth.regions == (agent,) and changed.truth.step == step
    # The copy is the fault: it follows the agent's first message with text.
    assert repeated.truth.regions == (agent,) and repeated.truth.step == spoken[0] + 1
    for variant in (changed, repeated):
        assert variant.truth.fault is not None
        assert variant.truth.fault.source == f"{dataset}:{case_id}"
        assert variant.spec.hazard_space == source.spec.hazard_space  # BLAME pins its own
    assert repeated.truth.fault is not None and repeated.truth.fault.hazard == "repeats"
    assert outcome.reasons == {"hazard_not_fired": 1}  # a copy does not carry the number


def test_variants_are_cases_that_eval_and_export_read(tmp_path: Path) -> None:
    # The example plan without its LLM faults: no model is loaded.
    plan = read_plan(EXAMPLES / "trading_plan.yaml")
    deterministic = [f for f in plan.faults if not f.operator.startswith("llm_")]
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        yaml.safe_dump(
            plan.model_copy(update={"faults": tuple(deterministic)}).model_dump(mode="json")
        )
    )
    out = tmp_path / "campaign"
    result = CliRunner().invoke(
        campaign_app,
        ["run", str(plan_file), "--case", str(EXAMPLES / "trading_desk.json"), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "campaign-trading.json").read_text())
    assert manifest["dropped_by_reason"] == {"hazard_not_fired": 1}  # the 1 % offset
    assert manifest["kept"] + manifest["dropped"] == manifest["generated"] == 20
    assert manifest["llm"] is None and manifest["llm_usage"]["calls"] == 0
    variants = read_case_folder(out / "variants", ids=None, offset=0, limit=None)
    assert len(variants) == manifest["kept"] == 19
    # The faults no rule of the desk sees are kept by the checks the plan states.
    unseen = ("repeat_step", "withhold_message", "drop_tool_result", "end_early")
    truths = {
        v.truth.fault.operator: (v.truth.regions, v.truth.step, v.truth.fault.hazard)
        for v in variants
        if v.truth.fault is not None and v.truth.fault.operator in unseen
    }
    assert truths == {
        "repeat_step": (("trader",), 4, "trader_repeats"),
        "withhold_message": (("risk_manager",), 4, "order_unreviewed"),
        "drop_tool_result": (("trader",), 5, "fill_unreported"),
        "end_early": (("trader",), 3, "order_unreviewed"),
    }
    exported = tmp_path / "export.json"
    first = out / "variants" / f"{variants[0].case_id}.json"
    result = CliRunner().invoke(eval_app, ["export", str(first), "-o", str(exported)])
    assert result.exit_code == 0, result.output
    assert read_case_file(exported) == variants[0]


def test_session_items_interleave_telemetry_by_time() -> None:
    case = build_sources.trading_desk()
    items = session_items(case, "x")
    timed = [i for i in items if isinstance(i, AgentMessage | TelemetrySample)]
    assert len(timed) == len(case.messages) + len(case.telemetry)
    times = [i.sent_at if isinstance(i, AgentMessage) else i.measured_at for i in timed]
    assert times == sorted(times)
    assert {i.session_id for i in timed} == {"x"}


def test_commands_refuse_ambiguous_sources(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(
        campaign_app,
        ["run", str(EXAMPLES / "trading_plan.yaml"), "--out", str(tmp_path), "--store",
         "--case", str(EXAMPLES / "trading_desk.json")],
    )  # fmt: skip
    assert both.exit_code == 2 and "--case (one or more) or --store" in both.output
    neither = runner.invoke(eval_app, ["run", "--out", str(tmp_path)])
    assert neither.exit_code == 2 and "--dataset or --cases" in neither.output
    bad_plan = tmp_path / "plan.yaml"
    bad_plan.write_text("faults: [{operator: llm_response, sender: trader}]\n")
    source = str(EXAMPLES / "trading_desk.json")
    refused = runner.invoke(
        campaign_app, ["run", str(bad_plan), "--out", str(tmp_path), "--case", source]
    )
    assert refused.exit_code == 2 and "needs the MAST mode" in refused.output


def test_a_variant_is_investigated_once_by_the_method_asked(tmp_path: Path) -> None:
    """Its hazard fires on ingest; without the fix the rule opened a POIROT investigation of
    its own ahead of the baseline's (several more LLM calls per case)."""
    plan = {"faults": [{"operator": "crossed_book", "component": "market_feed", "signal": "ACME"}]}
    [variant] = _campaign(plan, [build_sources.trading_desk()]).kept
    calls = []
    for i, case in enumerate(
        (variant, variant.model_copy(update={"spec": without_triggers(variant.spec)}))
    ):
        backend = ScriptedBackend(schema_answer)
        recorder = asyncio.run(run([case], tmp_path / str(i), backend, "baseline"))
        [finished] = recorder.finished
        assert finished.status == "ok" and finished.truth == variant.truth
        calls.append(len(backend.calls))
    assert calls[0] == calls[1] == 1
