"""bench.replicas in its smoke size: one round of each side, so the bench cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import replicas
from bench.report import begin_marker, end_marker, reflow
from bench.sections import replicas as replicas_section
from poirotd.devtools.postgres import PostgresServer

pytestmark = pytest.mark.slow


# Three `poirotd run` processes and three clients: about 20 s on a quiet 2-core box.
@pytest.mark.timeout(300)
async def test_the_smoke_run_measures_both_sides_and_renders_its_section(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    # Each side raises unless every message was acked.
    results = await replicas.run(postgres, tmp_path, rounds=1, messages=300)
    (one,), (two,) = results["one"], results["two"]
    assert one.rate > 0 and two.rate > 0 and one.transactions > 0 and two.wal_syncs >= 0
    assert results["ratios"] == [pytest.approx(two.rate / one.rate)]
    text = reflow(replicas_section.section("smoke", 1, 300, results))
    assert text.startswith(begin_marker("bench.replicas smoke"))
    assert text.endswith(end_marker("bench.replicas smoke"))
    assert "| 2 replicas |" in text and "What limits it" in text
