"""bench.ingest_tls in its smoke size: every path of both sides once, so the bench cannot rot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import ingest_tls
from bench.report import begin_marker, end_marker, reflow
from bench.sections import ingest_tls as ingest_tls_section


async def test_the_smoke_run_measures_plain_and_locked_ingest_and_renders_its_section(
    tmp_path: Path,
) -> None:
    for binary in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(binary) is None:
            pytest.skip(f"`{binary}` is not installed (Debian package `mosquitto`)")
    p = ingest_tls.plan("smoke")
    # Each measurement raises unless every message was acked (gRPC) or committed (MQTT).
    results = await ingest_tls.run(p, tmp_path)
    for path in ("grpc", "mqtt"):
        figures = results[path]
        assert figures["plain"] > 0 and figures["locked"] > 0
        assert len(figures["ratios"]) == p.rounds
        assert figures["ratios"][0] == pytest.approx(figures["locked"] / figures["plain"])
    text = reflow(ingest_tls_section.section(p, results))
    assert text.startswith(begin_marker("bench.ingest_tls smoke"))
    assert text.endswith(end_marker("bench.ingest_tls smoke"))
    assert "| gRPC ingest, durable |" in text and "| MQTT input, one reading per message |" in text
