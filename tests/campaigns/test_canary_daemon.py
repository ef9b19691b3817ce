"""Canaries in a running daemon over loopback: their metrics on /metrics, their records marked,
and nothing real moved (no Watch event, no β, no confirmation)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import clinic
from tests.support.canary import labelled, write_case
from tests.support.waiting import eventually


@pytest.fixture
def daemon_spec(tmp_path: Path) -> SystemSpec:
    write_case(tmp_path / "cases", labelled("right", ("doctor",)))
    write_case(tmp_path / "cases", labelled("wrong", ("exo",)))
    canary = {"cases": str(tmp_path / "cases"), "interval_seconds": 1, "accuracy_floor": 0.75}
    return clinic(canary=canary, protocol={"max_invocations": 2, "reputation": {"enabled": True}})


def scraped(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The /metrics page over HTTP, as Prometheus reads it: value by (sample name, labels)."""
    text = httpx.get(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def runs(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str) -> float:
    labels = (("method", "poirot"), ("outcome", outcome), ("system", "clinic"))
    return metrics.get(("poirot_canary_runs_total", labels), 0.0)


async def test_canary_metrics_are_scraped_and_nothing_real_moves(
    daemon: Daemon, client: PoirotClient
) -> None:
    async def two_canaries() -> bool:
        metrics = await asyncio.to_thread(scraped, daemon)
        return runs(metrics, "correct") >= 1 and runs(metrics, "wrong") >= 1

    async with asyncio.timeout(30):
        await eventually(two_canaries)
    metrics = await asyncio.to_thread(scraped, daemon)
    system = (("system", "clinic"),)
    accuracy = metrics[("poirot_canary_accuracy", (("method", "poirot"), *system))]
    assert 0 < accuracy < 1
    assert metrics[("poirot_canary_accuracy_floor", system)] == 0.75
    assert metrics[("poirot_canary_cases", system)] == 2
    count = ("poirot_canary_attribution_duration_seconds_count", (("method", "poirot"), *system))
    assert metrics[count] >= 2
    assert not [name for name, _ in metrics if name == "poirot_attribution_score"]

    # List shows real investigations only unless asked for the canaries'.
    assert list((await client.list_investigations(page_size=50)).investigations) == []
    page = await client.list_investigations(page_size=50, canaries=True)
    canaries = list(page.investigations)
    assert len(canaries) >= 2 and all(i.canary for i in canaries)
    labels = {i.canary_label.case_id: i.canary_label for i in canaries}
    assert labels["right"].correct and not labels["wrong"].correct
    assert list(labels["wrong"].truth_region_ids) == ["exo"]
    assert all(i.session_id.startswith("canary-") for i in canaries)
    done = next(i for i in canaries if i.state == pb.INVESTIGATION_STATE_SUCCEEDED)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.confirm(done.investigation_id, ["doctor"], note="a canary")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    reputation = await client.reputation()
    assert {b.agent_id: b.confirmations for b in reputation.betas} == dict.fromkeys(
        ("doctor", "chief", "physio"), 0
    )
    assert {b.beta for b in reputation.betas} == {0.25}
    # No Watch event: the stream from the start holds nothing of any canary.
    stream = client.watch("", after_event_id=0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            async for event in stream:
                pytest.fail(f"a canary streamed an event: {event}")
