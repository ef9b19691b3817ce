"""A real PostgreSQL server from Debian's `postgresql` package, for the store's tests and benches.

`PostgresServer` runs `initdb` in a temporary folder and `postgres` on a free loopback port (and a
Unix socket in the same folder), trusting local connections: nothing outside the machine reaches
it. initdb and postgres refuse to run as root, so a root process runs them as the `postgres`
system user, which then owns the folder. One server serves a whole test session; each test gets a
database of its own (`create_database`, a copy of template0: milliseconds with fsync off),
dropped after it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from poirotd.devtools.process import free_port, stop_process

_USER = "poirot"


def server_binaries() -> Path | None:
    """The bin folder of the newest PostgreSQL installed under /usr/lib/postgresql, if any."""
    found = [
        folder / "bin"
        for folder in Path("/usr/lib/postgresql").glob("*")
        if (folder / "bin" / "postgres").is_file() and folder.name.isdigit()
    ]
    return max(found, key=lambda bin_dir: int(bin_dir.parent.name), default=None)


class PostgresServer:
    """One server in a folder of its own. `fsync=False` is for tests (crash safety is not what
    they check); a benchmark of durable ingest keeps the default, fsync on."""

    def __init__(self, bin_dir: Path, *, fsync: bool = True) -> None:
        self._bin = bin_dir
        self._fsync = fsync
        self.folder = Path(tempfile.mkdtemp(prefix="poirotd-pg-"))
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        # As root, the server runs as `postgres`: the folder must be its own.
        self._run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def start(self) -> None:
        data = self.folder / "data"
        if self._run_as:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(
            str(self._bin / "initdb"),
            "-D",
            str(data),
            "-U",
            _USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        self.port = free_port()
        self._launch()

    def _launch(self) -> None:
        """The postmaster on the initialised folder and `port`, once it accepts connections."""
        data = self.folder / "data"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.folder),
            "fsync": "on" if self._fsync else "off",
            "max_connections": "200",
        }
        command = [str(self._bin / "postgres"), "-D", str(data)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        # The server writes to its own copy of the descriptor: ours is closed at once, or it
        # would leak until the collector found it.
        with (self.folder / "postgres.log").open("ab") as log:
            self._process = subprocess.Popen(
                [*self._run_as, *command], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self._run_as, *command], capture_output=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{command[0]} failed: {done.stdout!r} {done.stderr!r}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log_tail()}")
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise RuntimeError(f"postgres did not accept connections: {self.log_tail()}")

    def version(self) -> str:
        """As `postgres --version` says it: "PostgreSQL 15.8 (Debian 15.8-0+deb12u1)"."""
        done = subprocess.run(
            [str(self._bin / "postgres"), "--version"], capture_output=True, text=True, check=True
        )
        return done.stdout.strip().removeprefix("postgres (PostgreSQL) ").join(("PostgreSQL ", ""))

    def url(self, database: str) -> str:
        return f"postgresql://{_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, template: str = "template0") -> str:
        """A new database, a copy of `template` (by default empty; no one may be connected to
        it while it is copied); returns its URL."""
        name = f"store_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}".encode())
        return self.url(name)

    def cpu_seconds(self) -> float:
        """CPU time the server has used so far: the postmaster, the backends it reaped and the
        processes it still runs (backends, WAL writer, checkpointer...)."""
        postmaster = self._postmaster()
        ticks = os.sysconf("SC_CLK_TCK")
        total = sum(_stat(postmaster)[11:15])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = _stat(int(entry.name))
                except (FileNotFoundError, ProcessLookupError):
                    continue  # it exited meanwhile: its time is in the postmaster's children
                if fields[1] == postmaster:
                    total += fields[11] + fields[12]
        return total / ticks

    def drop_database(self, url: str) -> None:
        """Drops a database `create_database` made, ending its connections: a test session
        makes hundreds, and a folder of hundreds of databases takes a minute to delete."""
        name = url.rpartition("/")[2]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())

    def halt(self) -> None:
        """Stops the server, as an operator's restart or a crash does (a fast shutdown: its
        connections are ended), keeping its data for `resume`."""
        self._shut_down()

    def resume(self) -> None:
        """Starts the halted server again, on the same port, with its data."""
        self._launch()

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster: open connections are ended, not waited
        for), then the folder goes."""
        self._shut_down()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _shut_down(self) -> None:
        if self._process is not None:
            with contextlib.suppress(OSError, ValueError):
                os.kill(self._postmaster(), signal.SIGINT)
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                stop_process(self._process)
            self._process = None

    def _postmaster(self) -> int:
        return int((self.folder / "data" / "postmaster.pid").read_text().split()[0])

    def log_tail(self, lines: int = 20) -> str:
        log = self.folder / "postgres.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _stat(pid: int) -> list[int]:
    """/proc/PID/stat's numeric fields after the command: [state, ppid, ...] (state as 0), so
    utime, stime, cutime, cstime are [11:15]."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return [0, *map(int, rest[1:])]
