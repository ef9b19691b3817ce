"""`make bench-gpu` end to end against a real OpenAI-compatible server: llama.cpp's, serving the
embedded model (bench.tta starts it behind its recording proxy), on two Who&When cases and one
fault campaign variant, then bench.tta's poirotd side on one case against the same server."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import gpu
from bench.tta import llm_server

DATA = Path(__file__).resolve().parent.parent / "data" / "eval"
CAMPAIGN = DATA.parent / "campaign"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_run_writes_results_report_and_facts_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with llm_server(tmp_path) as proxy:
        base_url = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
        argv = [
            "--base-url", base_url,
            "--model", "smollm2",
            "--data", str(DATA),
            "--out", str(out),
            "--datasets", "whowhen-algorithm-generated",
            "--methods", "baseline",
            "--limit", "2",
            "--concurrency", "2",
            "--structured-output", "json_object",
            "--gpu", "none (CPU)",
            "--cases-folder", str(CAMPAIGN),
            "--tta-sides", "poirotd",
            "--tta-cases", "10",
            "--context-tokens", "8192",
        ]  # fmt: skip
        assert gpu.main(argv) == 0
        calls = len(proxy.calls)
        results = out / "whowhen-algorithm-generated" / "baseline" / "results.jsonl"
        lines = results.read_text().splitlines()
        assert len(lines) == 2 and calls >= 2
        assert (results.parent / "report.md").exists()
        assert list(results.parent.glob("*.png")), "the report's figures"
        facts = json.loads((out / "facts.json").read_text())
        assert facts["models"]["data"], "the server's /v1/models"
        assert facts["gpu"] == "none (CPU)"
        assert "whowhen-algorithm-generated/baseline" in (out / "index.md").read_text()
        campaign = out / "campaign" / "baseline" / "results.jsonl"
        [variant] = [json.loads(line) for line in campaign.read_text().splitlines()]
        assert variant["case_id"] == "trading-desk-f03-price_spike"
        tta_runs = json.loads((out / "tta" / "runs.json").read_text())
        assert [(r["side"], r["case_id"]) for r in tta_runs["runs"]] == [("poirotd", "10")]
        assert tta_runs["runs"][0]["calls"], "poirotd's calls went through the same server"
        assert tta_runs["server"]["url"] == base_url
        assert "serving smollm2" in (out / "tta" / "report.md").read_text()

        assert gpu.main(argv) == 0
        assert len(proxy.calls) == calls, "the finished cases are not run again"
        assert results.read_text().splitlines() == lines


def test_the_run_folder_is_named_after_the_date_and_the_model() -> None:
    folder = gpu.run_folder("Qwen/Qwen2.5-7B-Instruct", datetime(2026, 11, 28, tzinfo=UTC))
    assert folder == gpu.RUNS / "2026-11-28-Qwen-Qwen2.5-7B-Instruct"
