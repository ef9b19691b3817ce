"""Claims on cases, so that several `poirotd eval run` processes on one run directory share its
cases instead of repeating them.

The embedded model answers one request at a time on one or two cores; a run over many cases
uses a multi-core machine by starting the same command once per free core. Each process claims
a case before running it: a file `claims/<key>` holding its host and pid, created under the
directory's lock (`locked`: `claims/.lock`, which also guards run.json and results.jsonl).
A claim is released when its case is recorded or abandoned. A claim left by a process that
died on this host (its pid is gone) is taken over; one from another host (a shared folder) is
respected until removed by hand.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLAIMS_DIR = "claims"
LOCK_FILE = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on the run directory, across processes (on one host)."""
    (folder / CLAIMS_DIR).mkdir(parents=True, exist_ok=True)
    with (folder / CLAIMS_DIR / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class CaseClaims:
    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._dir = folder / CLAIMS_DIR
        self._me = f"{socket.gethostname()} {os.getpid()}"

    def take(self, key: tuple[str, ...]) -> bool:
        """Claims the case for this process; False when a live process holds it."""
        path = self._path(key)
        with locked(self._folder):
            holder = path.read_text() if path.exists() else None
            if holder is not None and not self._abandoned(holder):
                return holder == self._me
            path.write_text(self._me)
            return True

    def release(self, key: tuple[str, ...]) -> None:
        path = self._path(key)
        with locked(self._folder):
            if path.exists() and path.read_text() == self._me:
                path.unlink()

    def _path(self, key: tuple[str, ...]) -> Path:
        return self._dir / _UNSAFE.sub("_", "__".join(key))

    def _abandoned(self, holder: str) -> bool:
        host, _, pid = holder.partition(" ")
        if host != socket.gethostname() or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, someone else's
        return False
