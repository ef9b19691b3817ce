"""The `poirotd` command line as an operator runs it: a child process, its output as text."""

from __future__ import annotations

import subprocess
import sys


def poirotd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poirotd", *args], capture_output=True, text=True, timeout=timeout
    )
