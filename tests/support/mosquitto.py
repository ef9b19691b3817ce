"""A real Mosquitto 2 broker for the MQTT tests."""

from __future__ import annotations

import getpass
import subprocess
from pathlib import Path

from hwbridge.config import (
    BackoffConfig,
    BrokerConfig,
)
from poirotd.devtools.broker import wait_listening
from poirotd.devtools.process import free_port, stop_process


class Mosquitto:
    """A Mosquitto 2 broker on a loopback port, with persistence, that a test may restart.

    Stopping sends SIGTERM, on which Mosquitto writes its persistence file; a restarted broker
    on the same port and folder therefore keeps sessions and queued QoS 1 messages.
    """

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.log = folder / "mosquitto.log"
        (folder / "data").mkdir(parents=True)
        self.conf = folder / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {folder / 'data'}/\n"
            # Run as root, Mosquitto would switch to the `mosquitto` user, which cannot write
            # the test's folder; as anyone else this line has no effect.
            f"user {getpass.getuser()}\n"
            # Default 1000: tests queue more than that for an absent client.
            "max_queued_messages 100000\n"
            f"log_dest file {self.log}\n"
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            ["mosquitto", "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_listening(self._process, self.port)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.log_tail()}") from None

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process)
            self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


FAST = BackoffConfig(initial_s=0.05, max_s=0.2)


def broker(mosquitto: Mosquitto, client_id: str = "bridge-under-test") -> BrokerConfig:
    return BrokerConfig(port=mosquitto.port, client_id=client_id, timeout_s=1.0, backoff=FAST)
