"""A real Prometheus scrapes a running daemon with the alert rules loaded: after one
investigation the attribution alert fires, every rule evaluates without error, and every
dashboard query runs and has data."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from poirotd.daemon import Daemon
from poirotd.devtools.process import free_port, stop_process
from tests.support.deploy import (
    DASHBOARD_FILE,
    RULES_FILE,
    TOKEN,
    dashboard_expressions,
    require_tool,
    run_one_investigation,
)

# 7.9 s on a quiet 2-core box, most of it Prometheus starting and evaluating the rule.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ALERT = "PoirotHighAttributionScore"
DEADLINE_SECONDS = 30.0
# Grafana's variables, as a user with "All" systems and the default window would see them.
GRAFANA_VARIABLES = {"$system": ".*", "$__rate_interval": "1m", "$window": "1h"}


def _rules_without_for(alert: str) -> str:
    """The rule file with `for:` of one alert set to 0s, so a test need not wait a minute."""
    document = yaml.safe_load(RULES_FILE.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["for"] = "0s"
    return yaml.safe_dump(document, sort_keys=False)


@pytest.fixture
def prometheus(tmp_path: Path, daemon: Daemon) -> Iterator[str]:
    """A Prometheus on a free loopback port scraping `daemon` every second; yields its URL."""
    binary = require_tool("prometheus")
    (tmp_path / "rules.yaml").write_text(_rules_without_for(ALERT))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": "poirotd",
                "authorization": {"credentials": TOKEN},
                "static_configs": [{"targets": [f"127.0.0.1:{daemon.metrics_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process, timeout=20)
        log.close()


async def _poll(what: str, probe: Any) -> Any:
    """Awaits `probe()` until it returns something truthy, within DEADLINE_SECONDS."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except httpx.HTTPError as error:
            last = error
        else:
            if last:
                return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not seen within {DEADLINE_SECONDS} s (last: {last!r})")


async def test_prometheus_fires_the_attribution_alert_after_one_investigation(
    daemon: Daemon, prometheus: str
) -> None:
    async with httpx.AsyncClient(base_url=prometheus, timeout=5) as api:

        async def scraping() -> bool:
            reply = await api.get("/api/v1/query", params={"query": 'up{job="poirotd"} == 1'})
            return reply.status_code == 200 and bool(reply.json()["data"]["result"])

        await _poll("a successful scrape of the daemon", scraping)

        # Nothing has been attributed yet: the alert must not be there.
        alerts = (await api.get("/api/v1/alerts")).json()["data"]["alerts"]
        assert not [a for a in alerts if a["labels"]["alertname"] == ALERT]

        await run_one_investigation(daemon)

        async def firing() -> list[dict[str, Any]]:
            alerts = (await api.get("/api/v1/alerts")).json()["data"]["alerts"]
            return [
                a for a in alerts if a["labels"]["alertname"] == ALERT and a["state"] == "firing"
            ]

        (alert,) = await _poll(f"{ALERT} firing", firing)
        # The scripted agents all vote for region 0, the doctor; the alert's value is the
        # doctor's score divided by the three agents.
        assert alert["labels"]["component"] == "doctor"
        assert alert["labels"]["system"] == "clinic"
        assert alert["labels"]["severity"] == "critical"
        score = daemon.metrics.registry.get_sample_value(
            "poirot_attribution_score", {"system": "clinic", "component": "doctor"}
        )
        assert score is not None
        assert float(alert["value"]) == pytest.approx(score / 3)

        groups = (await api.get("/api/v1/rules")).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        expected = yaml.safe_load(RULES_FILE.read_text())["groups"]
        assert len(rules) == sum(len(group["rules"]) for group in expected)
        broken = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
        assert broken == {}, "rules must evaluate without error on real series"

        # rate() needs two samples of a series: wait for a second scrape after the investigation.
        async def two_scrapes() -> bool:
            query = "count(count_over_time(poirot_llm_calls_total[1m]) >= 2)"
            reply = await api.get("/api/v1/query", params={"query": query})
            return bool(reply.json()["data"]["result"])

        await _poll("two scrapes of the LLM counters", two_scrapes)
        empty = []
        for expr in _dashboard_queries():
            reply = await api.get("/api/v1/query", params={"query": expr})
            body = reply.json()
            assert reply.status_code == 200 and body["status"] == "success", (expr, body)
            if not body["data"]["result"]:
                empty.append(expr)
        # The scripted LLM never fails, so only the error-ratio panel may stay empty.
        assert [e for e in empty if 'outcome!="ok"' not in e] == []


def _dashboard_queries() -> list[str]:
    queries = []
    for expr in dashboard_expressions(json.loads(DASHBOARD_FILE.read_text())):
        if expr.startswith("label_values("):  # Grafana's own syntax, not PromQL
            continue
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        queries.append(expr)
    return queries
