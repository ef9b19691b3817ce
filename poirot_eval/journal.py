"""A run directory: `results.jsonl`, one durable line per finished case, and `run.json`, what ran.

Lines are keyed by dataset, case id and method, so one directory may hold several datasets and
both methods, and a rerun skips what is already there (a case run again, e.g. after a failure, is
appended; its last line counts). Every line is flushed and fsynced before the next case starts:
an interrupted run loses at most the case in flight. All invocations of one
directory must use the same LLM, or the results would compare different models unnoticed.
Several processes may share a directory (see claims.py): lines are appended whole, and
`recorded_elsewhere` tells a process that another one has since recorded a case.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from poirot_eval.claims import locked
from poirot_eval.provenance import source_commit
from poirot_eval.results import CaseResult
from poirotd import __version__

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"

Key = tuple[str, str, str]


class RunMismatchError(ValueError):
    """The directory holds results of another LLM setup."""


class RunJournal:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.results_path = folder / RESULTS_FILE
        self.run_path = folder / RUN_FILE
        lines = list(_lines(self.results_path))
        self._status: dict[Key, str] = {_key(line): str(line.get("status")) for line in lines}
        # Lines per case that this process knows of: the file's at opening, plus its own.
        self._known = Counter(_key(line) for line in lines)

    def status(self, dataset: str, case_id: str, method: str) -> str | None:
        """The case's recorded status (its last line's), None when it has not been run."""
        return self._status.get((dataset, case_id, method))

    def recorded_elsewhere(self, dataset: str, case_id: str, method: str) -> bool:
        """Whether another process sharing the directory has recorded the case since this
        journal was opened."""
        key = (dataset, case_id, method)
        return sum(_key(line) == key for line in _lines(self.results_path)) > self._known[key]

    def begin(
        self, *, dataset: str, method: str, llm: dict[str, Any], settings: dict[str, Any]
    ) -> None:
        """Records this invocation in run.json; raises RunMismatchError when earlier invocations
        used another LLM setup."""
        with locked(self.folder):
            self._begin(dataset, method, llm, settings)

    def _begin(
        self, dataset: str, method: str, llm: dict[str, Any], settings: dict[str, Any]
    ) -> None:
        run: dict[str, Any] = {"llm": llm, "invocations": []}
        if self.run_path.exists():
            run = json.loads(self.run_path.read_text())
            if run["llm"] != llm:
                raise RunMismatchError(
                    f"{self.run_path} records another LLM setup ({run['llm']}); "
                    "use a new run directory"
                )
        run["invocations"].append(
            {
                "dataset": dataset,
                "method": method,
                "settings": settings,
                "started_at": datetime.now(UTC).isoformat(),
                "poirotd_version": __version__,
                "poirotd_commit": source_commit(),
            }
        )
        tmp = self.run_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(run, indent=2) + "\n")
        tmp.replace(self.run_path)

    def append(self, result: CaseResult) -> None:
        """One line, durable before this returns. A torn last line (a crash mid-write) is
        ended first so the new line stays parseable; the torn one is ignored on reading."""
        line = result.model_dump_json() + "\n"
        with locked(self.folder), self.results_path.open("a+b") as f:
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        key = (result.dataset, result.case_id, result.method)
        self._status[key] = result.status
        self._known[key] += 1

    def case_lines(self, dataset: str, case_id: str) -> dict[str, CaseResult]:
        """The case's last line per method, as the file holds them now (other processes'
        included)."""
        last = {
            str(line.get("method")): line
            for line in _lines(self.results_path)
            if _key(line)[:2] == (dataset, case_id)
        }
        return {method: CaseResult.model_validate(line) for method, line in last.items()}

    def results(self) -> list[CaseResult]:
        """One result per case and method, its last line, in the order cases were first run."""
        last = {_key(line): line for line in _lines(self.results_path)}
        return [CaseResult.model_validate(line) for line in last.values()]


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue  # a line torn by a crash: its case was not finished
        if isinstance(line, dict):
            yield line


def _key(line: dict[str, Any]) -> Key:
    return (str(line.get("dataset")), str(line.get("case_id")), str(line.get("method")))
