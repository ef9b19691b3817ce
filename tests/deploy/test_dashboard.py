"""The Grafana dashboard JSON: loadable structure, the panels the operators need, and the
`system` variable applied to every query."""

from __future__ import annotations

import json
import re
from itertools import combinations
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from poirotd.observability.metrics import Metrics
from tests.support.deploy import DASHBOARD_FILE, dashboard_expressions

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SYSTEM_MATCHER = 'system=~"$system"'
SYSTEM_JOIN = 'on (job, instance) group_left () poirot_build_info{system=~"$system"}'
_SELECTOR = re.compile(r"\b(poirot_[a-z0-9_]+)(\{[^}]*\})?")
# The labels a query groups or joins by, and those its legend names.
_GROUPING = re.compile(r"\b(?:by|on) \(([^)]*)\)")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# Labels every series has without metrics.py naming them: the scrape's, and a bucket's bound.
_SCRAPE_LABELS = {"job", "instance", "le"}


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return dashboard


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _families_with_system_label() -> set[str]:
    """Sample-name stems of the metrics.py families that carry a `system` label."""
    metrics = Metrics("probe")
    names = {
        wrapper._name
        for wrapper in vars(metrics).values()
        if isinstance(wrapper, MetricWrapperBase) and "system" in wrapper._labelnames
    }
    assert {"poirot_attribution_score", "poirot_investigations"} <= names
    return names


def test_dashboard_header_variables_and_datasource() -> None:
    dashboard = _dashboard()
    assert 38 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] == "poirotd"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    system = variables["system"]
    assert system["type"] == "query"
    assert system["query"]["query"] == "label_values(poirot_build_info, system)"
    assert system["includeAll"] is True and system["allValue"] == ".*"
    for panel in _panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = _dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for a, b in combinations(panels, 2):
        ga, gb = a["gridPos"], b["gridPos"]
        assert ga["x"] + ga["w"] <= 24 and gb["x"] + gb["w"] <= 24
        overlap_x = ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
        overlap_y = ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]
        assert not (overlap_x and overlap_y), (a["title"], b["title"])


def _panel_querying(kind: str, *fragments: str) -> dict[str, Any]:
    for panel in _panels():
        text = " ".join(t["expr"] for t in panel["targets"])
        if panel["type"] == kind and all(f in text for f in fragments):
            return panel
    raise AssertionError(f"no {kind} panel queries {fragments}")


def test_the_operators_panels_are_there() -> None:
    _panel_querying("bargauge", "poirot_attribution_score")
    top = _panel_querying("stat", "poirot_attribution_top")
    assert top["options"]["textMode"] == "name"
    _panel_querying("timeseries", "rate(poirot_investigations_total", "by (outcome)")
    phases = _panel_querying("timeseries", "poirot_phase_duration_seconds_bucket", "by (phase, le)")
    assert {"histogram_quantile(0.5,", "histogram_quantile(0.95,"} <= {
        t["expr"].split(" ")[0] for t in phases["targets"]
    }
    _panel_querying("timeseries", "poirot_llm_calls_total", "by (backend, outcome)")
    _panel_querying("timeseries", 'outcome!="ok"')
    _panel_querying("timeseries", "poirot_llm_call_duration_seconds_bucket")
    _panel_querying("timeseries", "poirot_llm_tokens_total", "by (backend, kind)")
    _panel_querying("timeseries", 'kind="cached"', 'kind="prompt"')
    _panel_querying("bargauge", "poirot_votes_total", "by (agent, outcome)")
    _panel_querying("timeseries", "poirot_ingest_items_total", "by (kind)")
    _panel_querying("timeseries", "poirot_requests_rejected_total", "by (rpc, reason)")
    _panel_querying("timeseries", "poirot_investigation_queue_depth")
    _panel_querying("bargauge", "poirot_hazard_events_total", "by (rule, severity)")


def test_every_query_is_filtered_by_the_system_variable() -> None:
    with_system = _families_with_system_label()
    for expr in dashboard_expressions(_dashboard()):
        if expr.startswith("label_values("):
            continue
        for name, matchers in _SELECTOR.findall(expr):
            if name == "poirot_build_info":
                assert SYSTEM_MATCHER in matchers, expr
            elif any(name == f or name.startswith(f + "_") for f in with_system):
                assert SYSTEM_MATCHER in matchers, f"{name} unfiltered in {expr}"
            else:
                # No system label of its own: joined to the daemon's build info instead.
                assert SYSTEM_JOIN in expr, f"{name} unfiltered in {expr}"


def _labels_by_family() -> dict[str, set[str]]:
    """The label names of each metrics.py family, the build information's values included."""
    metrics = Metrics("probe")
    labels = {
        wrapper._name: set(wrapper._labelnames)
        for wrapper in vars(metrics).values()
        if isinstance(wrapper, MetricWrapperBase)
    }
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels.setdefault(family.name, set()).update(sample.labels)
    return labels


def test_every_label_a_panel_groups_by_or_names_is_one_of_its_metrics() -> None:
    """A label renamed in metrics.py and not here would leave its panel with one nameless
    series (Prometheus groups by a label no series has without a word)."""
    by_family = _labels_by_family()
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            known = set(_SCRAPE_LABELS)
            for name, _ in _SELECTOR.findall(expr):
                family = max(
                    (f for f in by_family if name == f or name.startswith(f + "_")), key=len
                )
                known |= by_family[family]
            used = {
                label for group in _GROUPING.findall(expr) for label in re.findall(r"\w+", group)
            }
            used |= set(_LEGEND_LABEL.findall(target.get("legendFormat", "")))
            assert used <= known, f"{panel['title']}: {sorted(used - known)}"


def test_the_attribution_panels_link_to_the_investigation_page() -> None:
    """The page's URL comes from what the daemon publishes; the link is the page's deep link
    to the newest investigation blaming the bar's component (poirotd.transports.page)."""
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["page"]["query"]["query"] == "label_values(poirot_page_info, url)"
    deep = "${page}/investigations/latest?component=${__field.labels.component}&state=succeeded"
    for metric in ("poirot_attribution_score", "poirot_attribution_top"):
        panel = next(p for p in _panels() if metric in p["targets"][0]["expr"])
        assert [link["url"] for link in panel["fieldConfig"]["defaults"]["links"]] == [deep]
    assert [link["url"] for link in dashboard["links"]] == ["${page}/investigations"]
