"""A real Arize Phoenix server on loopback ports, in a working folder of its own, run from its own
venv (.venv-phoenix, made by `make .stamps/phoenix-venv`: its dependencies would clash with the
project's), with nothing sent to the internet; and its own client (phoenix.client, same venv)
asked what it stored (tests/support/phoenix_query.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from poirotd.devtools.process import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-phoenix" / "bin" / "python"
QUERY = ROOT / "tests" / "support" / "phoenix_query.py"
# tests/support/phoenix_query.py's exit status when the span did not come.
_NOT_FOUND = 3
# Phoenix imports its whole server stack, then migrates its database: on two busy cores, minutes.
START_SECONDS = 600.0


@dataclass(frozen=True)
class Phoenix:
    url: str
    log: Path

    async def trace_spans(self, trace_id: str, span_name: str, seconds: float) -> list[Any]:
        """The spans of trace `trace_id` once one named `span_name` is among them, as Phoenix's
        client reads them (fails the test if none came within `seconds`)."""
        args = [str(QUERY), self.url, "default", trace_id, span_name, str(seconds)]
        # -P: the script's folder (tests/support) stays off the path, whatever it holds.
        process = await asyncio.create_subprocess_exec(
            str(PYTHON),
            "-P",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_environment(),
        )
        out, err = await process.communicate()
        problem = f"{err.decode(errors='replace')[-3000:]}\nPhoenix's log ends:\n{self.log_tail()}"
        assert process.returncode in (0, _NOT_FOUND), problem
        spans: list[Any] = json.loads(out)
        assert process.returncode == 0, f"no {span_name} span in trace {trace_id}: {spans}"
        return spans

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextmanager
def phoenix_server(folder: Path) -> Iterator[Phoenix]:
    if not PYTHON.exists():
        pytest.skip("Phoenix's venv is missing: `make .stamps/phoenix-venv` (`make test` does)")
    port, grpc_port = free_port(), free_port()
    working = folder / "phoenix"
    working.mkdir()
    env = _environment() | {
        "PHOENIX_WORKING_DIR": str(working),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
    }
    log = folder / "phoenix.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(PYTHON), "-m", "phoenix.server.main", "serve"],
            cwd=working,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    phoenix = Phoenix(f"http://127.0.0.1:{port}", log)
    try:
        _wait_healthy(phoenix, process)
        yield phoenix
    finally:
        stop_process(process, timeout=30)


def _environment() -> dict[str, str]:
    """Phoenix's process environment: no telemetry, nothing fetched from the internet, no proxy
    for loopback, and none of this venv's variables."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return keep | {
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_LOG_SQL": "false",
        "DO_NOT_TRACK": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def _wait_healthy(phoenix: Phoenix, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{phoenix.url}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    tail = phoenix.log_tail()
    raise AssertionError(f"Phoenix did not start (exit code {process.poll()}):\n{tail}")
