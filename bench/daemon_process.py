"""A daemon process of its own for the benches that read its memory: `bench.daemon_child` on a
spec and an environment of the bench's choosing, its ports, its VmRSS and its /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from poirotd.config import SystemSpec

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Child:
    pid: int
    grpc_port: int
    metrics_port: int
    db_path: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise LookupError("VmRSS")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples `name` of the daemon's /metrics whose labels include these."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def rejected(self, rpc: str, reason: str) -> float:
        """A sample of the daemon's poirot_requests_rejected_total."""
        return self.metric("poirot_requests_rejected_total", rpc=rpc, reason=reason)


@contextlib.asynccontextmanager
async def child_daemon(
    folder: Path, spec: SystemSpec, env: Mapping[str, str] = {}
) -> AsyncIterator[Child]:
    """`bench.daemon_child` on `spec`, with these POIROTD_* settings over the bench's own
    environment; SIGTERM at the end (it drains), SIGKILL after 30 s."""
    spec_path, db, ready = folder / "spec.json", folder / "daemon.db", folder / "ready.json"
    spec_path.write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "bench.daemon_child", str(spec_path), str(db), str(ready)]
    process = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, env=os.environ | dict(env))
    try:
        async with asyncio.timeout(120):
            while not ready.exists():
                if process.returncode is not None:
                    raise RuntimeError(f"bench.daemon_child exited with {process.returncode}")
                await asyncio.sleep(0.1)
        ports = json.loads(ready.read_text())
        yield Child(process.pid, ports["grpc_port"], ports["metrics_port"], db)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
