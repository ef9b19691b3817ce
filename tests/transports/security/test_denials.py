"""A flood of refused calls is counted in full but cannot queue store writes without bound."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore
from poirotd.store.audit import verify
from poirotd.transports.security.access import DenialReason, Denied
from poirotd.transports.security.denials import DenialRecorder


async def test_a_flood_of_denials_is_counted_and_only_a_bounded_number_waits_to_be_chained(
    tmp_path: Path,
) -> None:
    metrics = Metrics("clinic")
    store = await SqliteStore.open(tmp_path / "db.sqlite")
    recorder = DenialRecorder(store, metrics, asyncio.get_running_loop())
    denied = Denied(DenialReason.UNKNOWN_TOKEN, "the bearer token is not known")

    def flood() -> None:  # from another thread, as the metrics server's are
        for _ in range(500):
            recorder.record(denied, door="metrics", call="GET /metrics", peer="10.0.0.9")

    await asyncio.to_thread(flood)
    await recorder.flush()
    await store.close()

    registry = metrics.registry
    labels = {"rpc": "GET /metrics", "reason": "unknown_token"}
    assert registry.get_sample_value("poirot_auth_denials_total", labels) == 500
    with sqlite3.connect(tmp_path / "db.sqlite") as db:
        (chained,) = db.execute("SELECT count(*) FROM access_denials").fetchone()
    unrecorded = registry.get_sample_value("poirot_auth_denials_unrecorded_total")
    assert 64 <= chained < 500 and chained + unrecorded == 500
    assert verify(tmp_path / "db.sqlite").ok
