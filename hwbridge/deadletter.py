"""Dead letters: input the bridge could not deliver, kept as evidence instead of being dropped.

A miscalibrated or failing sensor (the paper's Sensor-X) is exactly the case where payloads turn
odd, so a rejected payload is never just discarded: it is counted, reported in the log without
flooding it (once per source per interval, with how many were suppressed), and kept in a bounded
ring in memory plus, optionally, a size-capped JSONL file an operator can inspect later.
"""

from __future__ import annotations

import base64
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import structlog

from hwbridge.config import DeadLetterConfig

log = structlog.get_logger(__name__)

# Sources remembered by the log limiter; beyond this the least recently logged is forgotten
# (a `#` subscription can see unboundedly many topics).
_MAX_LOG_KEYS = 1024


@dataclass(frozen=True)
class DeadLetter:
    at: datetime
    # The MQTT topic, the TCP feed's name, or "poirotd" for a sample poirotd refused.
    source: str
    reason: str
    # At most DeadLetterConfig.max_payload_bytes of the original payload.
    payload: bytes
    size: int


@dataclass
class DeadLetterStats:
    stored: int = 0
    written: int = 0
    write_errors: int = 0


class LogLimiter:
    """Says whether to log for a key now: once per interval, reporting what it held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}

    def admit(self, key: str) -> int | None:
        """None = stay quiet; otherwise log now, mentioning this many suppressed since last."""
        now = self._clock()
        last, suppressed = self._windows.pop(key, (None, 0))
        if last is not None and now - last < self._interval:
            self._windows[key] = (last, suppressed + 1)
            return None
        if len(self._windows) >= _MAX_LOG_KEYS:
            del self._windows[next(iter(self._windows))]
        self._windows[key] = (now, 0)
        return suppressed


class DeadLetterStore:
    def __init__(self, config: DeadLetterConfig, *, log_interval_s: float) -> None:
        self._config = config
        self._ring: deque[DeadLetter] = deque(maxlen=config.capacity)
        self._limiter = LogLimiter(log_interval_s)
        self._file: IO[str] | None = None
        self._file_bytes = 0
        self.stats = DeadLetterStats()

    def add(self, source: str, reason: str, payload: bytes) -> None:
        letter = DeadLetter(
            at=datetime.now(UTC),
            source=source,
            reason=reason,
            payload=payload[: self._config.max_payload_bytes],
            size=len(payload),
        )
        self._ring.append(letter)
        self.stats.stored += 1
        suppressed = self._limiter.admit(source)
        if suppressed is not None:
            log.warning("dead letter", source=source, reason=reason, suppressed=suppressed)
        if self._config.path is not None:
            self._write(self._config.path, letter)

    def recent(self) -> list[DeadLetter]:
        """The newest `capacity` dead letters, oldest first."""
        return list(self._ring)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, path: Path, letter: DeadLetter) -> None:
        # Small synchronous appends (no fsync): dead letters are evidence, not acknowledged data.
        line = _jsonl(letter)
        size = len(line.encode())
        try:
            if self._file is None:
                self._file = path.open("a", encoding="utf-8")
                self._file_bytes = self._file.tell()
            if self._file_bytes and self._file_bytes + size > self._config.max_file_bytes:
                self._file.close()
                path.replace(path.with_name(path.name + ".1"))
                self._file = path.open("a", encoding="utf-8")
                self._file_bytes = 0
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self.close()
            self.stats.write_errors += 1
            if self._limiter.admit(str(path)) is not None:
                log.error("dead-letter file write failed", path=str(path), error=str(exc))
            return
        self._file_bytes += size
        self.stats.written += 1


def _jsonl(letter: DeadLetter) -> str:
    record = {
        "at": letter.at.isoformat(),
        "source": letter.source,
        "reason": letter.reason,
        "size": letter.size,
        "payload_b64": base64.b64encode(letter.payload).decode("ascii"),
    }
    return json.dumps(record, separators=(",", ":")) + "\n"
