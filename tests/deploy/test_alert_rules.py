"""The alert rules: promtool accepts and unit-tests them, every alert has a firing and a quiet
test case, and the Kubernetes PrometheusRule carries exactly the same groups."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import yaml

from tests.support.deploy import (
    DEPLOY,
    K8S,
    RULES_FILE,
    RULES_TEST_FILE,
    alert_rules,
    load_yaml_documents,
    require_tool,
)

# Fields a PrometheusRule (monitoring.coreos.com/v1) accepts in a group and in a rule; the CRD's
# schema refuses others, and kubernetes-validate has no schema for CRDs.
_GROUP_FIELDS = {
    "name",
    "interval",
    "labels",
    "limit",
    "partial_response_strategy",
    "query_offset",
    "rules",
}
_RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
_DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, cwd=DEPLOY / "prometheus"
    )


def test_promtool_check_rules_accepts_the_rule_file() -> None:
    result = _promtool("check", "rules", RULES_FILE.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", RULES_TEST_FILE.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load(RULES_TEST_FILE.read_text())["tests"]
    checks = [check for group in tests for check in group.get("alert_rule_test", [])]
    alerts = {rule["alert"] for rule in alert_rules()}
    tested = {check["alertname"] for check in checks}
    assert tested == alerts, f"untested: {alerts - tested}, unknown: {tested - alerts}"
    for alert in sorted(alerts):
        own = [check for check in checks if check["alertname"] == alert]
        assert any(check.get("exp_alerts") for check in own), f"{alert}: no firing case"
        assert any(not check.get("exp_alerts") for check in own), f"{alert}: no quiet case"


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]


def _prometheus_rule() -> dict[str, Any]:
    (resource,) = load_yaml_documents(K8S / "prometheusrule.yaml")
    return resource


def test_prometheusrule_groups_equal_the_rule_file_groups() -> None:
    resource = _prometheus_rule()
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert resource["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_prometheusrule_is_freshly_rendered_from_the_rule_file() -> None:
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "prometheus" / "render_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_prometheusrule_uses_only_fields_the_crd_accepts() -> None:
    for group in _prometheus_rule()["spec"]["groups"]:
        assert set(group) <= _GROUP_FIELDS, set(group) - _GROUP_FIELDS
        for rule in group["rules"]:
            assert set(rule) <= _RULE_FIELDS, set(rule) - _RULE_FIELDS
            assert isinstance(rule["expr"], str)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    assert _DURATION.match(rule[key]), f"{rule.get('alert')}: {key}={rule[key]}"
            for mapping in (rule.get("labels", {}), rule.get("annotations", {})):
                assert all(isinstance(v, str) for v in mapping.values()), rule.get("alert")
