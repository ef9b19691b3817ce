"""bench.ingest_pg in its smoke size: both sides once, so the bench cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import ingest_pg, ingest_tls
from bench.report import begin_marker, end_marker, reflow
from bench.sections import ingest_pg as ingest_pg_section
from poirotd.devtools.postgres import PostgresServer


async def test_the_smoke_run_measures_both_stores_and_renders_its_section(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    p = ingest_tls.plan("smoke")
    # Each side raises unless every message was acked.
    results = await ingest_pg.run(p, tmp_path, postgres)
    assert results["sqlite"] > 0 and results["postgres"] > 0 and results["server_us"] > 0
    assert len(results["ratios"]) == p.rounds
    assert results["ratios"][0] == pytest.approx(results["postgres"] / results["sqlite"])
    text = reflow(ingest_pg_section.section(p, results))
    assert text.startswith(begin_marker("bench.ingest_pg smoke"))
    assert text.endswith(end_marker("bench.ingest_pg smoke"))
    assert "| PostgreSQL (fsync on, synchronous_commit on) |" in text
    assert results["server_version"].startswith("PostgreSQL 1")
