"""Publishes the audit chain's head, so a rewritten or truncated chain is caught without an
anchor the operator had to note by hand.

Every `interval` seconds, when the head has moved, a checkpoint line (seq, hash, time) is
appended to a file an operator can ship elsewhere (the log line says the same, for log
pipelines), and the head's seq is a metric. `poirotd audit verify --checkpoints FILE` checks the
chain against the latest line: a history re-hashed or cut back to before it no longer holds it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import structlog

from poirotd.observability.metrics import Metrics
from poirotd.store.port import Store

log = structlog.get_logger(__name__)


class ChainCheckpoints:
    def __init__(self, store: Store, path: Path, metrics: Metrics, *, interval: float) -> None:
        self._store = store
        self._path = path
        self._metrics = metrics
        self._interval = interval
        self._last: tuple[int, str] | None = None
        metrics.audit_head.labels(metrics.system)  # 0 until the first checkpoint

    async def run_forever(self) -> None:
        while True:
            try:
                await self.write()
            except OSError as exc:  # a full disk must not stop the daemon; the next try may work
                log.error("audit checkpoint not written", path=str(self._path), error=str(exc))
            await asyncio.sleep(self._interval)

    async def write(self) -> None:
        """Appends a checkpoint if the head moved since the last one (also called at stop)."""
        head = await self._store.chain_head()
        if head is None or head == self._last:
            return
        seq, digest = head
        line = json.dumps({"seq": seq, "hash": digest, "at": datetime.now(UTC).isoformat()})
        await asyncio.to_thread(_append, self._path, line)
        self._last = head
        self._metrics.audit_head.labels(self._metrics.system).set(seq)
        log.info("audit checkpoint", seq=seq, hash=digest, path=str(self._path))


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
