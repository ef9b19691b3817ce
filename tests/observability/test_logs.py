"""With the daemon's logging configured, stderr holds JSON lines only: structlog's, the standard
library's, and Python's warnings (numpy's among them). Checked in a fresh interpreter: the
configuration and the warnings' once-per-place registry are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Issue 28: the rule engine's overflow on readings of ±1.797e308 printed numpy's RuntimeWarnings
# as plain text between the daemon's JSON lines. An overflow anywhere else still warns.
SCRIPT = """
import logging, warnings
import numpy as np, structlog
from poirotd.observability import logs
from tests.support.hazards import engine, rule, series

logs.configure("info", "json")
structlog.get_logger("poirotd.test").info("before")
rules = (
    rule("zscore", "spike", window_samples=5, threshold=3.0, min_samples=2),
    rule("rolling_mean", "offset", window_samples=5, min_samples=2, above=5.0),
    rule("rate", "jump", max_rate_per_second=10.0),
)
engine(*rules).observe_telemetry(series([1.0, 2.0, 1.797e308, -1.797e308, 1e300, 3.0]))
np.array([1e308]) * 10.0
warnings.warn("a library's warning")
logging.getLogger("asyncio").error("Task exception was never retrieved")
logging.getLogger("httpx").info("HTTP Request: POST http://vllm/v1/chat/completions")
structlog.get_logger("poirotd.test").info("after")
"""


def test_stderr_holds_json_lines_only_warnings_among_them() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],  # the repository, for tests.support
        check=True,
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each one JSON
    assert [(line.get("logger"), line["level"]) for line in lines] == [
        (None, "info"),
        ("py.warnings", "warning"),
        ("py.warnings", "warning"),
        ("asyncio", "error"),
        (None, "info"),
    ]
    overflow, own = lines[1]["event"], lines[2]["event"]
    assert "RuntimeWarning: overflow encountered in multiply" in overflow
    assert "tests" not in overflow and "poirotd" not in overflow  # the script's, not the engine's
    assert "UserWarning: a library's warning" in own
    assert all("timestamp" in line for line in lines)
