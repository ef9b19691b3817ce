"""bench.hostile's quick run against a daemon process of its own and a real Mosquitto: no hostile
peer silences a rule, loses a hazard or loses a victim's acknowledged reading (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import hostile
from bench.report import begin_marker, end_marker
from bench.sections import hostile as hostile_section


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 15 s on a quiet 2-core box
async def test_the_quick_run_keeps_rules_firing_hazards_and_victims_whole(
    tmp_path: Path,
) -> None:
    p = hostile.plan("quick")
    results = await hostile.run(p, tmp_path)
    assert [row.peer for row in results.rows] == [
        "extreme readings, gRPC Ingest",
        "extreme readings, MQTT",
        "extremes within a declared range (±1e150)",
        "Trigger flood, one client, rate unbounded",
        "spoofed keys: another topic's producer, a pinned route's fields",
    ]
    for row in results.rows:
        assert row.victim_acked > 0 and row.victim_lost == 0, row
    *ruled, spoofed = results.rows
    for row in ruled:
        assert row.hazard_sessions > 0 and row.hazards_lost == 0, row
        assert row.fired and all(n > 0 for n in row.fired.values()), row
    grpc_row, mqtt_row, declared, flood = ruled
    assert grpc_row.got["INVALID_ARGUMENT"] == grpc_row.sent
    assert mqtt_row.got["dead-lettered"] == mqtt_row.sent
    assert declared.got == {"OK": declared.sent}
    assert flood.got["refused queue_full"] > 0
    assert flood.fired == {"exo_overheat": p.victims}
    # The doctor's keys naming the chief's producer are its own; every pinned field it chose is
    # refused; nothing of the chief's is dropped as a copy or set aside.
    n = spoofed.sent // 4
    assert spoofed.got == {
        "refused session": n,
        "refused kind": n,
        "refused index": n,
        "stored as its own": n,
    }, spoofed
    assert spoofed.victim_acked == n
    text = hostile_section.section(p, results)
    assert text.startswith(begin_marker("bench.hostile quick"))
    assert text.endswith(end_marker("bench.hostile quick"))
