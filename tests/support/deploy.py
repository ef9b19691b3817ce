"""The deployment artefacts in deploy/: their paths, the external tools that check them, and what
the daemon exports to be checked against (the deploy tests' helpers)."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC
from poirotd.devtools.ingest_requests import session
from poirotd.observability.metrics import Metrics
from poirotd.transports.security.access import token_hash
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES_FILE = DEPLOY / "prometheus" / "poirot-alerts.yaml"
RULES_TEST_FILE = DEPLOY / "prometheus" / "poirot-alerts.test.yaml"
DASHBOARD_FILE = DEPLOY / "grafana" / "poirotd-dashboard.json"
K8S = DEPLOY / "k8s"
EDGE = DEPLOY / "edge"

# A whole investigation with the scripted backend takes well under a second; this bounds a hang.
INVESTIGATION_DEADLINE_SECONDS = 30.0


# The deploy tests' daemon grants this token every role (access_file); Prometheus scrapes with it.
TOKEN = "deploy-tests-token"


def require_tool(name: str) -> str:
    """Path of an external program, or skip naming the Debian package that provides it."""
    path = shutil.which(name)
    if path is None:
        packages = {
            "promtool": "prometheus",
            "prometheus": "prometheus",
            "kubectl": "kubectl",
            "mosquitto_passwd": "mosquitto",
        }
        hint = packages.get(name, name)
        pytest.skip(f"{name} is not installed (Debian package {hint!r}; `make test` installs it)")
    return path


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


_PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_POIROT_NAME = re.compile(r"\bpoirot_[A-Za-z0-9_]+")


def poirot_identifiers(expr: str) -> set[str]:
    """Metric names of the form poirot_* in a PromQL expression (string literals ignored)."""
    return set(_POIROT_NAME.findall(_PROMQL_STRING.sub('""', expr)))


def dashboard_expressions(node: Any) -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template-variable queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            # A variable's "query" is PromQL only when it calls something; "prometheus" is not.
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                found.append(value)
            else:
                found.extend(dashboard_expressions(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(dashboard_expressions(item))
    return found


@dataclass
class Exported:
    """What a daemon exports: its /metrics page as served over HTTP and parsed, plus the family
    and type of each sample as its registry declares them (the text format loses the Info type
    and turns `_created` samples into families of their own)."""

    scraped: list[Metric]
    declared: list[Metric]

    def served_sample_names(self) -> set[str]:
        return {s.name for f in self.scraped for s in f.samples}

    def declared_sample_families(self) -> dict[str, tuple[str, str]]:
        """Sample name (what PromQL selects) -> (declared family name, family type)."""
        return {s.name: (f.name, f.type) for f in self.declared for s in f.samples}

    def declared_families_not_served(self) -> list[str]:
        served = self.served_sample_names()
        return sorted(
            f.name
            for f in self.declared
            if not {s.name for s in f.samples if not s.name.endswith("_created")} & served
        )


def scrape(daemon: Daemon) -> str:
    """The daemon's /metrics page, fetched with TOKEN as Prometheus would."""
    return httpx.get(
        f"http://127.0.0.1:{daemon.metrics_port}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    ).text


def exported(daemon: Daemon) -> Exported:
    text = scrape(daemon)
    return Exported(
        scraped=list(text_string_to_metric_families(text)),
        declared=list(daemon.metrics.registry.collect()),
    )


def declared_families() -> set[str]:
    """Family names the daemon declares (metrics.py), independent of any traffic."""
    return {family.name for family in Metrics("probe").registry.collect()}


def access_file(folder: Path) -> Path:
    """An access file that grants TOKEN every role, for a daemon whose access metrics are
    exercised too."""
    access = folder / "access.yaml"
    roles = ["ingest", "reader", "operator", "auditor", "metrics"]
    access.write_text(
        yaml.safe_dump({"tokens": {token_hash(TOKEN): {"name": "t", "roles": roles}}})
    )
    return access


async def one_canary(daemon: Daemon) -> None:
    """Waits until the daemon's canaries (its spec has a canary section) have run one."""

    def ran() -> bool:
        families = daemon.metrics.canary_runs.collect()
        return any(s.name.endswith("_total") and s.value >= 1 for f in families for s in f.samples)

    async with asyncio.timeout(30):
        await eventually(ran)


async def run_one_investigation(daemon: Daemon) -> str:
    """Ingests a session, refuses one bad trigger and one call without a token (so the
    rejection and denial counters have samples) and runs one investigation to the end; returns
    its id."""
    target = f"127.0.0.1:{daemon.grpc_port}"
    async with PoirotClient(target) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError):
            await anonymous.reputation()
    async with PoirotClient(target, token=TOKEN) as client:
        await client.send(session(6))
        with pytest.raises(grpc.aio.AioRpcError):
            await client.trigger("no-such-session", "exercise the rejection counter")
        queued = await client.trigger("s1", "operator saw a fall")
        async for _ in client.watch(queued.investigation_id):
            pass
    # The terminal event can precede the outcome counter; wait for the counter itself.
    deadline = time.monotonic() + INVESTIGATION_DEADLINE_SECONDS
    labels = {"system": CLINIC.system.name, "outcome": "succeeded", "method": "poirot"}
    while daemon.metrics.registry.get_sample_value("poirot_investigations_total", labels) != 1:
        assert time.monotonic() < deadline, "the investigation did not succeed in time"
        await asyncio.sleep(0.05)
    return queued.investigation_id
