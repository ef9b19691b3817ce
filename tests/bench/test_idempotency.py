"""bench.idempotency at its smallest, on SQLite: every way commits every sample (keys in runs
leave one key row per commit, scattered keys one per sample) and the section renders."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench import idempotency
from bench.idempotency import Plan
from bench.sections import idempotency as idempotency_section


async def test_a_smoke_run_commits_every_way_and_renders(tmp_path: Path) -> None:
    plan = Plan("smoke", 1, 2 * idempotency.BATCH)
    results = await idempotency.run(plan, tmp_path, None)
    assert set(results) == {"SQLite"}
    assert all(rates and rates[0] > 0 for rates in results["SQLite"].values())
    rows = {}
    for way in idempotency.WAYS:
        with sqlite3.connect(tmp_path / f"0-{way}.db") as conn:
            samples = conn.execute("SELECT count(*) FROM telemetry_samples").fetchone()[0]
            rows[way] = conn.execute("SELECT count(*) FROM ingest_keys").fetchone()[0]
        assert samples == plan.samples, way
    assert rows == {"none": 0, "runs": 2, "scattered": plan.samples}
    text = idempotency_section.section(plan, results, "")
    assert "| SQLite, keys scattered |" in text
