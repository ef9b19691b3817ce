"""Loaders: each dataset becomes EvalCases with a pinned space, the session only, and its truth.
The cases in the repository (tests/data/eval) are checked one by one; the checks over every case
also read the full published sets when POIROTD_EVAL_DATA names them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal, cast

import pytest

from poirot_eval import blame
from poirot_eval.cases import Dataset, EvalCase
from poirot_eval.loaders import DATASETS, load_cases
from poirot_eval.parts import region_ids
from poirot_eval.session import session_id_of, session_items
from poirotd.ingest.validation import IngestScope, SignalNames, ValueRanges
from poirotd.model import DEFAULT_MAX_ABS_VALUE, MessageKind
from poirotd.store import Store
from tests.support.data import DATA, full_data

ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
Where = Literal["subset", "full"]


def _folder(where: Where, dataset: Dataset) -> Path:
    """The cases in the repository, or the full published set (skipped when not at hand)."""
    return DATA if where == "subset" else full_data(dataset)


def _check_common(case: EvalCase) -> None:
    space = case.spec.hazard_space
    assert space is not None
    ids = [r.id for r in space.regions]
    assert all(ID.match(i) for i in ids)
    assert ids[: len(case.spec.agents)] == list(case.spec.agent_ids)
    assert set(case.truth.regions) <= set(ids)
    assert [m.index for m in case.messages] == list(range(len(case.messages)))
    assert all(m.session_id == case.case_id for m in case.messages)


@pytest.mark.parametrize("where", ["subset", "full"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_case_loads_consistently(dataset: Dataset, where: Where) -> None:
    cases = load_cases(dataset, _folder(where, dataset))
    assert cases
    for case in cases:
        _check_common(case)
        if case.truth.step is not None:
            assert 0 <= case.truth.step < len(case.messages)


def test_region_ids_follow_the_spec_pattern_and_stay_distinct() -> None:
    ids = region_ids(["C++_Expert", "C_Expert", "Blu-Ray_Expert", "3D_Expert", "Excel_Expert"])
    assert ids == {
        "C++_Expert": "c_expert",
        "C_Expert": "c_expert_2",
        "Blu-Ray_Expert": "blu_ray_expert",
        "3D_Expert": "r_3d_expert",
        "Excel_Expert": "excel_expert",
    }


def test_whowhen_case_maps_agents_speakers_and_truth() -> None:
    record = json.loads((DATA / "whowhen" / "Algorithm-Generated" / "1.json").read_text())
    (case,) = load_cases("whowhen", DATA, ids=["1"])
    assert [a.name for a in case.spec.agents] == list(record["system_prompt"])
    assert [c.id for c in case.spec.components] == ["computer_terminal"]
    assert case.spec.hazard_space is not None
    assert [r.id for r in case.spec.hazard_space.regions] == [
        "excel_expert",
        "dataverification_expert",
        "businesslogic_expert",
        "computer_terminal",
    ]
    assert len(case.messages) == len(record["history"])
    for message, entry in zip(case.messages, record["history"], strict=True):
        assert message.content == entry["content"]
        expected = MessageKind.TOOL if entry["name"] == "Computer_terminal" else MessageKind.AGENT
        assert message.kind == expected
    assert case.truth.regions == ("excel_expert",)
    assert case.truth.step == int(record["mistake_step"])


def test_whowhen_agent_without_prompt_gets_a_stand_in() -> None:
    (case,) = load_cases("whowhen", DATA, ids=["108"])
    agent = next(a for a in case.spec.agents if a.name == "WebServing_Expert")
    assert "WebServing_Expert" in agent.system_prompt


def test_tracertraj_speakers_are_the_agents() -> None:
    case = load_cases("tracertraj", DATA, ids=["Algorithm_34582_I"])[0]
    assert case.spec.agent_ids == ("team_leader", "product_manager", "architect")
    assert case.spec.components == ()
    assert case.truth.regions == ("product_manager",)
    assert case.truth.step == 3
    assert case.messages[3].sender == "product_manager"


def test_cortex_session_only_reaches_the_attributor() -> None:
    record = json.loads((DATA / "blame/cortex/cases/cortex_session_250.json").read_text())
    (case,) = load_cases("blame-cortex", DATA)
    kept = [m for m in record["session"]["messages"] if m["phase"] == "cortex_session"]
    assert len(case.messages) == len(kept) < len(record["session"]["messages"])
    assert [m.content for m in case.messages] == [m.get("content") or "" for m in kept]
    assert not any('"location"' in m.content for m in case.messages)
    assert case.spec.agent_ids == ("doctor", "chief", "physio_general")
    assert [c.id for c in case.spec.components] == [
        "d2w_exoskeleton",
        "patient",
        "parent",
        "comm_channels",
    ]
    assert case.truth.regions == ("doctor", "physio_general")
    assert case.messages[1].tool_calls[0] == "run"
    assert case.messages[3].kind == MessageKind.TOOL


def test_trading_session_drops_prompts_and_the_embedded_run() -> None:
    (case,) = load_cases("blame-trading", DATA)
    assert case.spec.hazard_space is not None
    assert len(case.spec.hazard_space.regions) == 15
    assert len(case.spec.agents) == 12
    assert not any("POIROT" in m.content for m in case.messages)
    prompts = {a.system_prompt[:100] for a in case.spec.agents}
    assert not any(m.content[:100] in prompts for m in case.messages)
    senders = {m.sender for m in case.messages}
    assert senders <= {*case.spec.agent_ids, "system"}
    assert case.truth.regions == ("safe_analyst",)


@pytest.mark.parametrize("dataset", ["blame-cortex", "blame-trading"])
def test_blame_truth_matches_the_index(dataset: str) -> None:
    index = blame.truth_index(DATA, dataset)  # type: ignore[arg-type]
    assert len(index) == (15 if dataset == "blame-cortex" else 6)
    for case in load_cases(dataset, DATA):  # type: ignore[arg-type]
        assert case.truth == index[case.case_id]


def test_filters_select_limit_and_reject_unknown_ids() -> None:
    assert [c.case_id for c in load_cases("whowhen", DATA, limit=3)] == ["1", "2", "3"]
    assert [c.case_id for c in load_cases("whowhen", DATA, ids={"10", "2"})] == ["2", "10"]
    assert len(load_cases("tracertraj", DATA, limit=2)) == 2
    with pytest.raises(KeyError, match="nope"):
        load_cases("blame-cortex", DATA, ids=["nope"])


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_dataset_missing_from_the_data_folder_says_where_to_get_it(
    dataset: Dataset, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        load_cases(dataset, tmp_path)
    assert str(missing.value).startswith(f"no {tmp_path}/")
    where = 'docs/evaluation.md, "Evaluation on public benchmarks"'
    assert f"lacks {dataset}; {where}" in str(missing.value)


class _EmptyStore:
    """Stands in for a fresh store: no session exists before the case's own session_start."""

    def has_session(self, session_id: str) -> bool:
        return False


@pytest.mark.parametrize("where", ["subset", "full"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_case_passes_the_daemons_ingest_checks(dataset: Dataset, where: Where) -> None:
    """A loader whose messages the daemon refuses would turn a case into a failed run."""
    for case in load_cases(dataset, _folder(where, dataset)):
        ranges = ValueRanges(case.spec, DEFAULT_MAX_ABS_VALUE)
        scope = IngestScope(case.spec, cast(Store, _EmptyStore()), SignalNames(1024), ranges)
        for item in session_items(case, session_id_of(case)):
            scope.check(item)
