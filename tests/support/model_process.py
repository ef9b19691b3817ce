"""An OpenAI-compatible model server in a process of its own, to kill and start again.

It answers every chat completion, after `delay` seconds, with the smallest answer to the JSON
schema it asks for (`answers.fill`), lists one model at ``GET /v1/models``, and counts what it
answered in a file, so that a test can kill it (SIGKILL, as an OOM kill or a node loss does)
once an investigation is under way. Run as ``python -m tests.support.model_process PORT DELAY
COUNT_FILE``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from poirotd.devtools.answers import fill
from tests.support.answers import chat_body

ROOT = Path(__file__).resolve().parents[2]


class ModelProcess:
    """The server on a fixed loopback port, so that it comes back where the daemon looks."""

    def __init__(self, port: int, count_file: Path, *, delay: float = 0.2) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1"
        self._count_file = count_file
        self._delay = delay
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        self._count_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [str(self.port), str(self._delay), str(self._count_file)]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.model_process", *args], cwd=ROOT, env=env
        )
        deadline = time.monotonic() + timeout
        while not self._count_file.exists():  # written once it listens
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the model server did not start on port {self.port}")
            time.sleep(0.05)

    def answered(self) -> int:
        """Chat completions answered since its start."""
        try:
            return int(self._count_file.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)
        self._process = None


def _serve(port: int, delay: float, count_file: Path) -> None:
    lock = threading.Lock()
    answered = 0

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn does

        def do_GET(self) -> None:
            self._send(200, {"object": "list", "data": [{"id": "test-model"}]})

        def do_POST(self) -> None:
            nonlocal answered
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            if self.path != "/v1/chat/completions":  # vLLM's /tokenize: not served, as llama.cpp
                self._send(404, {"detail": "Not Found"})
                return
            time.sleep(delay)
            schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
            text = json.dumps(fill(schema)) if schema else "I saw nothing unusual."
            self._send(200, chat_body(text))
            with lock:
                answered += 1
                count_file.write_text(str(answered))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    count_file.write_text("0")
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]))
