"""With JSON logs, every line is JSON: the daemon's own, third-party libraries' through the
standard library (psycopg's "error ignored terminating" warnings), and Python's warnings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
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
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
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
