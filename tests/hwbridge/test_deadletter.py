"""Dead letters: bounded in memory and on disk, logged without flooding, never raising."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from hwbridge.config import DeadLetterConfig
from hwbridge.deadletter import DeadLetterStore, LogLimiter


def test_ring_keeps_the_newest_and_cuts_payloads() -> None:
    store = DeadLetterStore(DeadLetterConfig(capacity=3, max_payload_bytes=4), log_interval_s=60)
    for i in range(5):
        store.add(f"topic/{i}", "bad", b"0123456789")
    assert [d.source for d in store.recent()] == ["topic/2", "topic/3", "topic/4"]
    assert store.recent()[0].payload == b"0123" and store.recent()[0].size == 10
    assert store.stats.stored == 5


def test_file_is_capped_by_rotating_once(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    config = DeadLetterConfig(path=path, max_file_bytes=1024, max_payload_bytes=64)
    store = DeadLetterStore(config, log_interval_s=60)
    for i in range(100):
        store.add("d2w/p1/joints", f"frame {i} is short", bytes([i]) * 20)
    store.close()
    rotated = path.with_name("dead.jsonl.1")
    assert path.stat().st_size <= 1024 and rotated.stat().st_size <= 1024
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["reason"] == "frame 99 is short" and last["size"] == 20
    assert base64.b64decode(last["payload_b64"]) == bytes([99]) * 20
    assert store.stats.written == 100 and store.stats.write_errors == 0


def test_unwritable_file_is_counted_not_raised(tmp_path: Path) -> None:
    config = DeadLetterConfig(path=tmp_path / "missing-dir" / "dead.jsonl")
    store = DeadLetterStore(config, log_interval_s=60)
    store.add("t", "bad", b"x")
    store.add("t", "bad", b"y")
    assert store.stats.stored == 2 and store.stats.write_errors == 2 and len(store.recent()) == 2


def test_log_limiter_admits_once_per_interval_and_reports_suppressed() -> None:
    now = [0.0]
    limiter = LogLimiter(10.0, clock=lambda: now[0])
    assert limiter.admit("a") == 0
    assert limiter.admit("a") is None and limiter.admit("a") is None
    assert limiter.admit("b") == 0  # per key
    now[0] = 10.0
    assert limiter.admit("a") == 2
