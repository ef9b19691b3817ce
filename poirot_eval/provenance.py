"""Which source produced a result: the git commit of the checkout poirotd runs from, so that a
run directory or a benchmark section says exactly what code it measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def source_commit() -> str | None:
    """HEAD of poirotd's own checkout, with "-dirty" when it has uncommitted changes; None when
    poirotd does not run from its checkout (an installed package) or git is missing."""
    try:
        # An installed package may sit inside some other repository: that commit is not ours.
        if Path(_git("rev-parse", "--show-toplevel")).resolve() != _ROOT:
            return None
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=_ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
