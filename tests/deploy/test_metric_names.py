"""Every metric the alert rules and the dashboard name is one the running daemon really exports.

A daemon runs in process (scripted LLM) through one whole investigation, so that every metric
family has samples; its /metrics page is scraped over HTTP and parsed like Prometheus would.
"""

from __future__ import annotations

import json

from poirotd.daemon import Daemon
from tests.support.deploy import (
    DASHBOARD_FILE,
    Exported,
    alert_rules,
    dashboard_expressions,
    declared_families,
    exported,
    poirot_identifiers,
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


def test_the_scraped_daemon_serves_samples_of_every_declared_family(
    investigated_daemon: Daemon,
) -> None:
    metrics = exported(investigated_daemon)
    assert {f.name for f in metrics.declared} == declared_families()
    assert metrics.declared_families_not_served() == [], "the fixture must exercise every family"


def test_alert_rules_name_only_exported_metrics(investigated_daemon: Daemon) -> None:
    metrics = exported(investigated_daemon)
    for rule in alert_rules():
        identifiers = poirot_identifiers(rule["expr"])
        assert identifiers, f"{rule['alert']} uses no poirot_ metric"
        for identifier in identifiers:
            _family_of(identifier, metrics)


def test_dashboard_names_only_exported_metrics_and_covers_every_family(
    investigated_daemon: Daemon,
) -> None:
    metrics = exported(investigated_daemon)
    used = {_family_of(identifier, metrics) for identifier in _dashboard_identifiers()}
    # A metric added to metrics.py without a panel shows up here.
    assert used == declared_families()


def test_identifier_extraction_ignores_label_values_and_keeps_suffixes() -> None:
    expr = 'sum(rate(poirot_llm_calls_total{job="poirot_x"}[5m])) / poirot_llm_up'
    assert poirot_identifiers(expr) == {"poirot_llm_calls_total", "poirot_llm_up"}


def test_the_name_check_refuses_names_prometheus_would_not_find(
    investigated_daemon: Daemon,
) -> None:
    metrics = exported(investigated_daemon)
    for bad in (
        "poirot_investigations",  # a counter's family name without _total
        "poirot_llm_up_total",  # a gauge with a counter's suffix
        "poirot_attribution_score_bucket",  # a gauge is no histogram
        "poirot_build",  # an Info family without _info
        "poirot_votes_created",  # served, but not a series the artefacts may rely on
    ):
        try:
            _family_of(bad, metrics)
        except AssertionError:
            continue
        raise AssertionError(f"{bad} was accepted")
