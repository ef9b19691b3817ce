"""The eval run's progress bar: case i/n, cases in flight, elapsed time, ok and failed counts."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from poirot_eval.cases import EvalCase
from poirot_eval.results import CaseResult


class RunProgress:
    """An `Observer` of `run_cases` that draws on a rich console and logs one line per case."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
            console=console,
        )
        self._task: TaskID | None = None
        self._in_flight: dict[str, None] = {}  # ordered: oldest first
        self.ok = 0
        self.failed = 0

    def __enter__(self) -> Self:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.stop()

    def planned(self, total: int, done: int) -> None:
        if done:
            self._console.print(f"{done} of {total} cases already recorded: skipped")
        self._task = self._bar.add_task("starting", total=total, completed=done, ok=0, failed=0)

    def case_started(self, case: EvalCase) -> None:
        self._in_flight[f"{case.dataset}:{case.case_id}"] = None
        self._describe()

    def case_finished(self, result: CaseResult) -> None:
        assert self._task is not None
        if result.status == "ok":
            self.ok += 1
        else:
            self.failed += 1
        self._bar.update(self._task, advance=1, ok=self.ok, failed=self.failed)
        self._in_flight.pop(f"{result.dataset}:{result.case_id}", None)
        self._describe()
        self._console.print(
            f"{result.dataset}:{result.case_id} {result.status} in {result.seconds:.1f} s"
            + (f": {result.error}" if result.error else ""),
            highlight=False,
            markup=False,
        )

    def case_skipped(self, case: EvalCase, why: str) -> None:
        assert self._task is not None
        self._bar.update(self._task, advance=1)
        self._console.print(f"{case.dataset}:{case.case_id} skipped: {why}", highlight=False)

    def _describe(self) -> None:
        assert self._task is not None
        self._bar.update(self._task, description=" ".join(self._in_flight) or "done")
