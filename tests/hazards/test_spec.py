"""Rules load from YAML, and every inconsistency is a pydantic error that says what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from poirotd.devtools.hazard_inputs import rule
from poirotd.hazards import RuleEngine, RuleSet, ThresholdRule, parse_rules

SPEC = """
rules:
  - name: ankle_high
    kind: threshold
    severity: critical
    component: d2w_exoskeleton
    signal: ankle_angle_deg
    above: 35
    clear_above: 30
    for_samples: 3
  - name: ankle_offset
    kind: rolling_mean
    severity: warning
    component: d2w_exoskeleton
    signal: ankle_angle_deg
    window_seconds: 2
    above: 5
    below: -5
  - name: chief_picks_plan4
    kind: message_pattern
    severity: info
    pattern: '(?i)plan\\s*4'
    sender: chief
    message_kind: agent
    emit: false
  - name: plan4_while_ankle_high
    kind: all
    severity: critical
    rules: [ankle_high, chief_picks_plan4]
    within_seconds: 10
    cooldown_seconds: 300
"""


def test_rules_load_from_yaml() -> None:
    rules = parse_rules(yaml.safe_load(SPEC)["rules"])
    assert [r.kind for r in rules] == ["threshold", "rolling_mean", "message_pattern", "all"]
    high = rules[0]
    assert isinstance(high, ThresholdRule)
    assert (high.above, high.clear_above, high.for_samples, high.cooldown_seconds) == (
        35,
        30,
        3,
        60,
    )
    RuleEngine(rules)


def error_of(*rules: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_rules(rules)
    return str(caught.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "set above, below or both"),
        ({"above": 35, "clear_above": 35}, "clear_above (35.0) must be less than above (35.0)"),
        ({"above": 35, "clear_above": 40}, "clear_above (40.0) must be less than above (35.0)"),
        ({"below": -5, "clear_below": -6}, "clear_below (-6.0) must be greater than below (-5.0)"),
        ({"above": 5, "below": 5}, "below (5.0) must be less than above (5.0)"),
        ({"clear_above": 3, "below": 0}, "clear_above needs above"),
        (
            {"above": 10, "below": 0, "clear_above": 5, "clear_below": 8},
            "the re-arm band [8.0, 5.0] is empty",
        ),
        ({"above": 35, "for_samples": 0}, "greater than or equal to 1"),
        ({"above": 35, "cooldown_seconds": -1}, "greater than or equal to 0"),
    ],
)
def test_threshold_contradictions(fields: dict[str, Any], message: str) -> None:
    assert message in error_of(rule("threshold", **fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min": 5, "max": 5}, "min (5.0) must be less than max (5.0)"),
        ({"min": 0, "max": 10, "hysteresis": 6}, "hysteresis (6.0) leaves no band"),
    ],
)
def test_range_contradictions(fields: dict[str, Any], message: str) -> None:
    assert message in error_of(rule("range", **fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"threshold": 3}, "set exactly one of window_seconds and window_samples"),
        (
            {"threshold": 3, "window_seconds": 2, "window_samples": 50},
            "set exactly one of window_seconds and window_samples",
        ),
        (
            {"threshold": 3, "window_samples": 5},
            "min_samples (10) exceeds window_samples (5)",
        ),
        ({"threshold": 0, "window_samples": 50}, "greater than 0"),
    ],
)
def test_zscore_contradictions(fields: dict[str, Any], message: str) -> None:
    assert message in error_of(rule("zscore", **fields))


def test_rolling_mean_needs_a_window_and_levels() -> None:
    assert "set exactly one of window_seconds" in error_of(rule("rolling_mean", above=5))
    assert "set above, below or both" in error_of(rule("rolling_mean", window_samples=20))


def test_bad_regex() -> None:
    error = error_of(rule("message_pattern", pattern="plan (4"))
    assert "not a valid regular expression: missing ), unterminated subpattern" in error


def test_composite_naming_an_unknown_rule() -> None:
    error = error_of(
        rule("threshold", "ankle_high", above=35),
        rule("all", "combo", rules=["ankle_high", "ankle_hihg"], within_seconds=1),
    )
    assert "rule 'combo' combines unknown rules ['ankle_hihg']" in error


def test_composites_in_a_cycle() -> None:
    error = error_of(
        rule("threshold", "x", above=35),
        rule("all", "a", rules=["b", "x"], within_seconds=1),
        rule("any", "b", rules=["a", "x"]),
    )
    assert "composite rules form a cycle: a -> b -> a" in error


def test_composite_lists_a_rule_twice() -> None:
    assert "each rule may appear once; repeated: ['x']" in error_of(
        rule("threshold", "x", above=1), rule("any", "y", rules=["x", "x"])
    )


def test_names_unique_and_snake_case() -> None:
    twice = error_of(rule("threshold", "x", above=1), rule("rate", "x", max_rate_per_second=1))
    assert "rule names must be unique; repeated: ['x']" in twice
    assert "String should match pattern" in error_of(rule("threshold", "Ankle-High", above=1))


def test_silent_rule_nobody_uses() -> None:
    error = error_of(rule("threshold", "x", above=1, emit=False))
    assert "rules ['x'] have emit: false but no composite uses them" in error


def test_unknown_kind_and_unknown_field() -> None:
    assert "does not match any of the expected tags" in error_of(rule("trend"))
    assert "Extra inputs are not permitted" in error_of(rule("threshold", above=1, abve=2))


def test_rule_set_as_a_spec_field_reports_its_location() -> None:
    class Spec(BaseModel):
        rules: RuleSet = ()

    with pytest.raises(ValidationError) as caught:
        Spec.model_validate({"rules": [rule("threshold", "x", above=1)] * 2})
    [error] = caught.value.errors()
    assert error["loc"] == ("rules",)


def test_engine_validates_rules_it_is_given() -> None:
    with pytest.raises(ValidationError):
        RuleEngine([ThresholdRule.model_validate(rule("threshold", "x", above=1))] * 2)
    with pytest.raises(ValueError, match="evidence_limit"):
        RuleEngine([], evidence_limit=-1)
