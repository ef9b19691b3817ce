"""Hazard rules: declarative specs, and the engine that turns telemetry and messages into
HazardEvents."""

from poirotd.hazards.engine import RuleEngine
from poirotd.hazards.spec import (
    AgentFlagRule,
    AllRule,
    AnyRule,
    MessagePatternRule,
    MessageRepeatRule,
    RangeRule,
    RateRule,
    ReplyExpectedRule,
    RollingMeanRule,
    RuleSet,
    RuleSpec,
    StaleRule,
    ThresholdRule,
    ZScoreRule,
    parse_rules,
)
from poirotd.hazards.summary import summarise_window

__all__ = [
    "AgentFlagRule",
    "AllRule",
    "AnyRule",
    "MessagePatternRule",
    "MessageRepeatRule",
    "RangeRule",
    "RateRule",
    "ReplyExpectedRule",
    "RollingMeanRule",
    "RuleEngine",
    "RuleSet",
    "RuleSpec",
    "StaleRule",
    "ThresholdRule",
    "ZScoreRule",
    "parse_rules",
    "summarise_window",
]
