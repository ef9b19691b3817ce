"""Who&When, both subsets as published: the Hand-Crafted cases at hand load and run through the
daemon's pipeline, and files that do not fit a format are refused naming file, field and shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from poirot_eval.case_files import CaseFileError
from poirot_eval.cases import EvalCase
from poirot_eval.loaders import load_cases
from poirot_eval.selection import resolve_case
from poirot_eval.whowhen import MAGENTIC_ONE_AGENTS
from poirotd.devtools.answers import schema_answer
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import MessageKind
from tests.eval.helpers import lines, run
from tests.support.cli import poirotd
from tests.support.data import DATA

HAND_CRAFTED = DATA / "whowhen" / "Hand-Crafted"
# The published cases kept in the repository (tests/data/eval/README.md).
AT_HAND = ["1", "12", "45"]


# ------------------------------------------------------------------ the published cases


def test_the_hand_crafted_cases_at_hand_load_as_magentic_one_teams() -> None:
    cases = load_cases("whowhen-hand-crafted", DATA)
    assert [c.case_id for c in cases] == AT_HAND
    for case in cases:
        record = json.loads((HAND_CRAFTED / f"{case.case_id}.json").read_text())
        assert case.dataset == "whowhen-hand-crafted"
        assert case.spec.system.name == "magentic_one"
        description = case.spec.system.description
        assert "CaptainAgent" not in description
        for part in ("Orchestrator", "WebSurfer", "FileSurfer", "Coder", "ComputerTerminal"):
            assert part in description
        assert {a.name for a in case.spec.agents} <= set(MAGENTIC_ONE_AGENTS)
        assert case.spec.agents[0].id == "orchestrator"
        assert case.truth.regions == (record["mistake_agent"].lower(),)
        assert case.truth.step == int(record["mistake_step"])
        assert len(case.messages) == len(record["history"])
        # Nothing is cut at load: the context budget shortens prompts later.
        for message, entry in zip(case.messages, record["history"], strict=True):
            assert message.content.endswith(entry["content"])


def test_roles_become_sender_recipient_and_privacy() -> None:
    (case,) = load_cases("whowhen-hand-crafted", DATA, ids=["12"])
    record = json.loads((HAND_CRAFTED / "12.json").read_text())
    by_role = {h["role"]: m for h, m in zip(record["history"], case.messages, strict=True)}

    human = by_role["human"]
    assert (human.kind, human.sender, human.recipient) == (MessageKind.HUMAN, "human", "")
    told = by_role["Orchestrator (-> WebSurfer)"]
    assert (told.sender, told.recipient) == ("orchestrator", "websurfer")
    assert told.kind == MessageKind.AGENT
    thought = by_role["Orchestrator (thought)"]
    # The Orchestrator's ledger is its own: addressed to itself, the note kept in front.
    assert (thought.sender, thought.recipient) == ("orchestrator", "orchestrator")
    assert thought.content.startswith("(thought)\n")
    done = by_role["Orchestrator (termination condition)"]
    assert done.content.startswith("(termination condition)\n")
    surfer = by_role["WebSurfer"]
    assert (surfer.kind, surfer.sender, surfer.recipient) == (MessageKind.AGENT, "websurfer", "")
    assert case.spec.agent_ids == ("orchestrator", "websurfer", "assistant")
    assert [c.id for c in case.spec.components] == ["human"]


def test_a_case_ref_names_the_subset_and_an_unknown_id_the_folder() -> None:
    case = resolve_case("whowhen-hand-crafted:45", DATA)
    assert (case.dataset, case.case_id) == ("whowhen-hand-crafted", "45")
    there = r"no case \['2'\] in .*Hand-Crafted \(cases there: 1, 12, 45\)"
    with pytest.raises(ValueError, match=there):
        resolve_case("whowhen-hand-crafted:2", DATA)


async def test_two_hand_crafted_cases_run_through_the_daemon(tmp_path: Path) -> None:
    cases = load_cases("whowhen-hand-crafted", DATA, ids=["12", "45"])
    backend = ScriptedBackend(schema_answer, context_tokens=8192)
    recorder = await run(cases, tmp_path / "run", backend)

    assert [r.status for r in recorder.finished] == ["ok", "ok"], recorder.finished
    rows = lines(tmp_path / "run")
    assert [(r["dataset"], r["case_id"]) for r in rows] == [
        ("whowhen-hand-crafted", "12"),
        ("whowhen-hand-crafted", "45"),
    ]
    assert rows[0]["region_ids"] == ["orchestrator", "websurfer", "assistant", "human"]
    # 12's tool outputs do not fit an 8k window whole: the budget cut them, the case still ran.
    assert rows[1]["context_cuts"] > 0 or rows[0]["context_cuts"] > 0


# ------------------------------------------------------------------ synthetic variants


def hand_crafted(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "history": [
            {"role": "human", "content": "How many slides mention crustaceans?"},
            {"role": "Orchestrator (thought)", "content": "Initial plan: ask FileSurfer."},
            {"role": "Orchestrator (-> FileSurfer)", "content": "Open the presentation."},
            {"role": "FileSurfer", "content": "Slide 1 ... " + "x" * 95_000},
            {"role": "Orchestrator (-> ComputerTerminal)", "content": "Run the count."},
            {"role": "ComputerTerminal", "content": "4"},
            {"role": "  Orchestrator (termination condition) ", "content": "FINAL ANSWER: 4"},
        ],
        "question": "How many slides mention crustaceans?",
        "ground_truth": "4",
        "is_corrected": False,
        "question_ID": "x",
        "mistake_agent": "FileSurfer",
        "mistake_step": "3",
    }
    return record | changes


def write(tmp_path: Path, subset: str, case_id: str, content: str | dict[str, Any]) -> Path:
    folder = tmp_path / "whowhen" / subset
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case_id}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def load_one(tmp_path: Path, record: str | dict[str, Any]) -> EvalCase:
    write(tmp_path, "Hand-Crafted", "7", record)
    (case,) = load_cases("whowhen-hand-crafted", tmp_path)
    return case


def test_a_synthetic_log_loads_with_every_role_form_and_a_95k_output_whole(
    tmp_path: Path,
) -> None:
    case = load_one(tmp_path, hand_crafted())
    assert case.spec.agent_ids == ("orchestrator", "filesurfer")
    assert [c.id for c in case.spec.components] == ["human", "computerterminal"]
    assert [(m.sender, m.recipient, m.kind.value) for m in case.messages] == [
        ("human", "", "human"),
        ("orchestrator", "orchestrator", "agent"),
        ("orchestrator", "filesurfer", "agent"),
        ("filesurfer", "", "agent"),
        ("orchestrator", "computerterminal", "agent"),
        ("computerterminal", "", "tool"),
        ("orchestrator", "orchestrator", "agent"),
    ]
    assert len(case.messages[3].content) == len("Slide 1 ... ") + 95_000
    assert case.truth.step == 3 and case.truth.regions == ("filesurfer",)


def refusal(tmp_path: Path, record: str | dict[str, Any], subset: str = "Hand-Crafted") -> str:
    path = write(tmp_path, subset, "7", record)
    dataset = "whowhen-hand-crafted" if subset == "Hand-Crafted" else "whowhen"
    with pytest.raises(CaseFileError) as caught:
        load_cases(dataset, tmp_path)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"mistake_step": None}, "mistake_step: Input should be a valid integer"),
        ({"mistake_step": "twelve"}, "mistake_step: Input should be a valid integer"),
        ({"mistake_step": "-1"}, "mistake_step: Input should be greater than or equal to 0"),
        ({"history": []}, "history: List should have at least 1 item"),
        ({"mistake_step": "99"}, "mistake_step 99 is outside the history (0..6)"),
        ({"mistake_agent": "Coder"}, "mistake_agent 'Coder' is not one of the agents"),
        ({"mistake_agent": "human"}, "mistake_agent 'human' is not one of the agents"),
    ],
)
def test_wrong_fields_are_named_with_the_expected_shape(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    message = refusal(tmp_path, hand_crafted(**change))
    assert expected in message
    assert 'expected a Who&When Hand-Crafted log {"question": str, "history": [{"role":' in message


def test_missing_fields_are_each_named(tmp_path: Path) -> None:
    record = hand_crafted()
    del record["mistake_step"], record["question"]
    message = refusal(tmp_path, record)
    assert "question: Field required" in message and "mistake_step: Field required" in message


@pytest.mark.parametrize(
    "role", ["", "(thought)", "Orchestrator (-> )", "Orchestrator (thought", "A (b) (c)"]
)
def test_a_role_that_is_not_speaker_and_target_names_its_entry(tmp_path: Path, role: str) -> None:
    record = hand_crafted()
    record["history"][2] = {"role": role, "content": "?"}
    message = refusal(tmp_path, record)
    expected = "expected SPEAKER, SPEAKER (-> RECIPIENT) or SPEAKER (NOTE)"
    assert f"history.2.role: Value error, {expected}" in message


def test_an_entry_without_content_is_named(tmp_path: Path) -> None:
    record = hand_crafted()
    record["history"][5] = {"role": "ComputerTerminal", "content": None}
    message = refusal(tmp_path, record)
    assert "history.5.content: Input should be a valid string (got null)" in message


def test_bad_json_says_where(tmp_path: Path) -> None:
    text = json.dumps(hand_crafted())[:-40]
    assert "not valid JSON (line 1 column" in refusal(tmp_path, text)


def test_a_log_of_the_other_subset_says_which_subset_it_is(tmp_path: Path) -> None:
    generated = json.loads((DATA / "whowhen" / "Algorithm-Generated" / "1.json").read_text())
    assert "--subset algorithm-generated" in refusal(tmp_path, generated)
    message = refusal(tmp_path, hand_crafted(), subset="Algorithm-Generated")
    assert "system_prompt: Field required" in message
    assert "history.0.name: Field required" in message
    assert "a Hand-Crafted log has no system_prompt: --subset hand-crafted" in message


# ------------------------------------------------------------------ the command line


def test_no_cases_selected_names_the_folder_searched(tmp_path: Path) -> None:
    (tmp_path / "whowhen" / "Hand-Crafted").mkdir(parents=True)
    args = ["eval", "run", "--dataset", "whowhen", "--subset", "hand-crafted"]
    args += ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path), "--model-path", "x.gguf"]
    empty = poirotd(*args)
    folder = tmp_path / "whowhen" / "Hand-Crafted"
    assert empty.returncode == 2
    assert f"cannot load whowhen-hand-crafted: no cases selected in {folder}" in empty.stderr
    shutil.copy(HAND_CRAFTED / "45.json", folder / "45.json")
    unknown = poirotd(*args, "--ids", "46")
    assert unknown.returncode == 2
    assert f"no case ['46'] in {folder} (cases there: 45)" in unknown.stderr
    wrong = poirotd(*(a if a != "whowhen" else "tracertraj" for a in args))
    assert wrong.returncode == 2 and "only --dataset whowhen has subsets" in wrong.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # 110 s on a busy 2-core box (embedded model)
def test_eval_run_hand_crafted_on_the_embedded_model(tmp_path: Path) -> None:
    """`poirotd eval run --dataset whowhen --subset hand-crafted` end to end on real parts: the
    Magentic-One session through the daemon's ingest and the baseline on SmolLM2-135M (its
    answer is meaningless; that it runs and is recorded is the point)."""
    out = tmp_path / "run"
    args = ["eval", "run", "--dataset", "whowhen", "--subset", "hand-crafted", "--ids", "45"]
    result = poirotd(
        *args, "--method", "baseline", "--out", str(out), "--data-dir", str(DATA), timeout=800
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [row] = lines(out)
    assert (row["dataset"], row["case_id"], row["status"]) == ("whowhen-hand-crafted", "45", "ok")
    assert row["truth"]["regions"] == ["orchestrator"]
    assert len(row["decision"]) == len(row["region_ids"]) == 4
