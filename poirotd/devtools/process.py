"""Child processes of the demo, the benchmarks and the end-to-end tests: `poirotd run` on
OS-chosen loopback ports, a free port for any other server, and a stop that cannot hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self


class DaemonProcess:
    """`grpc_port` 0 lets the OS choose; a fixed one keeps the address across a restart."""

    def __init__(
        self,
        config: Path,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        grpc_port: int = 0,
    ) -> None:
        self.config = config
        self.workdir = workdir
        self.db_path = workdir / "poirotd.db"
        self.log_path = workdir / "poirotd.log"
        self._ready_file = workdir / "ready.json"
        self._env = {**os.environ, **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._requested_grpc_port = grpc_port
        self.grpc_port = 0
        self.metrics_port = 0

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def start(self, timeout: float = 120.0) -> None:
        self._ready_file.unlink(missing_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "poirotd",
                "run",
                "--config",
                str(self.config),
                "--db",
                str(self.db_path),
                "--grpc-port",
                str(self._requested_grpc_port),
                "--metrics-port",
                "0",
                "--ready-file",
                str(self._ready_file),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
        )
        deadline = time.monotonic() + timeout
        while not self._ready_file.exists():
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"poirotd exited with {self._process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"poirotd not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)
        ready = json.loads(self._ready_file.read_text())
        self.grpc_port, self.metrics_port = ready["grpc_port"], ready["metrics_port"]

    def signal_stop(self) -> None:
        """Sends SIGTERM; the daemon drains and exits on its own."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self._process is not None
        try:
            return self._process.wait(timeout)
        finally:
            self._close_log()

    def terminate(self, timeout: float = 120.0) -> int:
        """SIGTERM, then wait for the drain; returns the exit code."""
        self.signal_stop()
        return self.wait(timeout)

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_log()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


def free_port() -> int:
    """A loopback port free right now (the caller binds it soon after; a race is possible)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; returns the exit code."""
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
