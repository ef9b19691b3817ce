"""Configuration: daemon settings from the environment, the monitored system from a YAML spec."""

from poirotd.config.settings import Settings
from poirotd.config.spec import (
    AgentSpec,
    ComponentSpec,
    DecisionRuleSpec,
    EmbeddedLLMSpec,
    LLMSpec,
    OpenAILLMSpec,
    ProtocolSpec,
    SystemSpec,
)

__all__ = [
    "AgentSpec",
    "ComponentSpec",
    "DecisionRuleSpec",
    "EmbeddedLLMSpec",
    "LLMSpec",
    "OpenAILLMSpec",
    "ProtocolSpec",
    "Settings",
    "SystemSpec",
]
