"""The fuzzing benchmark's quick mode (issue 20): a real daemon and broker, 500 inputs per
target, and every count the goals name is 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fuzz import QUICK_INPUTS

ROOT = Path(__file__).resolve().parents[2]
TARGETS = 11  # Ingest.Stream, the 8 RPCs of Investigations, the MQTT input, the spec loader


@pytest.mark.slow
@pytest.mark.timeout(600)  # 25 s on a quiet 2-core box: 500 inputs per target
def test_quick_fuzzing_finds_no_crash_unknown_internal_hang_or_loss(tmp_path: Path) -> None:
    tallies_path = tmp_path / "tallies.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.fuzz", "--quick", "--json", str(tallies_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    tallies = json.loads(tallies_path.read_text())
    assert len(tallies) == TARGETS, [t["target"] for t in tallies]
    for tally in tallies:
        counts = {k: tally[k] for k in ("crashes", "unknown", "internal", "slow", "lost")}
        assert tally["inputs"] >= QUICK_INPUTS, tally["target"]
        assert counts == dict.fromkeys(counts, 0), (tally["target"], tally["findings"])
    acked = {t["target"]: t["acked"] for t in tallies if t["acked"] is not None}
    # The checks for loss had something to check.
    assert acked["Ingest.Stream"] > 0 and acked["MQTT input"] > 0, acked
