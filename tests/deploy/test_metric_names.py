"""Every metric the alert rules and the dashboard name is one the running daemon really exports,
and the names it exports follow Prometheus' conventions.

A daemon runs in process (scripted LLM) through one whole investigation, so that every metric
family has samples; its /metrics page is scraped over HTTP and parsed like Prometheus would
(from a thread: the page is served by the daemon's event loop, which the tests run on).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess

from poirotd.daemon import Daemon
from tests.support.deploy import (
    DASHBOARD_FILE,
    Exported,
    alert_rules,
    dashboard_expressions,
    declared_families,
    exported,
    poirot_identifiers,
    require_tool,
    scrape,
)

# What PromQL may append to a family's name, by family type. `_created` series are left out on
# purpose: whether they exist depends on the exposition format and client settings.
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
    "gauge": ("",),
}


def _family_of(identifier: str, metrics: Exported) -> str:
    """The declared family an identifier selects; fails unless the daemon served that series."""
    assert identifier in metrics.served_sample_names(), f"{identifier} is not served by poirotd"
    family, kind = metrics.declared_sample_families()[identifier]
    suffix = identifier.removeprefix(family)
    assert suffix in _SUFFIXES[kind], f"{identifier}: {suffix!r} does not select a {kind}"
    return family


def _dashboard_identifiers() -> set[str]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    return set().union(*(poirot_identifiers(e) for e in dashboard_expressions(dashboard)))


async def test_the_scraped_daemon_serves_samples_of_every_declared_family(
    investigated_daemon: Daemon,
) -> None:
    metrics = await asyncio.to_thread(exported, investigated_daemon)
    assert {f.name for f in metrics.declared} == declared_families()
    assert metrics.declared_families_not_served() == [], "the fixture must exercise every family"


async def test_alert_rules_name_only_exported_metrics(investigated_daemon: Daemon) -> None:
    metrics = await asyncio.to_thread(exported, investigated_daemon)
    for rule in alert_rules():
        identifiers = poirot_identifiers(rule["expr"])
        assert identifiers, f"{rule['alert']} uses no poirot_ metric"
        for identifier in identifiers:
            _family_of(identifier, metrics)


async def test_dashboard_names_only_exported_metrics_and_covers_every_family(
    investigated_daemon: Daemon,
) -> None:
    metrics = await asyncio.to_thread(exported, investigated_daemon)
    used = {_family_of(identifier, metrics) for identifier in _dashboard_identifiers()}
    # A metric added to metrics.py without a panel shows up here.
    assert used == declared_families()


# Prometheus' naming conventions (prometheus.io/docs/practices/naming) that the names, not the
# client library, decide: an application prefix and snake_case; base units only, spelled out as a
# suffix; the suffixes the exposition format adds kept for it; snake_case label names.
_NAME = re.compile(r"poirot_[a-z][a-z0-9]*(_[a-z0-9]+)*")
_LABEL = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
_NOT_BASE_UNITS = re.compile(
    r"_(ms|milliseconds|microseconds|nanoseconds|minutes|hours|days|kilobytes|megabytes|percent)(_|$)"
)
_FORMAT_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_info", "_created")


async def test_the_exported_names_follow_the_prometheus_conventions(
    investigated_daemon: Daemon,
) -> None:
    metrics = await asyncio.to_thread(exported, investigated_daemon)
    problems = []
    for family in metrics.declared:
        name = family.name
        if not _NAME.fullmatch(name):
            problems.append(f"{name}: not poirot_ and snake_case")
        if _NOT_BASE_UNITS.search(name):
            problems.append(f"{name}: not in a base unit (seconds, bytes, ratios)")
        if family.type in ("gauge", "histogram") and name.endswith(_FORMAT_SUFFIXES):
            problems.append(f"{name}: a {family.type} named with a suffix the format reserves")
        # A ratio is unitless; Prometheus names it _ratio (the wall-time-over-floor histogram).
        if family.type == "histogram" and not name.endswith(("_seconds", "_bytes", "_ratio")):
            problems.append(f"{name}: a histogram without its unit")
        if ("timestamp" in name or "duration" in name) and not name.endswith("_seconds"):
            problems.append(f"{name}: a time not in seconds")
        for sample in family.samples:
            for label in set(sample.labels) - {"le"}:
                if not _LABEL.fullmatch(label):
                    problems.append(f"{name}: label {label!r} is not snake_case")
    assert problems == []


async def test_promtool_finds_no_problem_in_the_scraped_page(investigated_daemon: Daemon) -> None:
    page = await asyncio.to_thread(scrape, investigated_daemon)
    lint = await asyncio.to_thread(
        subprocess.run,
        [require_tool("promtool"), "check", "metrics"],
        input=page,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")
