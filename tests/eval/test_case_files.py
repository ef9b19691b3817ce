"""The one-case JSON format: written by `eval export`, read back by every command that takes a
case file, refused with the fields named when it does not fit, and documented field for field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from poirot_eval.case_files import CaseFileError
from poirot_eval.cases import EvalCase
from poirot_eval.loaders import load_cases
from poirot_eval.results import CaseResult
from poirot_eval.selection import resolve_case
from tests.support.cli import poirotd
from tests.support.data import DATA, RUNS

EVALUATION_PAGE = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"


def test_export_writes_a_case_every_command_reads_back(tmp_path: Path) -> None:
    first, again = tmp_path / "case.json", tmp_path / "again.json"
    exported = poirotd(
        "eval", "export", "whowhen-hand-crafted:45", "--data-dir", str(DATA), "-o", str(first)
    )
    assert exported.returncode == 0, exported.stderr
    assert "case whowhen-hand-crafted:45, 21 messages" in exported.stdout
    (loaded,) = load_cases("whowhen-hand-crafted", DATA, ids=["45"])
    assert resolve_case(str(first), DATA) == loaded
    assert poirotd("eval", "export", str(first), "-o", str(again)).returncode == 0
    assert again.read_bytes() == first.read_bytes()
    spec = poirotd("eval", "spec", str(first), "-o", str(tmp_path / "spec.yaml"))
    assert spec.returncode == 0, spec.stderr


def test_a_file_that_is_not_a_case_names_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"dataset": "whowhen", "case_id": 3}))
    with pytest.raises(CaseFileError) as caught:
        resolve_case(str(path), DATA)
    message = str(caught.value)
    assert message.startswith(f"{path}: case_id: Input should be a valid string (got 3)")
    assert "spec: Field required" in message
    assert 'expected a one-case JSON file {"dataset": DATASET' in message


def test_replaying_a_web_tool_run_says_how_to_import_it() -> None:
    run = RUNS / "cortex_182.json"
    replay = poirotd("replay", str(run), "--target", "127.0.0.1:1")
    assert replay.returncode == 2
    assert f"a run recorded by the POIROT web tool, not a case: `poirotd eval import-run {run}" in (
        replay.stderr
    )
    assert "validation error" not in replay.stderr


def _documented(section: str) -> set[str]:
    """Field names in the first column of the evaluation page's table after `section`."""
    text = EVALUATION_PAGE.read_text()
    table = text[text.index(section) :].split("\n\n")[1]
    names = set()
    for row in table.splitlines()[2:]:
        names |= set(re.findall(r"`(\w+)`", row.split("|")[1]))
    return names


def test_the_docs_document_every_field_of_both_formats() -> None:
    assert _documented("**One-case JSON**") == set(EvalCase.model_fields)
    assert _documented("**`results.jsonl`**") == set(CaseResult.model_fields)
