"""A throwaway Mosquitto on a free loopback port, tuned so it never drops QoS 1: the broker of
`poirotd demo` and of each benchmark measurement.

Unlike the tests' broker it keeps nothing on disk (each use starts from an empty broker) and
lifts the two limits that would otherwise cap or lose a burst: the per-client window of un-acked
deliveries (default 20) and the per-client queue (default 1000, then dropped).
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from poirotd.devtools.process import free_port, stop_process

# Un-acked deliveries per subscriber; hwbridge's client buffer (BrokerConfig.queue_size, 10000)
# must stay above it or the client would drop messages.
MAX_INFLIGHT = 1000
MAX_QUEUED = 5_000_000


@contextlib.contextmanager
def mosquitto(listener_options: str = "") -> Iterator[int]:
    """Yields the port of a running broker; stops it (SIGTERM, then SIGKILL) on exit.
    `listener_options`: configuration lines for its one listener (TLS files, a password file)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mosquitto-") as folder:
        conf = Path(folder) / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            f"user {getpass.getuser()}\n"
            f"max_inflight_messages {MAX_INFLIGHT}\n"
            f"max_queued_messages {MAX_QUEUED}\n"
            "log_dest none\n" + listener_options
        )
        process = subprocess.Popen(
            ["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_listening(process, port)
            yield port
        finally:
            stop_process(process)


def wait_listening(process: subprocess.Popen[bytes], port: int) -> None:
    """Returns once the broker accepts connections on `port`; raises RuntimeError if it exits
    or has not listened within 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"mosquitto did not listen on {port}")
