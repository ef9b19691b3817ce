"""Several eval processes on one run directory: claims keep them from running a case twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poirot_eval.claims import CLAIMS_DIR, CaseClaims
from poirot_eval.journal import RunJournal
from poirotd.devtools.answers import schema_answer
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from tests.eval.helpers import case, lines, run

KEY = ("whowhen", "2", "poirot")


def hold(folder: Path, key: tuple[str, ...], holder: str) -> None:
    """A claim as another process would have left it."""
    (folder / CLAIMS_DIR).mkdir(parents=True, exist_ok=True)
    (folder / CLAIMS_DIR / "__".join(key)).write_text(holder)


def dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


def test_a_claim_is_taken_once_until_released(tmp_path: Path) -> None:
    claims = CaseClaims(tmp_path)
    assert claims.take(KEY) and claims.take(KEY)  # this process may ask again
    hold(tmp_path, ("whowhen", "3", "poirot"), f"{socket.gethostname()} {os.getppid()}")
    assert not claims.take(("whowhen", "3", "poirot"))  # a live process holds it
    claims.release(KEY)
    assert not (tmp_path / CLAIMS_DIR / "__".join(KEY)).exists()


def test_a_dead_processs_claim_is_taken_over_another_hosts_is_not(tmp_path: Path) -> None:
    claims = CaseClaims(tmp_path)
    hold(tmp_path, KEY, f"{socket.gethostname()} {dead_pid()}")
    assert claims.take(KEY)
    other = ("whowhen", "4", "poirot")
    hold(tmp_path, other, "another-host 1")
    assert not claims.take(other)


async def test_a_run_skips_cases_held_or_recorded_by_another_process(tmp_path: Path) -> None:
    hold(tmp_path, KEY, f"{socket.gethostname()} {os.getppid()}")
    elsewhere = RunJournal(tmp_path)

    def answer_while_another_process_records_case_3(
        messages: Sequence[ChatMessage], schema: dict[str, Any] | None
    ) -> str:
        if elsewhere.status("whowhen", "3", "poirot") is None:
            elsewhere.append(three)
        return schema_answer(messages, schema)

    # What the other process recorded for case 3: a line run earlier in another folder.
    done = await run([case("3")], tmp_path / "other", ScriptedBackend(schema_answer))
    three = done.finished[0]
    recorded = await run(
        [case("1"), case("2"), case("3")],
        tmp_path,
        ScriptedBackend(answer_while_another_process_records_case_3),
    )

    assert recorded.started == ["1"]
    assert recorded.skipped == [
        ("2", "being run by another process"),
        ("3", "recorded by another process"),
    ]
    assert [r["case_id"] for r in lines(tmp_path)] == ["3", "1"]
    assert sorted(p.name for p in (tmp_path / CLAIMS_DIR).iterdir()) == [".lock", "__".join(KEY)]
