"""With the daemon's logging configured, stderr holds JSON lines only: structlog's, the standard
library's (third-party libraries' among them: psycopg's "error ignored terminating"), and
Python's warnings (numpy's among them). Checked in a fresh interpreter: the configuration and
the warnings' once-per-place registry are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository, for tests.support

# Issue 28: the rule engine's overflow on readings of ±1.797e308 printed numpy's RuntimeWarnings
# as plain text between the daemon's JSON lines. An overflow anywhere else still warns.
SCRIPT = """
import logging, warnings
import numpy as np, structlog
from poirotd.observability import logs
from poirotd.devtools.hazard_inputs import engine, rule, series

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
    lines = _stderr_json_lines(SCRIPT)
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


THIRD_PARTY_SCRIPT = """
import logging, warnings
import structlog
from poirotd.observability import logs

logs.configure("info", "json")
structlog.get_logger("poirotd").info("daemon ready", grpc_port=1)
logging.getLogger("psycopg").warning("error ignored terminating %r", "<psycopg.AsyncPipeline>")
warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
try:
    raise ConnectionResetError("peer gone")
except ConnectionResetError:
    logging.getLogger("asyncio").exception("Task exception was never retrieved")
logging.getLogger("grpc").debug("below the level: not written")
"""


def test_every_line_is_json_whoever_writes_it() -> None:
    lines = _stderr_json_lines(THIRD_PARTY_SCRIPT, "-W", "always")
    assert [line["event"].split(":")[0] for line in lines] == [
        "daemon ready",
        "error ignored terminating '<psycopg.AsyncPipeline>'",
        "<string>",
        "Task exception was never retrieved",
    ]
    assert [line.get("logger") for line in lines] == [None, "psycopg", "py.warnings", "asyncio"]
    assert "DeprecationWarning: a deprecated call" in lines[2]["event"]
    assert "ConnectionResetError: peer gone" in lines[3]["exception"]
    assert all(line["timestamp"] and line["level"] for line in lines)


def _stderr_json_lines(script: str, *options: str) -> list[dict[str, Any]]:
    """What `script` writes on stderr in a fresh interpreter, each line read as JSON (a line
    that is not fails the test)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, *options, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stderr.splitlines()]
