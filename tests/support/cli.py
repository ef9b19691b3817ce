"""The `poirotd` command line as an operator runs it: a child process, its output as text."""

from __future__ import annotations

import os
import subprocess
import sys


def poirotd(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`env`: variables set on top of this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "poirotd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
